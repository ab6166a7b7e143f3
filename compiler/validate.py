"""Stage 4, validate: symbolic shape inference and the checks that need shapes.

Shapes flow from the inputs ([batch, src_len] tokens, ...) through the op table's shape rules;
a mismatch is reported at the op that sees it. Then: how each decoder attention uses the cache,
the learned tensors of every module (for parameter counts), weight tying, and whether the model
fits in memory at all.
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Optional, Sequence

from xspec.base.text import printable

from . import ast
from .diagnostics import Diagnostics, Span, did_you_mean
from .graph import BuiltGraph
from .ir import OpGraph
from .ops import OPS, AttentionAttrs, IOAttrs
from .resolve import ResolvedModel
from .entries import LOGITS, MTP, OUTPUTS, TGT, mtp_hidden
from .shapes import BATCH, ShapeError
from .opdef import Family

BYTES_PER_PARAMETER = 4  # float32 weights


@dataclass
class ValidatedModel:
    graph: BuiltGraph
    params: dict[str, tuple[int, ...]]  # "encoder.layers.0.self_attn.q_proj.weight" -> shape
    ties: dict[str, str]  # tied parameter -> the parameter it becomes (never itself tied)
    tie_spans: dict[str, Span]  # tied parameter -> where its tie is written, for comments in generated code
    buffers: dict[str, tuple[int, ...]]  # tensors modules derive when built, e.g. positional tables
    state: dict[str, tuple[int, ...]]  # tensors checkpoints keep but training does not learn (a router's bias)
    # Tied tensors named through a stack without an index (`mtp.embed_tokens.weight`): the tie holds in every
    # layer of the stack, however many the config builds.
    tied_in_every_layer: frozenset[str] = frozenset()

    @property
    def parameter_count(self) -> int:
        return sum(math.prod(s) for name, s in self.params.items() if name not in self.ties)

    @property
    def buffer_elements(self) -> int:
        return sum(math.prod(s) for s in (*self.buffers.values(), *self.state.values()))

    @property
    def bytes_needed(self) -> int:
        """float32 bytes the built model allocates: each learned tensor once (tied ones share), and buffers."""
        return (self.parameter_count + self.buffer_elements) * BYTES_PER_PARAMETER

    def count_under(self, path: str) -> int:
        """Trainable parameters of the module at `path` (tied ones counted where they are owned)."""
        return self._totals.get(path, (0, 0, 0))[0]

    def all_tied_under(self, path: str) -> bool:
        """Whether the module at `path` has learned tensors and all of them are tied to others."""
        _, tensors, tied = self._totals.get(path, (0, 0, 0))
        return tensors > 0 and tied == tensors

    @cached_property
    def _totals(self) -> dict[str, tuple[int, int, int]]:
        """Module path -> (untied parameters, learned tensors, tied tensors) under it, for every module
        that holds any: one pass, so reports over thousands of modules stay linear."""
        totals: dict[str, list[int]] = {}
        for name, shape in self.params.items():
            tied = name in self.ties
            parts = name.split(".")
            for end in range(1, len(parts)):
                entry = totals.setdefault(".".join(parts[:end]), [0, 0, 0])
                entry[0] += 0 if tied else math.prod(shape)
                entry[1] += 1
                entry[2] += tied
        return {path: (count, tensors, tied) for path, (count, tensors, tied) in totals.items()}


def validate(model: ResolvedModel, built: BuiltGraph, diagnostics: Diagnostics) -> Optional[ValidatedModel]:
    _check_producers(built.graph, diagnostics)
    _infer_shapes(built.graph, diagnostics)
    if diagnostics.errors:
        return None
    _check_outputs(built.graph, diagnostics)
    _attention_roles(built.graph, diagnostics)
    params = _module_tensors(built.graph, "params")
    ties, tie_spans, every_layer = check_ties(model.ties, params, diagnostics)
    validated = ValidatedModel(built, params, ties, tie_spans, _module_tensors(built.graph, "buffers"),
                               _module_tensors(built.graph, "state"), every_layer)
    _check_fits_in_memory(model, validated, diagnostics)
    lint(built.graph)
    return None if diagnostics.errors else validated


def lint(graph: OpGraph) -> None:
    """Invariants of the graph that the builder and every pass must keep (bugs, not user errors)."""
    made: set[str] = set()
    for node in graph:
        assert set(node.inputs.values()) <= made, f"{node.id} reads a node made after it"
        made.add(node.id)
        op = OPS[node.op]
        ports = set(node.inputs)
        expected = {i.name for i in op.inputs}
        required = {i.name for i in op.inputs if not i.optional}
        assert required <= ports <= expected, f"{node.id}: inputs {ports}, op {op.name} takes {expected}"
        assert isinstance(node.attrs, op.attrs), f"{node.id}: attributes are not {op.attrs.__name__}"


def _infer_shapes(graph: OpGraph, diagnostics: Diagnostics) -> None:
    for node in graph:  # inputs first: nodes are made after the nodes they read
        if node.op == "input":
            continue
        shapes = {port: shape for port, source in node.inputs.items() if (shape := graph[source].shape) is not None}
        if len(shapes) != len(node.inputs):
            continue  # an input already failed; its error is reported
        try:
            node.shape, node.inferred = OPS[node.op].infer(shapes, node.attrs)
        except ShapeError as error:
            origins = [f"{port} is {_origin(graph, source)}" for port, source in node.inputs.items()]
            diagnostics.error("shape", node.span, str(error), "; ".join(origins))


def _check_outputs(graph: OpGraph, diagnostics: Diagnostics) -> None:
    """The encoder returns [batch, src_len, d_model] and the decoder [batch, tgt_len, vocab], both float:
    the runtime, and the model's vocabulary size and width, are read off these shapes."""
    for output in OUTPUTS:
        entry, name, length, size = f"the {output.entry}", output.name, output.length, output.size
        node = graph.nodes.get(output.node)
        if node is None or node.shape is None:
            continue
        shape = node.shape
        dims = shape.dims
        if shape.dtype != "float" or len(dims) != 3 or dims[:2] != (BATCH, length) or not isinstance(dims[2], int):
            diagnostics.error("shape", node.span, f"{entry} must return {name} of shape [{BATCH}, {length}, "
                              f"{size}], got {shape}")
    hidden = graph.nodes.get(mtp_hidden(0).node)
    logits = graph.nodes.get(LOGITS.node)
    if hidden is None or hidden.shape is None or logits is None:
        return
    head = graph[logits.inputs["x"]]
    if head.module is None:
        diagnostics.error("signature", hidden.span, "block mtp predicts with the module that makes the logits: "
                          f"the decoder must return that module's output, not {head.op}'s")
        return
    read = graph[next(iter(head.inputs.values()))].shape if head.inputs else None
    if read is not None and read != hidden.shape:
        diagnostics.error("shape", hidden.span, f"block mtp reads the states the output head reads, {read}, "
                          f"but gets {hidden.shape}: d_model must be the width of those states")
    for node in graph:
        if node.op == "output" and node.attrs_as(IOAttrs).name.startswith("mtp_") and node.shape is not None \
                and node.shape != hidden.shape:
            diagnostics.error("shape", node.span, f"block mtp must return the states the output head reads, "
                              f"{hidden.shape}, got {node.shape}")


