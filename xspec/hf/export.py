"""`xspec export RUN --format hf`: a run whose spec is one of the families' (imported, fine-tuned, or
trained from a family's spec) as a directory transformers' from_pretrained loads: config.json, the
weights under Hugging Face's names (model.safetensors, or shards of at most 5 GB and their index, as
save_pretrained writes them), and the tokenizer.

Which family a spec is decided by what it computes, not by its name: the spec's parameters are written
as a family's config.json, that config is mapped back (families/) and compiled, and its op graph must
equal the run's, op for op. A spec that matches no family is refused, naming the first op where it differs
from the closest one. A run an older xspec wrote is compared in the form the families' specs write now
(older_runs.py: a one-op mixture of experts, activations chosen by `if`s)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Container, Optional

from xspec.base.errors import UserError
from xspec.base.text import printable
from xspec.compiler.sections import DecodeSection
from xspec.hf import weight_map
from xspec.hf.families import FAMILIES, Family, map_config
from xspec.hf.generation_config import FILTERS, RULES
from xspec.hf.hf_config import config_for
from xspec.hf.own_vocabulary import tokenizer_json, tokenizer_settings
from xspec.hf.older_runs import current_graph, current_params, packed_as_two_ops
from xspec.hf.safetensors_file import write_safetensors
from xspec.runtime.tokenizer import M2M100, MARIAN
from xspec.runtime.translation import output_start
from xspec.runtime.tokenizer_files import M2M100_FILES, MARIAN_FILES, MARIAN_TARGET_VOCAB, files_of
from xspec.runtime.vocab import EOS, Tokenizer, Vocab


@dataclass(frozen=True)
class _Node:
    """One op of the graph as export compares it: what it computes, its inputs by position. Names are
    not compared, so a spec that names its modules otherwise (or a run an older xspec wrote) still maps,
    its tensors renamed to the family's."""

    name: str                   # the op's id, for messages
    op: str
    attrs: str
    shape: str
    module: Optional[str]       # the module holding its tensors, if it has any
    inputs: tuple               # (the producing op's position, its ports), sorted
    one_op: bool = False        # the experts of a one-op mixture: gate, up and down apart

    def computes(self) -> tuple:
        return (self.op, self.attrs, self.shape, self.module is None, self.inputs)


def _graph(spec) -> tuple[list[_Node], list[tuple]]:
    """The op graph in order, in the form the families' specs write now (older_runs.py), and the ties as
    (op position, tensor) pairs."""
    graph = json.loads(spec.graph_json())
    listed, edges = current_graph(graph["nodes"], list(graph["edges"]))
    position = {node["id"]: index for index, node in enumerate(listed)}
    inputs: dict[str, list[tuple]] = {}
    for edge in edges:
        inputs.setdefault(edge["to"], []).append((position[edge["from"]], tuple(edge["ports"])))
    nodes = [_Node(n["id"], n["op"], json.dumps(n["attrs"], sort_keys=True), n["shape"], n["module"],
                   tuple(sorted(inputs.get(n["id"], []))), n.get("one_op", False)) for n in listed]
    held = {node.module: index for index, node in enumerate(nodes) if node.module is not None}

    def tensor(path: str) -> tuple:
        module = _holder(path, held)
        return (held[module], path.removeprefix(module)) if module is not None else (-1, path)

    return nodes, sorted((tensor(copy), tensor(target)) for copy, target in graph["ties"].items())


def _holder(name: str, modules: Container[str]) -> Optional[str]:
    """The innermost of `modules` that holds the tensor `name`."""
    path = name
    while "." in path:
        path = path.rsplit(".", 1)[0]
        if path in modules:
            return path
    return None


def _quoted(value: Any) -> Any:
    return f'"{value}"' if isinstance(value, str) else value


