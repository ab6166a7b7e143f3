"""Exporting a trained model for deployment without xspec: its graphs as torch.export programs or ONNX.

`export_model(trained, format, directory)` writes one directory (docs/export.md):

    export.json          the manifest: the model, each graph's file, inputs and outputs in order, the
                         dimensions that vary and their bounds, the cache's shapes, the token ids
    sentencepiece.model  the vocabulary the token ids come from
    encoder.pt2          a translation model's encoder: src, src_padding_mask -> memory, and the keys and
                         values of the memory each cross-attention reads (computed once per sentence)
    decoder.pt2          one decoding step: one new token per row, the key/value cache so far (and for a
                         translation model the memory's keys and values and its padding mask) -> the
                         token's next-token logits and the cache grown by one position

(`.onnx` files for the ONNX format.) The decoder step carries its cache as explicit tensors, inputs
and outputs, where the runtime's DecoderCache (runtime/cache.py) writes buffers in place: `TensorCache`
implements the same contract over tensors, so a step is one pure function. A step takes exactly one new token: the
generated attention skips the causal mask for a single query, a branch on the query's length that
torch.export cannot keep dynamic, so a prompt is read one token per step. Batch size, source length
and cache length are dynamic (torch.export.Dim), the lengths bounded by the model's positions.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import torch
from torch import nn
from torch.export import Dim

from xspec.base.errors import UserError
from xspec.base.output_dir import WRITTEN, check_replaceable, write_directory
from xspec.base.text import shown
from xspec.compiler.entries import MTP
from xspec.compiler.opdef import Family
from xspec.compiler.ops import OPS
from xspec.compiler.spec import CompiledSpec
from .tokenizer import CheckpointTokenizer
from .vocab import BOS, EOS, MODEL_FILE, PAD, UNK, Tokenizer

if TYPE_CHECKING:
    from .inference import TrainedModel

SUFFIXES = {"exported-program": ".pt2", "onnx": ".onnx"}
MANIFEST = "export.json"
MANIFEST_VERSION = 1
WRITER = "xspec export"
ONNX_EXTRA = "pip install 'xspec[onnx]'"
# Example sizes to trace with: each above 1, since torch.export fixes a dimension whose example is 0 or 1.
EXAMPLE_BATCH, EXAMPLE_SOURCE, EXAMPLE_PAST = 2, 3, 2


# --- the cache as tensors --------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheSlot:
    """One attention module's cached keys [batch, heads, length, key_dim] and values [..., value_dim]."""

    module: str
    heads: int
    key_dim: int
    value_dim: int


def cached_attention(spec: CompiledSpec, model: nn.Module, kind: str) -> list[tuple[str, nn.Module]]:
    """The attention modules whose keys and values a decoding cache keeps, as the spec's graph says
    (`kv_cache`): "append" for self-attention (grows a position per step), "static" for attention over
    the memory; in the model's order."""
    paths = {node.module for node in spec.ops if node.inferred.get("kv_cache") == kind and node.module}
    return [(name, module) for name, module in model.named_modules() if name in paths]


def slot(spec: CompiledSpec, name: str) -> CacheSlot:
    """The cache slot of the attention module at `name`, its sizes as its op's entry says (a latent
    attention's "keys" are its latent and its "values" its rotary key, one head of each)."""
    node = next(node for node in spec.ops if node.module == name)
    (heads, key_dim, value_dim), _ = OPS[node.op].cache(node.attrs, node.inferred)
    return CacheSlot(name, heads, key_dim, value_dim)