def _origin(graph: OpGraph, node_id: str) -> str:
    """Where a value is made, for messages: 'w_2 (linear) at ffn.xspec:5:12'."""
    node = graph[node_id]
    if node.op == "input":
        return f"the input '{node.attrs_as(IOAttrs).name}'"
    span = node.span
    return f"{node_id.rsplit('.', 1)[-1]} ({node.op}) at {printable(Path(span.file).name)}:{span.line}:{span.col}"


def _check_producers(graph: OpGraph, diagnostics: Diagnostics) -> None:
    """Each op's rules over the ops that feed it (OpDef.reads)."""
    for node in graph:
        producers = {port: (graph[source].op, graph[source].attrs) for port, source in node.inputs.items()}
        for argument, message in OPS[node.op].reads(node.attrs, producers):
            diagnostics.error("value", node.span, f"{node.op}: {argument}: {message}")


def _attention_roles(graph: OpGraph, diagnostics: Diagnostics) -> None:
    """Each attention's role, decided once here: self-attention (its keys are its queries) or not; and
    in the decoder, how the cache serves it: self-attention appends to it each step, attention whose
    keys and values do not depend on the target (the encoder output) computes them once."""
    for node in graph:
        if OPS[node.op].family == Family.ATTENTION:
            # Latent attention has one input: causal self-attention over it.
            node.inferred["self_attention"] = "key" not in node.inputs or node.inputs["key"] == node.inputs["query"]
            positional = [name for name in ("causal", "rotary", "alibi", "window")
                          if getattr(node.attrs, name, None) not in (False, None)]
            if positional and not node.inferred["self_attention"]:
                what = f"{positional[0]} = true" if positional[0] != "window" else "a sliding window"
                diagnostics.error("attention-positions", node.span, f"{what} needs self-attention: "
                                  "it relates a query to the keys of its own sequence by position",
                                  "pass the same tensor as query and key, or drop it from this attention")
            if getattr(node.attrs, "fused_qkv", False) and \
                    not node.inputs["query"] == node.inputs["key"] == node.inputs["value"]:
                diagnostics.error("attention-fused", node.span, "fused_qkv = true projects queries, keys and "
                                  "values from one tensor, but this attention's differ",
                                  "pass the same tensor as query, key and value, or drop fused_qkv")
    target = TGT.node
    if target not in graph:
        return
    depends_on_target = graph.descendants(target) | {target}
    for node in graph:
        if OPS[node.op].family != Family.ATTENTION or not node.cached:
            continue
        sources = node.inputs
        if "key" not in sources:
            node.inferred["kv_cache"] = "append"
        elif sources["key"] == sources["query"] == sources["value"]:
            if not node.attrs_as(AttentionAttrs).causal:
                diagnostics.error("decoder-attention", node.span, "decoder self-attention must be causal",
                                  "pass causal = true: a position may not attend to later ones (§3.2.3)")
            node.inferred["kv_cache"] = "append"
        elif sources["key"] in depends_on_target or sources["value"] in depends_on_target:
            diagnostics.error("decoder-attention", node.span, "keys and values that depend on the target "
                              "must be the queries themselves (self-attention) to decode step by step")
        else:
            node.inferred["kv_cache"] = "static"
        if node.scope.split(".")[0] == MTP and node.inferred.get("kv_cache") == "append":
            node.inferred["kv_cache"] = "draft"  # multi-token prediction's: appends only while it drafts