@dataclass(frozen=True)
class Match:
    """A spec as one family: the config.json it writes, the mapping that reads it back, the family's own
    spec at those values, whose tensor names are the checkpoint's, and each module of the spec as the
    family's spec names the same op's (matched op by op)."""

    config: Any
    mapped: Any
    family_spec: Any
    modules: dict[str, str]
    one_op_experts: list[str]   # the family's experts modules a one-op mixture of the spec's computes
    zero_biases: list[str]      # the family's biases of linear layers the spec has without one: zeros
    # The axes of the family's tensors (by name) that hold the model's features, where the spec's are the
    # family's permuted (the paper's alternating sines and cosines as Marian's halves); else None.
    feature_axes: Optional[Callable[[str], tuple[int, ...]]] = None

    def family_tensors(self, state: dict[str, Any]) -> dict[str, Any]:
        """The spec's tensors (by its names) under the family's names, as the family computes with them."""
        import torch

        tensors = {self.tensor_name(name): tensor for name, tensor in state.items()}
        shapes = {**self.family_spec.param_shapes, **self.family_spec.state_shapes}
        for name in self.zero_biases:
            tensors[name] = torch.zeros(shapes[name], dtype=next(iter(state.values())).dtype)
        if self.feature_axes is not None:
            for name, tensor in tensors.items():
                for axis in self.feature_axes(name):
                    features = tensor.size(axis)    # sin and cos alternate, where the family has every sine first
                    order = torch.cat([torch.arange(0, features, 2), torch.arange(1, features, 2)])
                    tensor = tensor.index_select(axis, order)
                tensors[name] = tensor
        return tensors

    def tensor_name(self, name: str) -> str:
        """The family's name of the spec's tensor `name`: a run's `decoder.layers.0.sublayer_1.norm.weight`
        is `...input_layernorm.weight`."""
        module = _holder(name, self.modules)
        return name if module is None else self.modules[module] + name.removeprefix(module)


def _candidate(spec, params: dict, graph: tuple[list[_Node], list[tuple]], family: Family,
               special: tuple[int | None, list[int]]):
    """(the match, the first difference or None) of the spec, of parameters `params` and op graph `graph`, as
    `family`. A
    spec whose parameters cannot be written as that family's config is compared with the family's spec at
    the parameters they share, to say where they differ."""
    import xspec
    from xspec.hf.spec_text import family_spec

    config = mapped = None
    if family.kin is not None:
        params = family.kin.params(params) or params
    try:
        config = config_for(family, params, spec.data.max_tokens, *special)
        mapped = map_config(dict(config))
        rebuilt = xspec.compile(family_spec(mapped.spec),
                                overrides={s.param: _quoted(s.value) for s in mapped.settings})
    except (KeyError, TypeError, UserError):
        config = mapped = None
        defaults = xspec.compile(family_spec(family.spec)).params
        shared = {k: _quoted(v) for k, v in params.items() if k in defaults and type(v) is type(defaults[k])}
        try:
            rebuilt = xspec.compile(family_spec(family.spec), overrides=shared)
        except UserError:
            rebuilt = xspec.compile(family_spec(family.spec))
    (ours, our_ties), (theirs, their_ties) = graph, _graph(rebuilt)
    zero_biases, permuted = [], False
    for index, (a, b) in enumerate(zip(ours, theirs)):
        if a.computes() == b.computes():
            continue
        allowed = _allowed(a, b, family)
        if allowed is None:
            return None, (index, a, b)
        if allowed == "zero bias":
            zero_biases.append(f"{b.module}.bias")
        permuted = permuted or allowed == "permuted"
    if len(ours) != len(theirs):
        shorter = min(len(ours), len(theirs))
        return None, (shorter, ours[shorter] if shorter < len(ours) else "(nothing)",
                      theirs[shorter] if shorter < len(theirs) else "(nothing)")
    if our_ties != their_ties:
        return None, (len(ours), f"ties {our_ties}", f"ties {their_ties}")
    if config is None:    # the same graph, but parameters no config holds
        return None, (len(ours), "parameters", "others")
    modules = {a.module: b.module for a, b in zip(ours, theirs) if a.module is not None and b.module is not None}
    one_op = [b.module for a, b in zip(ours, theirs) if a.one_op and b.module is not None]
    axes = family.kin.feature_axes if permuted and family.kin is not None else None
    return Match(config, mapped, rebuilt, modules, one_op, zero_biases, axes), None