class TensorCache:
    """The decoding cache's contract (xspec/nn/contracts.py's DecodingCache) over tensors: the
    past keys and values come in as the graph's inputs, the grown ones go out as its outputs, and
    nothing is written in place, so a decoding step is one pure function torch.export can capture."""

    def __init__(self, modules: list[nn.Module], past_keys: list[torch.Tensor], past_values: list[torch.Tensor],
                 memory: dict) -> None:
        self.slots = {module: i for i, module in enumerate(modules)}
        self.past_keys, self.past_values = past_keys, past_values
        self.keys, self.values = list(past_keys), list(past_values)
        self.length = past_keys[0].size(2)     # positions decoded before this step
        self.memory = memory                    # cross-attention module -> (key input, value input, keys, values)
        self.documents = None                   # one document a row

    def append(self, module: nn.Module, k: torch.Tensor, v: torch.Tensor,
               window: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.slots[module]  # a window is refused before (`plan`)
        self.keys[index] = torch.cat([self.past_keys[index], k], dim=2)        # [B, h, past + new, d_k]
        self.values[index] = torch.cat([self.past_values[index], v], dim=2)    # [B, h, past + new, d_v]
        return self.keys[index], self.values[index]

    def row_positions(self, new: int) -> None:  # an exported step's rows are not padded
        return None

    def key_positions(self, window: Optional[int], new: int, device: torch.device) -> torch.Tensor:
        return torch.arange(self.length + new, device=device)

    def kept_keys(self, window: Optional[int], new: int) -> None:
        return None

    def state(self, module: nn.Module) -> None:
        raise AssertionError("a recurrent layer is refused before export (`plan`)")

    def keep(self, module: nn.Module, *tensors: torch.Tensor) -> None:
        raise AssertionError("a recurrent layer is refused before export (`plan`)")


# --- the graphs ------------------------------------------------------------------------------------

class EncoderGraph(nn.Module):
    """src [B, S], src_padding_mask [B, S] -> memory [B, S, d_model], and for each cross-attention the
    keys and values of the memory [B, h, S, d], which the decoder steps then read."""

    def __init__(self, model: nn.Module, memory_attention: list[nn.Module]) -> None:
        super().__init__()
        self.model = model
        self.memory_attention = memory_attention   # a plain list: the modules are the model's own

    def forward(self, src: torch.Tensor, src_padding_mask: torch.Tensor) -> tuple[torch.Tensor, list, list]:
        # The generated model's and attention's own methods: torch types a module's attributes Tensor | Module.
        memory = self.model.encode(src, src_padding_mask)  # type: ignore[operator]
        keys, values = [], []
        for attention in self.memory_attention:
            # What the module computes of a memory tensor and keeps in a DecoderCache (no cache: no position).
            k, v = attention.keys_values(memory, memory, None)  # type: ignore[operator]
            keys.append(k)
            values.append(v)
        return memory, keys, values


class TranslationStep(nn.Module):
    """One decoding step of a translation model: tokens [B, 1], memory_padding_mask [B, S], the memory's
    keys and values, the past keys and values [B, h, P, d] -> logits [B, vocab], the keys and values
    [B, h, P + 1, d]."""

    def __init__(self, model: nn.Module, memory_attention: list[nn.Module], self_attention: list[nn.Module]) -> None:
        super().__init__()
        self.model = model
        self.memory_attention, self.self_attention = memory_attention, self_attention

    def forward(self, tokens: torch.Tensor, memory_padding_mask: torch.Tensor, memory_keys: list[torch.Tensor],
                memory_values: list[torch.Tensor], past_keys: list[torch.Tensor],
                past_values: list[torch.Tensor]) -> tuple[torch.Tensor, list, list]:
        # Each cross-attention finds its keys and values in the cache, which it matches to its memory
        # argument by identity; the memory itself is not needed, and None stands for it.
        kept = {module: (None, None, k, v) for module, k, v in zip(self.memory_attention, memory_keys, memory_values)}
        cache = TensorCache(self.self_attention, past_keys, past_values, kept)
        # [B, 1, vocab]; the generated model's own method: torch types a module's attributes Tensor | Module.
        logits = self.model.decode(tokens, None, memory_padding_mask, cache=cache)  # type: ignore[operator]
        return logits[:, -1], cache.keys, cache.values


class LanguageModelStep(nn.Module):
    """One decoding step of a language model: tokens [B, 1], the past keys and values [B, h, P, d] ->
    logits [B, vocab], the keys and values [B, h, P + 1, d]."""

    def __init__(self, model: nn.Module, self_attention: list[nn.Module]) -> None:
        super().__init__()
        self.model = model
        self.self_attention = self_attention

    def forward(self, tokens: torch.Tensor, past_keys: list[torch.Tensor],
                past_values: list[torch.Tensor]) -> tuple[torch.Tensor, list, list]:
        cache = TensorCache(self.self_attention, past_keys, past_values, {})
        logits = self.model.decode(tokens, cache=cache)  # type: ignore[operator]  # [B, 1, vocab], as above
        return logits[:, -1], cache.keys, cache.values


@dataclass
class Graph:
    """A graph to export: its module, example inputs to trace it with, which dimensions of them vary,
    and the names of its inputs and outputs flattened in order (lists become NAME.0, NAME.1, ...)."""

    name: str
    module: nn.Module
    example: tuple
    dynamic_shapes: tuple
    inputs: list[str]
    outputs: list[str]


@dataclass
class Plan:
    """What an export writes: the graphs, the caches they carry, and the dimensions' bounds."""

    graphs: list[Graph]
    self_attention: list[CacheSlot]
    memory_attention: list[CacheSlot]
    dimensions: dict[str, dict[str, Optional[int]]]     # name -> {"min": ..., "max": ...} (None: no bound)


def listed(name: str, count: int) -> list[str]:
    return [f"{name}.{i}" for i in range(count)]


def plan(trained: TrainedModel) -> Plan:
    """The graphs of a trained model and their example inputs."""
    model, spec = trained.model, trained.spec
    if not spec.has_decoder:
        raise UserError(f"{spec.name}: an encoder-only model has no logits to decode; export takes translation "
                        "and language models")
    self_attention = cached_attention(spec, model, "append")
    if not self_attention:
        raise UserError(f"{spec.name}: its decoder has no self-attention whose keys and values a step could "
                        "carry; export writes decoding steps with their cache")
    windowed = [node.module for node in spec.ops if node.inferred.get("kv_cache") == "append"
                and OPS[node.op].cache(node.attrs, node.inferred)[1] is not None]
    if windowed:  # a step would carry a ring of `window` positions, which the exported cache does not model
        raise UserError(f"{spec.name}: export does not yet write sliding-window attention ({windowed[0]}); its "
                        "decoding cache keeps a ring of the last positions, which the exported steps do not carry")
    stepped = [node for node in spec.ops if node.scope.split(".")[0] != MTP]  # drafting's modules: not run
    if any(OPS[node.op].family == Family.EXPERTS for node in stepped):
        raise UserError(f"{spec.name}: export does not yet write a mixture of experts: the experts' token counts "
                        "depend on the routing, which torch.export's static graphs cannot follow")
    recurrent = [node.module for node in stepped if OPS[node.op].recurrent_state(node.attrs, node.inferred)]
    if recurrent:
        raise UserError(f"{spec.name}: export does not yet write recurrent layers ({recurrent[0]}): a step would "
                        "carry their states, which the exported steps do not")
    longest = trained.max_tokens
    if longest <= EXAMPLE_PAST + 1:
        raise UserError(f"{spec.name}: {longest} positions are too few to export (at least {EXAMPLE_PAST + 2})")
    batch, past = Dim("batch", min=1), Dim("past", min=0, max=longest - 1)
    dimensions: dict[str, dict[str, Optional[int]]] = {"batch": {"min": 1, "max": None},
                                                       "past": {"min": 0, "max": longest - 1}}
    device, dtype = trained.device, next(model.parameters()).dtype
    modules = [module for _, module in self_attention]
    layers = len(modules)
    self_slots = [slot(spec, name) for name, _ in self_attention]
    tokens = torch.full((EXAMPLE_BATCH, 1), EOS + 1, dtype=torch.long, device=device)
    past_keys = [torch.zeros(EXAMPLE_BATCH, s.heads, EXAMPLE_PAST, s.key_dim, dtype=dtype, device=device)
                 for s in self_slots]
    past_values = [torch.zeros(EXAMPLE_BATCH, s.heads, EXAMPLE_PAST, s.value_dim, dtype=dtype, device=device)
                   for s in self_slots]
    past_shapes = [{0: batch, 2: past}] * layers
    past_names = [*listed("past_keys", layers), *listed("past_values", layers)]
    step_outputs = ["logits", *listed("present_keys", layers), *listed("present_values", layers)]
    if not spec.has_encoder:
        step = Graph("decoder", LanguageModelStep(model, modules), (tokens, past_keys, past_values),
                     ({0: batch}, past_shapes, past_shapes), ["tokens", *past_names], step_outputs)
        return Plan([step], self_slots, [], dimensions)

    # A translation model: the encoder, and a step that also reads the memory's keys and values.
    memory_attention = cached_attention(spec, model, "static")
    memory_layers = len(memory_attention)
    source = Dim("src_len", min=1, max=longest)
    dimensions["src_len"] = {"min": 1, "max": longest}
    src = torch.full((EXAMPLE_BATCH, EXAMPLE_SOURCE), EOS + 1, dtype=torch.long, device=device)
    src_padding_mask = torch.zeros(EXAMPLE_BATCH, EXAMPLE_SOURCE, dtype=torch.bool, device=device)
    src_padding_mask[0, -1] = True
    encoder = EncoderGraph(model, [module for _, module in memory_attention])
    with torch.no_grad():
        _, memory_keys, memory_values = encoder(src, src_padding_mask)
    memory_shapes = [{0: batch, 2: source}] * memory_layers
    memory_names = [*listed("memory_keys", memory_layers), *listed("memory_values", memory_layers)]
    encoder_graph = Graph("encoder", encoder, (src, src_padding_mask), ({0: batch, 1: source},) * 2,
                          ["src", "src_padding_mask"], ["memory", *memory_names])
    step = Graph("decoder", TranslationStep(model, encoder.memory_attention, modules),
                 (tokens, src_padding_mask, memory_keys, memory_values, past_keys, past_values),
                 ({0: batch}, {0: batch, 1: source}, memory_shapes, memory_shapes, past_shapes, past_shapes),
                 ["tokens", "memory_padding_mask", *memory_names, *past_names], step_outputs)
    memory_slots = [slot(spec, name) for name, _ in memory_attention]
    return Plan([encoder_graph, step], self_slots, memory_slots, dimensions)


# --- exporting -------------------------------------------------------------------------------------

def check_onnx_installed() -> None:
    """ONNX export needs the onnx and onnxscript packages (the `onnx` extra), which xspec does not require."""
    for package in ("onnx", "onnxscript"):
        try:
            importlib.import_module(package)
        except ImportError:
            raise UserError(f"--format onnx needs the {package} package: {ONNX_EXTRA}") from None


def export_program(graph: Graph) -> torch.export.ExportedProgram:
    with _quiet():
        try:
            return torch.export.export(graph.module, graph.example, dynamic_shapes=graph.dynamic_shapes, strict=False)
        except Exception as error:   # torch's export fails in many ways, each one a model it cannot capture
            raise UserError(f"torch.export cannot export the {graph.name} graph: {_reason(error)}") from error


def write_onnx(graph: Graph, path: Path) -> None:
    with _quiet():
        try:
            program = torch.onnx.export(graph.module, graph.example, dynamic_shapes=graph.dynamic_shapes,
                                        input_names=graph.inputs, output_names=graph.outputs, dynamo=True,
                                        verbose=False)
        except Exception as error:   # as above: a model the exporter cannot translate
            raise UserError(f"torch.onnx cannot export the {graph.name} graph: {_reason(error)}") from error
    assert program is not None       # None only from the older exporter (dynamo=False)
    program.save(str(path))          # the weights go to a file beside it only past ONNX's 2 GB limit


def export_model(trained: TrainedModel, format: str, directory: Path) -> list[str]:
    """Writes the trained model's graphs in `format` ("exported-program" or "onnx"), its vocabulary and the
    manifest into `directory`, which appears complete or not at all; returns the names of the files."""
    assert format in SUFFIXES, format
    check_destination(directory)
    exported = plan(trained)

    def fill(staging: Path) -> None:
        for graph in exported.graphs:
            path = staging / f"{graph.name}{SUFFIXES[format]}"
            if format == "onnx":
                write_onnx(graph, path)
            else:
                torch.export.save(export_program(graph), str(path))
        (staging / tokenizer_file(trained.tokenizer)).write_bytes(trained.tokenizer.model_proto)
        (staging / MANIFEST).write_text(json.dumps(manifest(trained, format, exported), indent=2) + "\n")

    try:
        write_directory(directory, fill, WRITER)
    except OSError as error:
        raise UserError(f"--output {directory}: cannot write: {error.strerror or error}") from None
    return sorted(p.name for p in directory.iterdir() if p.name != WRITTEN)


def tokenizer_file(tokenizer: Tokenizer) -> str:
    """sentencepiece.model for xspec's vocabulary; an import's own tokenizer keeps its file name."""
    return {"tokenizers": "tokenizer.json", "sentencepiece": "tokenizer.model"}.get(tokenizer.kind, MODEL_FILE)


def manifest(trained: TrainedModel, format: str, exported: Plan) -> dict:
    """export.json: what a deployment needs to know to feed the graphs and read their outputs."""
    spec = trained.spec
    translation = spec.has_encoder
    tokenizer = trained.tokenizer
    if isinstance(tokenizer, CheckpointTokenizer):  # an import's own: its ids, and documents from BOS to EOS
        return {**_manifest(trained, format, exported, translation),
                "tokenizer": tokenizer_file(tokenizer),
                "special_tokens": {"bos": tokenizer.bos_id, "eos": tokenizer.eos_id},
                "start_token": tokenizer.document_start, "end_token": tokenizer.document_end}
    return _manifest(trained, format, exported, translation)


def _manifest(trained: TrainedModel, format: str, exported: Plan, translation: bool) -> dict:
    spec = trained.spec
    return {
        "xspec_export": MANIFEST_VERSION,
        "format": format,
        "model": spec.name,
        "kind": "translation" if translation else "language model",
        "checkpoint": trained.path.name,
        "parameters": spec.parameters,
        "torch": torch.__version__,
        "tokenizer": MODEL_FILE,
        "special_tokens": {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS},
        # How the model reads text: a source is its pieces then EOS; a target starts with BOS; a
        # language model's document starts with EOS. Decoding stops at EOS.
        **({"source_end_token": EOS} if translation else {}),
        "start_token": BOS if translation else EOS,
        "end_token": EOS,
        "vocab_size": spec.vocab_size,
        "max_tokens": trained.max_tokens,
        "dimensions": exported.dimensions,
        "graphs": {graph.name: {"file": f"{graph.name}{SUFFIXES[format]}", "inputs": graph.inputs,
                                "outputs": graph.outputs} for graph in exported.graphs},
        "cache": {"self_attention": [asdict(s) for s in exported.self_attention],
                  "memory_attention": [asdict(s) for s in exported.memory_attention]},
        "decode": spec.decode.model_dump(mode="json"),
    }


# --- the output directory --------------------------------------------------------------------------

def check_destination(path: Path, option: str = "--output") -> Path:
    """Refuses, before any work, an output that is not a directory xspec may fill: a file, a path
    that cannot be created, a directory holding anything but an earlier export (xspec/base/output_dir.py)."""
    if path.suffix in SUFFIXES.values():
        raise UserError(f"{option} {shown(path)}: the export is a directory (graphs, vocabulary, manifest); "
                        f"give a directory name, e.g. {shown(path.with_suffix(''))}")
    return check_replaceable(path, option, "export")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporters' warnings and log lines (about torch's internals, e.g. torchvision missing) say
    nothing a user of xspec can act on; failures are still raised."""
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        exporter_log.setLevel(level)


def _reason(error: Exception) -> str:
    """The first lines of an exporter's error, on one line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = " ".join(lines[:3]) or type(error).__name__
    return text if len(text) <= 400 else text[:397] + "..."