def _module_tensors(graph: OpGraph, kind: str) -> dict[str, tuple[int, ...]]:
    """The learned tensors (`kind="params"`), buffers or kept state of every module, by state_dict-style path."""
    tensors: dict[str, tuple[int, ...]] = {}
    for node in graph:
        if node.module is None:
            continue
        for name, shape in getattr(OPS[node.op], kind)(node.attrs, node.inferred).items():
            tensors[f"{node.module}.{name}"] = shape
    return tensors


def check_ties(ties_written: Sequence[ast.Tie], params: dict[str, tuple[int, ...]],
               diagnostics: Diagnostics) -> tuple[dict[str, str], dict[str, Span], frozenset[str]]:
    """`tie a, b, c`: b and c become a. Ties chain and merge (`tie a, b` then `tie c, a` makes one
    group of three); each group keeps one tensor, its first owner's, so it is counted and allocated
    once, whatever the order or cycles of the `tie` statements. Modules tie tensor by tensor, and one
    stack (`tie encoder.layers`) ties every layer to its first (_tensor_groups)."""
    owner_of: dict[str, str] = {}  # tensor -> the tensor its group has become so far

    def root(path: str) -> str:
        while path in owner_of:
            path = owner_of[path]
        return path

    spans: dict[str, Span] = {}
    every_layer: set[str] = set()
    index = _TensorIndex(params)
    for tie in ties_written:
        for (owner, _), *others in _tensor_groups(tie, index, diagnostics):
            for path, written in others:
                if params[path] != params[owner]:
                    diagnostics.error("tie-shape", written.span, f"cannot tie '{path}' of shape "
                                      f"{list(params[path])} to '{owner}' of shape {list(params[owner])}")
                    continue
                kept, merged = root(owner), root(path)
                if kept != merged:
                    owner_of[merged] = kept
                    spans[merged] = written.span
                    if path == merged and not (path + ".").startswith(f"{written}."):  # _every_layer's
                        every_layer.add(path)
    ties = {path: root(path) for path in owner_of}
    return ties, {path: spans[path] for path in ties}, frozenset(every_layer)


TieGroup = list[tuple[str, ast.Path]]  # tensors that become one, each with the path that named it