def _allowed(ours: _Node, theirs: _Node, family: Family) -> Optional[str]:
    """How two ops that differ compute alike all the same, or None: "zero bias", a linear layer without the bias
    the family's has (written as zeros); "permuted", sinusoidal positions of another layout that the family's
    kin takes as a permutation of the model's features (its tensors permuted along those)."""
    if (ours.op, ours.shape, ours.inputs, ours.module is None) != (theirs.op, theirs.shape, theirs.inputs,
                                                                  theirs.module is None):
        return None
    mine, other = json.loads(ours.attrs), json.loads(theirs.attrs)
    differing = {key for key in mine.keys() | other.keys() if mine.get(key) != other.get(key)}
    if ours.op == "linear" and differing == {"bias"} and not mine["bias"]:
        return "zero bias"
    if ours.op == "sinusoidal_positions" and differing == {"layout"} and family.kin is not None \
            and family.kin.layouts.get(mine["layout"]) == other["layout"]:
        return "permuted"
    return None


def match_family(spec, special: tuple[int | None, list[int]], preferred: object = None) -> Match:
    """The family whose spec computes what `spec` does: `preferred` (an import's model_type) where it does, as
    families may share a spec (T5's and mT5's)."""
    closest = None
    # The families whose own parameters the spec has most of first: usually the first compiled matches.
    params = current_params(spec.params)
    order = sorted(FAMILIES, key=lambda t: (t != preferred, -sum(p in params for p in FAMILIES[t].keys)))
    graph = _graph(spec)
    for model_type in order:
        match, difference = _candidate(spec, params, graph, FAMILIES[model_type], special)
        if match is not None:
            return match
        if closest is None or difference[0] > closest[1][0]:
            closest = (model_type, difference)
    assert closest is not None
    model_type, (_, ours, theirs) = closest
    raise UserError(f"{spec.path}: spec '{spec.name}' maps to none of the Hugging Face families; the closest, "
                    f"{model_type}, differs at {_difference(ours, theirs, model_type)}")


def _difference(ours, theirs, model_type: str) -> str:
    """Where two ops differ, naming what differs: the attributes of one op (`scale 11.31 where llama has
    1.0`), its shape or its inputs; else both ops whole."""
    if isinstance(ours, _Node) and isinstance(theirs, _Node) and ours.op == theirs.op:
        mine, other = json.loads(ours.attrs), json.loads(theirs.attrs)
        changed = [f"{key} {_value(mine.get(key))} where {model_type} has {_value(other.get(key))}"
                   for key in sorted(set(mine) | set(other)) if mine.get(key) != other.get(key)]
        if ours.shape != theirs.shape:
            changed.append(f"shape {ours.shape} where {model_type} has {theirs.shape}")
        if ours.inputs != theirs.inputs:
            changed.append(f"other inputs than {model_type}'s")
        where = ours.name if ours.name == theirs.name else f"{ours.name} ({model_type}: {theirs.name})"
        if changed:
            return f"{where}: {ours.op} with " + "; ".join(changed)
    return f"{_describe(ours)}, where {model_type} has {_describe(theirs)}"


def _value(value: object) -> str:
    shown = f"{value:.6g}" if isinstance(value, float) else printable(json.dumps(value))
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _describe(node) -> str:
    if not isinstance(node, _Node):
        return printable(str(node))
    attrs = ", ".join(f"{k}={v}" for k, v in json.loads(node.attrs).items() if v not in (None, False))
    return f"{node.name} ({node.op}{': ' + attrs if attrs else ''}; shape {node.shape})"


# transformers' save_pretrained shards at 5 GB (max_shard_size="5GB"), and the Hugging Face hub takes no
# file over 50 GB: a larger model is written as several files and an index naming each tensor's file.
SHARD_BYTES = 5_000_000_000
INDEX_FILE = "model.safetensors.index.json"


def shards(sizes: list[int], limit: int) -> list[range]:
    """Consecutive runs of tensors, by their sizes in bytes, each at most `limit` bytes (a tensor larger
    than `limit` is a shard of its own)."""
    runs: list[range] = []
    start, total = 0, 0
    for index, size in enumerate(sizes):
        if index > start and total + size > limit:
            runs.append(range(start, index))
            start, total = index, 0
        total += size
    if sizes:
        runs.append(range(start, len(sizes)))
    return runs


