"""`CompiledSpec`: what `xspec.compile` returns, and how it becomes a PyTorch model; `compile_source`, the
compiler as the layers above it call it (xspec.compile and xspec.compile_source; the runtime, for the spec a
checkpoint holds), its failures raised as the errors a user sees."""

from __future__ import annotations

import hashlib
import json
import linecache
import os
import sys
import types
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union, cast

from xspec.base.errors import SpecError, UserError
from .pipeline import Compilation, CompileFailed, compile_spec

# Type names only: torch is imported by the methods that build a model, networkx by `graph`, so
# compiling a spec imports neither.
if TYPE_CHECKING:
    import networkx as nx
    import torch

    from .ir import OpGraph
    from .sections import DataSection, DecodeSection, TrainSection


class CompiledSpec:
    """A validated spec: its graph, parameter count, generated source, and runtime sections."""

    def __init__(self, compilation: Compilation, overrides: Optional[Mapping[str, Any]] = None) -> None:
        self._compilation = compilation
        # What the command line or the caller set over the spec file (--set), as given.
        self.overrides: dict[str, Any] = dict(overrides or {})
        model, validated = compilation.model, compilation.validated
        self.name: str = model.name
        self.path: str = model.span.file
        self.params: dict[str, Any] = dict(model.params)
        # The values a parameter may take, where the spec lists them (`param positions = "sinusoidal" in [...]`).
        self.choices: dict[str, tuple[Any, ...]] = dict(model.choices)
        self.ops: OpGraph = validated.graph.graph  # typed nodes in topological order (compiler/ir.py)
        self.parameters: int = validated.parameter_count
        self.train: TrainSection = model.sections["train"]  # type: ignore[assignment]
        self.data: DataSection = model.sections["data"]  # type: ignore[assignment]
        self.decode: DecodeSection = model.sections["decode"]  # type: ignore[assignment]
        self.warnings: str = compilation.diagnostics.render()

    @cached_property
    def python_source(self) -> str:
        """The generated module, which imports the op library (xspec.nn), lowered when first asked for."""
        return self._compilation.python_source

    @property
    def standalone_source(self) -> str:
        """The generated module with the op library's classes it uses copied in: it depends on torch alone
        (`xspec compile --standalone`)."""
        return self._compilation.lowered.standalone

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The op graph as a `networkx.DiGraph` (docs/graph.md), made when first asked for."""
        return self.ops.to_networkx()

    # --- facts the runtime needs, read off the graph -----------------------------------------
    @property
    def has_encoder(self) -> bool:
        from .entries import SRC  # loaded with the compiler, which has run

        return SRC.node in self.ops

    @property
    def has_decoder(self) -> bool:
        """False for an encoder-only model (no logits: nothing to train or decode with the runtime)."""
        from .entries import LOGITS  # loaded with the compiler, which has run

        return LOGITS.node in self.ops

    @property
    def masked_lm(self) -> bool:
        """An encoder alone whose output scores every vocabulary entry at each position (BERT's masked LM)."""
        from .entries import MEMORY  # loaded with the compiler, which has run

        return not self.has_decoder and self.has_encoder and \
            self.ops[MEMORY.node].checked_shape().last == self.vocab_size

    @property
    def classes(self) -> Optional[int]:
        """A classifier's number of classes: an encoder alone whose output scores other than the vocabulary
        (BERT with num_labels), read at each text's first position; None for any other model."""
        from .entries import MEMORY  # loaded with the compiler, which has run

        if self.has_decoder or not self.has_encoder or self.masked_lm:
            return None
        width = self.ops[MEMORY.node].checked_shape().last
        return width if isinstance(width, int) else None

    @cached_property
    def token_types(self) -> Optional[int]:
        """How many token types the encoder reads (BERT's type_vocab_size), where its forward takes each
        position's (`encode(src, mask, token_types)`); None where it takes none."""
        from .entries import ENCODER  # loaded with the compiler, which has run
        from .ops import TokenTypeAttrs

        encoder = self.instances.children.get(ENCODER)
        if encoder is None or not encoder.has_token_types:
            return None
        return min(node.attrs.types for node in self.ops
                   if isinstance(node.attrs, TokenTypeAttrs) and f"{node.scope}.".startswith(f"{ENCODER}."))

    @cached_property
    def vocab_size(self) -> int:
        """The most rows any embedding, or the logits, has: every token id the model reads or writes is below."""
        from .ops import OPS

        facts = (OPS[node.op].facts(node.attrs, node.inferred) for node in self.ops)
        sizes = {size for f in facts if isinstance(size := f.get("vocab"), int)}
        logits = self.logits_size
        return max(sizes | ({logits} if logits is not None else set()))

    @cached_property
    def logits_size(self) -> Optional[int]:
        """How many tokens the decoder scores (a target vocabulary of its own where the model has one); None
        without a decoder."""
        from .entries import LOGITS  # loaded with the compiler, which has run

        logits = self.ops[LOGITS.node].checked_shape().last if LOGITS.node in self.ops else None
        return logits if isinstance(logits, int) else None

    @cached_property
    def max_positions(self) -> Optional[int]:
        from .ops import PositionsAttrs  # loaded with the compiler, which has run

        # tables of positions; a relative bias has none, and no length it is limited to
        lengths = [node.attrs.max_len for node in self.ops if isinstance(node.attrs, PositionsAttrs)]
        return min(lengths) if lengths else None

    @cached_property
    def output_head(self) -> Optional[str]:
        """The path of the module whose output is a language model's logits (its pre-softmax projection), which
        multi-token prediction's depths share; None where the logits are not a module's output."""
        from .entries import LOGITS  # loaded with the compiler, which has run

        if LOGITS.node not in self.ops:
            return None
        return self.ops[self.ops[LOGITS.node].inputs["x"]].module

    @cached_property
    def model_dim(self) -> int:
        """The width of the decoder's output before the vocabulary projection (d_model)."""
        from .entries import LOGITS, MEMORY  # loaded with the compiler, which has run

        if LOGITS.node not in self.ops:
            return int(self.ops[MEMORY.node].checked_shape().last)
        from .ops import OPS

        projection = self.ops[self.ops[LOGITS.node].inputs["x"]]
        while OPS[projection.op].elementwise and list(projection.inputs) == ["x"]:  # a soft cap on the logits
            projection = self.ops[projection.inputs["x"]]
        width = projection.inferred.get("in_features", projection.checked_shape().last)
        assert isinstance(width, int), f"{projection.id}: its input width is not a number"
        return width

    def training_memory(self, batch: int, length: int, *, activation_bytes: int = 4, shards: int = 1,
                        replicas: int = 1, trained: Optional[int] = None, weight_bytes: Optional[int] = None,
                        recomputed: bool = False):
        """Estimated bytes a training pass of `batch` sequences of `length` tokens holds at its peak
        (compiler/cost.py's Memory: weights, gradients, Adam's moments, activations, the loss's tensors;
        `trained`, `weight_bytes` and `recomputed` as its `memory` takes them)."""
        from .cost import memory

        return memory(self, batch, length, activation_bytes=activation_bytes, shards=shards, replicas=replicas,
                      trained=trained, weight_bytes=weight_bytes, recomputed=recomputed)

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every learned tensor by its state_dict name (tied copies included)."""
        return dict(self._compilation.validated.params)

    @property
    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every buffer checkpoints keep (not learned, but read by the model), by its state_dict name."""
        return dict(self._compilation.validated.state)

    @property
    def ties(self) -> dict[str, str]:
        return dict(self._compilation.validated.ties)

    def residual_writers(self) -> dict[str, float]:
        """The weights that write into a residual stream, each with 1/sqrt(the stream's residual additions):
        what `train.residual_init = "depth"` scales them by (compiler/residual.py)."""
        from .residual import residual_writers

        return residual_writers(self.ops.nodes, self.graph)

    @property
    def instances(self):
        """The module tree (root instance) that the generated classes follow."""
        return self._compilation.validated.graph.root

    def layer_paths(self) -> list[str]:
        """The paths of the layers of every repeated stack (`decoder.layers.0`, ...), outermost stacks only:
        a stack inside a layer is part of that layer."""
        def under(instance) -> list[str]:
            if instance.kind == "stack":
                return [layer.path for layer in instance.children.values()]
            return [path for child in instance.children.values() for path in under(child)]

        return under(self.instances)

    def count_under(self, path: str) -> int:
        return self._compilation.validated.count_under(path)

    def all_tied_under(self, path: str) -> bool:
        """Whether every learned tensor of the module at `path` is tied to another module's."""
        return self._compilation.validated.all_tied_under(path)

    # --- building ----------------------------------------------------------------------------
    def build(self, device: Union[str, "torch.device", None] = None, compile: bool = False,
              init: bool = True) -> "torch.nn.Module":
        """Instantiate the generated model on `device` (default: CUDA if available, else CPU): built on the
        meta device, then given memory once and initialized, as its constructors would with the same seed.
        `init=False` leaves the learned tensors unset, for a checkpoint to fill (only the tensors modules
        derive are computed). `compile=True` returns torch.compile's wrapper (whose state_dict keys start
        with `_orig_mod.`: save the module you built, not the wrapper)."""
        import torch

        from xspec.nn.initialize import materialized

        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self._check_allocatable(device)
        model_class = self.model_class()
        with torch.device("meta"):
            model = model_class()
        model = materialized(model, device, init=init)
        return cast("torch.nn.Module", torch.compile(model)) if compile else model

    def model_class(self) -> type:
        """The generated nn.Module class, from `python_source`.

        The source runs as a real module, `xspec_generated_<name>_<digest of the source>`, registered in
        `sys.modules` with its text in `linecache`: tracebacks show its lines, and `torch.compile` of
        anything that calls the model can find the module it was defined in. The same source is one
        module, made once."""
        from .codecheck import compile_checked

        digest = hashlib.sha256(self.python_source.encode("utf-8")).hexdigest()[:16]
        name = f"xspec_generated_{self.name}_{digest}"
        module = sys.modules.get(name)
        if module is None:
            filename = f"<xspec:{name}>"
            # Only what passes the AST check runs: the code generator's own constructs (compiler/codecheck.py).
            code = compile_checked(self.python_source, filename)
            linecache.cache[filename] = (len(self.python_source), None, self.python_source.splitlines(True),
                                         filename)
            module = types.ModuleType(name, f"Model '{self.name}', generated by xspec")
            module.__file__ = filename
            exec(code, module.__dict__)
            sys.modules[name] = module
        return module.Model

    def _check_allocatable(self, device: "torch.device") -> None:
        import torch

        needed = self._compilation.validated.bytes_needed  # weights once, tied ones shared, and buffers
        if device.type == "cuda":
            available = torch.cuda.mem_get_info(device)[0]
        else:
            available = _available_host_memory()
        if needed > available:
            raise UserError(f"{self.path}: model '{self.name}' needs {_size(needed)} as float32 "
                            f"({self.parameters:,} parameters and its buffers); only {_size(available)} "
                            f"is free on {device}")

    # --- reports -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        from .summary import summarize

        return summarize(self)

    def graph_json(self) -> str:
        nodes, edges = [], []
        for node in self.ops:
            nodes.append(node.to_json())
            ports: dict[str, list[str]] = {}  # one edge per source, with every port it feeds
            for port, source in node.inputs.items():
                ports.setdefault(source, []).append(port)
            edges += [{"from": source, "to": node.id, "ports": fed} for source, fed in ports.items()]
        return json.dumps({"name": self.name, "nodes": nodes, "edges": edges, "ties": self.ties}, indent=1)

    @property
    def resolved_source(self) -> str:
        """The spec as one self-contained text that compiles to this same model (run directories and
        checkpoints keep it)."""
        return self._compilation.resolved_source

    def with_overrides(self, overrides: Mapping[str, Any]) -> "CompiledSpec":
        """This spec with some parameters or section keys set otherwise, compiled from its resolved source
        (e.g. {"data.vocab_size": 8000})."""
        changed = compile_source(self.resolved_source, name=self.path, overrides=overrides, allow_imports=False)
        changed.overrides = {**self.overrides, **overrides}
        return changed


def compile_file(path: str, overrides: Optional[Mapping[str, Any]] = None) -> CompiledSpec:
    """The spec file at `path`, compiled; `overrides` as in `xspec.compile`."""
    return _compiled(path, overrides, None, True)


def compile_source(text: str, name: str = "<spec>", overrides: Optional[Mapping[str, Any]] = None,
                   allow_imports: bool = True) -> CompiledSpec:
    """The spec `text`, compiled (imports resolve relative to `name`). `allow_imports=False` refuses
    `import` (a spec read from a checkpoint or a run directory is self-contained, and must not reach for
    other files)."""
    return _compiled(name, overrides, text, allow_imports)


def _compiled(path: str, overrides: Optional[Mapping[str, Any]], source: Optional[str],
              allow_imports: bool) -> CompiledSpec:
    """Raises SpecError with every diagnostic found, UserError for a spec file that does not exist."""
    try:
        return CompiledSpec(compile_spec(path, overrides, source, allow_imports), overrides)
    except CompileFailed as failure:
        raise SpecError(failure.diagnostics.render(), failure.diagnostics.records) from None
    except FileNotFoundError as error:
        raise UserError(str(error)) from None


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} bytes"


def _available_host_memory() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