class _TensorIndex:
    """The learned tensors, sorted, so those under a module are found by bisection: a tie of a stack of
    10,000 layers, or of thousands of modules, costs what it finds, not a scan of every tensor each."""

    def __init__(self, params: dict[str, tuple[int, ...]]) -> None:
        self.params = params
        self.names = sorted(params)

    def under(self, module: str) -> dict[str, str]:
        """Tensors under `module`, by their name relative to it."""
        prefix = module + "."
        found: dict[str, str] = {}
        i = bisect.bisect_left(self.names, prefix)
        while i < len(self.names) and self.names[i].startswith(prefix):
            found[self.names[i][len(prefix):]] = self.names[i]
            i += 1
        return found

    @cached_property
    def paths(self) -> list[str]:
        """Every tensor and module path, for suggestions."""
        modules = {t.rsplit(".", i)[0] for t in self.names for i in range(1, t.count(".") + 1)}
        return sorted(modules | set(self.names))


def _every_layer(path: str, index: _TensorIndex) -> list[str]:
    """`path`, or where it names nothing but would in every layer of a stack it passes through without an
    index (`mtp.embed_tokens.weight` of the stack `mtp`), that path in each layer (`mtp.0.embed_tokens.weight`,
    `mtp.1...`): a tensor every layer shares with another module."""
    if path in index.params or index.under(path):
        return [path]
    parts = path.split(".")
    for cut in range(1, len(parts)):
        stack, rest = ".".join(parts[:cut]), ".".join(parts[cut:])
        layers = sorted({int(r.split(".", 1)[0]) for r in index.under(stack) if r.split(".", 1)[0].isdigit()})
        each = [f"{stack}.{layer}.{rest}" for layer in layers]
        if layers and all(p in index.params or index.under(p) for p in each):
            return each
    return [path]


def _tensor_groups(tie: ast.Tie, index: _TensorIndex, diagnostics: Diagnostics) -> list[TieGroup]:
    """The tensors a `tie` makes one, group by group: `tie a.weight, b.weight` is one group; `tie a, b` of
    two modules holding the same tensors is one group per tensor (a.weight with b.weight, ...); `tie s`
    of one stack is `tie s.0, s.1, ...`: every layer shares the first one's tensors (ALBERT's sharing); a path
    through a stack without an index names that path in every layer (`_every_layer`)."""
    params = index.params
    named = [(path, p, {} if path in params else index.under(path)) for p in tie.paths
             for path in _every_layer(str(p), index)]
    unknown = [(path, written) for path, written, tensors in named if path not in params and not tensors]
    for path, written in unknown:
        diagnostics.error("unknown-name", written.span, f"no learned tensor or module '{path}' to tie",
                          did_you_mean(path, index.paths))
    if unknown:
        return []
    if len(named) == 1:
        (stack, written, tensors), = named
        layers: dict[int, dict[str, str]] = {}
        for relative, tensor in tensors.items():
            layer, _, name = relative.partition(".")
            if layer.isdigit():
                layers.setdefault(int(layer), {})[name] = tensor
        if stack in params or len(layers) < 2:
            diagnostics.error("tie", written.span, f"'{stack}' is not a stack of layers",
                              "tie one repeated stack (its layers share the first's tensors), or two or more "
                              "tensors or modules")
            return []
        named = [(f"{stack}.{i}", written, layers[i]) for i in sorted(layers)]
    if all(path in params for path, _, _ in named):
        return [[(path, written) for path, written, _ in named]]
    first, _, first_tensors = named[0]
    for path, written, tensors in named:
        if set(tensors) != set(first_tensors):
            names = sorted(set(tensors) ^ set(first_tensors))
            differ = "one is a tensor" if not tensors else ", ".join(names[:4]) + (
                f" and {len(names) - 4} more" if len(names) > 4 else "")
            diagnostics.error("tie", written.span, f"cannot tie '{path}' to '{first}': tied modules must hold the "
                              f"same tensors (they differ in: {differ})")
            return []
    return [[(tensors[name], written) for _, written, tensors in named] for name in sorted(first_tensors)]


def _check_fits_in_memory(model: ResolvedModel, validated: ValidatedModel, diagnostics: Diagnostics) -> None:
    """Refuse, with the count, a model whose weights and buffers alone exceed this machine's memory."""
    needed = validated.bytes_needed
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > available:
        what = f"{validated.parameter_count:,} parameters"
        if validated.buffer_elements:
            what += f" and {validated.buffer_elements:,} buffer elements"
        diagnostics.error("too-large", model.span, f"model '{model.name}' has {what} ({needed / 2**30:,.1f} GiB "
                          f"as float32), more than this machine's {available / 2**30:,.1f} GiB of memory")