def _write_weights(tensors: list, out: Path, shard_bytes: int) -> list[str]:
    layout = [(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in tensors]
    sizes = [tensor.numel() * tensor.element_size() for _, tensor in tensors]
    runs = shards(sizes, shard_bytes)
    names = ["model.safetensors"] if len(runs) == 1 else \
        [f"model-{i + 1:05d}-of-{len(runs):05d}.safetensors" for i in range(len(runs))]
    for name, run in zip(names, runs):
        with open(out / name, "wb") as handle:
            write_safetensors(handle, [layout[i] for i in run], (tensors[i][1] for i in run), {"format": "pt"})
    if len(runs) == 1:
        return names
    index = {"metadata": {"total_size": sum(sizes)},
             "weight_map": {layout[i][0]: name for name, run in zip(names, runs) for i in run}}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [INDEX_FILE, *names]


def export_hf(trained, out: Path, shard_bytes: int | None = None,
              say: Callable[[str], None] = lambda _: None) -> list[str]:
    """Writes `out` (its contents; the caller makes it appear atomically): config.json, the weights in files
    of at most `shard_bytes` (default SHARD_BYTES; one model.safetensors where they fit, else shards and
    their index), the tokenizer and generation_config.json; returns the files written. An import's own
    config.json keys are kept, each the run's spec changed said (`say`)."""
    tokenizer = trained.tokenizer
    # xspec's own vocabulary starts and ends a document at EOS
    special = (tokenizer.bos_id, tokenizer.eos_ids) if tokenizer.kind != "xspec" else (EOS, [EOS])
    kept = tokenizer.hf_files
    match = match_family(trained.spec, special, kept.get("config.json", {}).get("model_type"))
    config = kept_keys(kept.get("config.json"), match.config, match.mapped, say)
    # an encoder-decoder's outputs start from the decode section's token (the import's own, else xspec's BOS)
    start = output_start(trained.spec.decode) if trained.spec.has_encoder and trained.spec.has_decoder else None
    if start is not None:
        config.setdefault("decoder_start_token_id", start)
    mapped, theirs = match.mapped, match.family_spec
    state = match.family_tensors({name: tensor.detach().cpu() for name, tensor in trained.model.state_dict().items()})
    for experts in match.one_op_experts:
        packed_as_two_ops(state, experts)
    shapes = {**theirs.param_shapes, **theirs.state_shapes}
    names = [n for n in shapes if n not in theirs.ties]
    groups = weight_map.groups(mapped.weights, names, shapes, theirs.params)
    tensors: list = []
    for group in groups:
        tensors += zip(group.hf, group.to_hf([state[n] for n in group.ours]))
    weights = _write_weights(tensors, out, shard_bytes or SHARD_BYTES)
    # the dtype under its new name and its old one
    config["dtype"] = config["torch_dtype"] = str(next(iter(state.values())).dtype).removeprefix("torch.")
    _write_json(out / "config.json", config)
    bos, eos = special
    generation = generation_config(kept.get("generation_config.json"), trained.spec.decode, bos, eos, start,
                                   tokenizer.never_generated)
    _write_json(out / "generation_config.json", generation)
    written = _write_tokenizer(tokenizer, out, kept, trained.spec, f"{trained.label}: its sentencepiece vocabulary")
    return ["config.json", *weights, "generation_config.json", *written]


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# config.json's spellings of the rotary settings: one written replaces any other the import had.
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "rope_local_base_freq")
# Special ids the import's config.json gives keep its values (the tokenizer's end ids join
# generation_config.json's to them; padding is never attended to).
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def kept_keys(original: dict | None, written: dict, mapped, say: Callable[[str], None]) -> dict:
    """`written` (the config the run's spec makes) over the import's own config.json: every key it had is
    kept, in the import's spelling of the rotary settings where that still reads as the run's model (else
    the spec's), those the spec computes take the spec's values (each that changed is said); where the
    two would not read as one model, the spec's config alone."""
    if original is None:
        return written
    special = {key: original[key] for key in SPECIAL_IDS if key in original}
    candidates = [original | {k: v for k, v in written.items() if k not in ROPE_KEYS} | special,  # its spelling
                  {k: v for k, v in original.items() if k not in ROPE_KEYS} | written | special]
    merged = next((c for c in candidates if _reads_as(c, mapped)), None)
    if merged is None:
        say("config.json: written from the run's spec alone (the imported config.json's keys would read as "
            "another model beside it)")
        return written
    for key in sorted(set(original) & set(written)):
        if original[key] != merged[key] and key not in ("architectures", "dtype", "torch_dtype",
                                                        "transformers_version"):
            say(f"config.json: {printable(key)} {json.dumps(original[key])} is now {json.dumps(merged[key])} "
                "(the run's spec)")
    return merged


def _reads_as(config: dict, mapped) -> bool:
    """Whether `config` maps to the parameters `mapped` holds (its family reads it as the import did)."""
    try:
        return map_config(dict(config)).params == mapped.params
    except UserError:
        return False


def generation_config(original: dict | None, decode: DecodeSection, bos: int | None, eos: list[int],
                      start: int | None = None, never: tuple[int, ...] = ()) -> dict:
    """generation_config.json: the import's own (or transformers' defaults), with the settings the spec's
    decode section holds, and the special ids: an encoder-decoder's output `start`, the tokens xspec's
    vocabulary `never` generates (its padding and BOS) suppressed."""
    config = dict(original or {})
    beams = decode.beam if decode.beam_sampling or not decode.sample else 1
    config |= {"do_sample": decode.sample, "num_beams": beams}
    if decode.sample:
        config |= {"temperature": decode.temperature, "top_k": decode.top_k or 0, "top_p": decode.top_p}
    else:
        for key in ("temperature", "top_k", "top_p", *FILTERS):
            config.pop(key, None)
    if "max_new_tokens" in config or original is None:
        config["max_new_tokens"] = decode.max_new_tokens
    filters = {key: neutral for key, (neutral, _, _) in FILTERS.items()} if decode.sample else {}
    # min-p and the other filters when sampling, the repetition penalty and the rest: as the section holds them
    for key, off in {**filters, **RULES}.items():
        value = getattr(decode, key)
        if value != off:
            config[key] = list(value) if isinstance(value, tuple) else value
        else:
            config.pop(key, None)
    if decode.beam_scoring == "transformers":       # GNMT's scoring has no spelling there
        config |= {"length_penalty": decode.length_penalty, "early_stopping": decode.early_stopping}
    suppressed = config.get("suppress_tokens") or []
    if any(token not in suppressed for token in never):
        config["suppress_tokens"] = [*suppressed, *(token for token in never if token not in suppressed)]
    config.setdefault("bos_token_id", bos)
    config.setdefault("eos_token_id", eos[0] if len(eos) == 1 else eos or None)
    if start is not None:
        config.setdefault("decoder_start_token_id", start)
    return config


def _write_tokenizer(tokenizer: Tokenizer, out: Path, kept: dict[str, dict], spec, where: str) -> list[str]:
    """The tokenizer's file, and the import's own tokenizer_config.json and special_tokens_map.json (what
    AutoTokenizer reads of special tokens, the chat template included), else a minimal configuration; xspec's
    own vocabulary as a tokenizer.json that encodes and frames a text as xspec does for the model `spec`
    compiles (a language model's documents start at EOS; an encoder's text ends with it), `where` naming it in
    a refusal."""
    if tokenizer.kind == "none":
        return []
    if isinstance(tokenizer, Vocab):
        (out / "tokenizer.json").write_bytes(tokenizer_json(tokenizer, not spec.has_encoder, where))
        _write_json(out / "tokenizer_config.json", tokenizer_settings(tokenizer, spec))
        return ["tokenizer.json", "tokenizer_config.json"]
    if tokenizer.kind == "tokenizers":
        (out / "tokenizer.json").write_bytes(tokenizer.model_proto)
        settings: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
        written = ["tokenizer.json"]
    elif tokenizer.kind == MARIAN:
        files = files_of(tokenizer.model_proto, (*MARIAN_FILES, MARIAN_TARGET_VOCAB))
        for name, data in files.items():
            (out / name).write_bytes(data)
        settings = {"tokenizer_class": "MarianTokenizer"}
        written = list(files)
    elif tokenizer.kind == M2M100:
        for name, data in files_of(tokenizer.model_proto, M2M100_FILES).items():
            (out / name).write_bytes(data)
        settings = {"tokenizer_class": "M2M100Tokenizer"}
        written = list(M2M100_FILES)
    else:
        (out / "tokenizer.model").write_bytes(tokenizer.model_proto)
        settings = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": False}
        written = ["tokenizer.model"]
    _write_json(out / "tokenizer_config.json", kept.get("tokenizer_config.json", settings))
    written.append("tokenizer_config.json")
    if "special_tokens_map.json" in kept:
        _write_json(out / "special_tokens_map.json", kept["special_tokens_map.json"])
        written.append("special_tokens_map.json")
    return written
