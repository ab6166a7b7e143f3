"""Stage 3, graph: expand the entry blocks into an op graph of typed nodes (compiler/ir.py).

The builder interprets block bodies: each op call becomes a node (attributes checked by the op's
pydantic schema), each block call and `repeat` becomes a child in a tree of `Instance`s (the
module hierarchy that lowering turns into classes), and every layer of a stack is expanded so
that each gets its own weights. Node ids are the module paths the PyTorch model will have:
`encoder.layers.3.self_attn`. As it goes, the builder records each module's program (the steps
of its forward, compiler/ir.py), which is all lowering reads: the AST stays here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional, TypeGuard, Union, get_args

import pydantic

from xspec.base.text import printable

from . import ast
from .diagnostics import Diagnostics, Span, did_you_mean
from .evaluate import MATH_FUNCTIONS, Constant, ConstantError, InexactQuotient, describe, evaluate
from .config import config_expression, config_fields
from .body import (assigned, bound_names, cache_blocks, call_site_names, free_names, passed_through, reads,
                   single_block_call, stmt_reads, subexpressions, token_type_blocks, warn_unused)
from .entries import (DECODER, ENCODER, LOGITS, MEMORY, MTP, MTP_DEPTH, MTP_TOKENS, SIGNATURES, SRC, SRC_MASK, TGT,
                      GraphInput, GraphOutput, mtp_hidden, mtp_output, takes_cache)
from .inline import inline_called_once
from .ir import Const, Instance, Node, OpGraph, Operand, Program, Step
from .limits import MAX_MODULES, MAX_NESTING, MAX_REPEAT, Budget, LimitExceeded
from .names import local_name_problem, module_name_problem
from .ops import OPS, Attrs, IOAttrs, OpDef, callable_op
from .resolve import ResolvedModel

TENSOR_OPERATORS = {"+": "add", "-": "sub", "*": "mul"}  # elementwise, between two tensors

# --- values the interpreter passes around --------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    node: str  # the graph node that computes it
    ref: str  # the value in the program that reads it (a block's argument is a new value of the same node)


@dataclass(frozen=True)
class Closure:
    fn: ast.Lambda
    env: dict
    owner: Instance
    decoding: bool
    step: Step  # the step that defines it, in its owner's program: the body is recorded there once called
    ref: str


class Poison:
    """The value of an expression that had an error; uses of it report nothing more."""


POISON = Poison()
Value = Union[Tensor, Closure, Poison, Constant]


def _is_runtime(value: object) -> TypeGuard[Union[Tensor, Closure]]:
    return isinstance(value, (Tensor, Closure))


def _as(value: Value, ref: str) -> Value:
    """The same tensor or function as a new value of a program (a forward's argument, a call's result)."""
    if isinstance(value, Tensor):
        return Tensor(value.node, ref)
    if isinstance(value, Closure):
        return Closure(value.fn, value.env, value.owner, value.decoding, value.step, ref)
    return value


def _operand(value: Value) -> Operand:
    return value.ref if _is_runtime(value) else Const(value)


@dataclass
class BuiltGraph:
    graph: OpGraph
    root: Instance  # children: "encoder" and/or "decoder"
    tensors: dict[str, str]  # each tensor value of the programs (its ref) -> the node that computes it


class _Frame:
    def __init__(self, instance: Instance, env: dict, names: dict[int, str], decoding: bool,
                 program: Program) -> None:
        # `decoding`: inside the decoder, where attention and positions continue from the cache.
        # `program`: where the steps it evaluates go (the instance's forward, a function's body, a loop's).
        self.instance, self.env, self.names, self.decoding = instance, env, names, decoding
        self.program = program


class _Return(Exception):
    def __init__(self, value: Value) -> None:
        self.value = value


def build_graph(model: ResolvedModel, diagnostics: Diagnostics,
                forced: Mapping[int, bool] = MappingProxyType({})) -> Optional[BuiltGraph]:
    """The op graph and module tree of `model`. `forced`: `if` statements (by id) that take the branch given
    wherever they run, whatever their condition; lowering builds the branches no layer takes so."""
    builder = _Builder(model, diagnostics, forced)
    try:
        root = builder.run()
    except LimitExceeded as limit:
        diagnostics.error(limit.code, limit.span, limit.message, limit.hint)
        return None
    if diagnostics.errors:
        return None
    inline_called_once(root)
    return BuiltGraph(builder.graph, root, builder.tensors)


class _Builder:
    def __init__(self, model: ResolvedModel, diagnostics: Diagnostics, forced: Mapping[int, bool]) -> None:
        self.model, self.diagnostics, self.forced = model, diagnostics, forced
        self.graph = OpGraph()
        self.tensors: dict[str, str] = {}  # ref -> node, for every tensor value the programs name
        self.config = config_fields(model.params)
        self.names: dict[int, str] = {}
        self.call_stack: list[str] = []
        self.counters: dict[tuple[str, str], itertools.count] = {}
        self.stack_frames: list[tuple[str, int, int]] = []  # (stack path, index, count)
        # Functions made and never called, by instance: one called where another block made it is still
        # uncalled here (and has no ops here to lower).
        self.uncalled: dict[tuple[str, int], ast.Lambda] = {}
        self.claims: dict[tuple[str, str], int] = {}  # (instance path, child name) -> id(the call that made it)
        self.serial = itertools.count(1)  # numbers the refs of functions and of their calls' results
        for block in model.blocks.values():
            self.names.update(call_site_names(block.body, model.blocks))
            warn_unused(block, diagnostics)
        # Ops without weights are numbered (`add_1`); the numbers skip every module name, so a label
        # such as `as add_1` never gives two nodes one id.
        self.module_names = set(self.names.values())
        # Blocks the decoder uses that hold cache-aware ops take the cache in forward().
        self.cache_blocks = cache_blocks(DECODER, model.blocks)
        # Blocks the encoder uses that hold ops reading token types take them in forward().
        self.token_type_blocks = token_type_blocks(ENCODER, model.blocks)
        self.budget = Budget()
        self.nesting = 0  # block calls, function calls and expressions being evaluated
        self._check_names()

    def _as(self, value: Value, ref: str) -> Value:
        """`value` as the program value `ref`, remembering which node a tensor's ref reads."""
        if isinstance(value, Tensor):
            self.tensors[ref] = value.node
        return _as(value, ref)

    # --- entries ----------------------------------------------------------------------------
    def run(self) -> Instance:
        root = Instance(path="", kind="block", span=self.model.span)
        encoder, decoder = self.model.blocks.get(ENCODER), self.model.blocks.get(DECODER)
        if encoder is None and decoder is None:
            self.diagnostics.error("missing", self.model.span, f"model '{self.model.name}' has no "
                                   "'encoder' or 'decoder' block", "define block decoder(tokens) for a language model")
            return root
        memory: Value = POISON
        src_mask: Value = POISON
        if encoder is not None and self._check_entry(encoder):
            src = self._input(SRC, encoder.params[0].span)
            src_mask = self._input(SRC_MASK, encoder.params[1].span)
            memory = self._entry(root, encoder, [src, src_mask])
            self._output(MEMORY, memory, encoder.span)
        if decoder is not None and self._check_entry(decoder):
            tgt = self._input(TGT, decoder.params[0].span)
            if len(decoder.params) == 3 and encoder is None:
                self.diagnostics.error("signature", decoder.name.span, f"decoder{SIGNATURES[DECODER][3]} needs an "
                                       "encoder block", "a language model's decoder takes only its tokens")
                return root
            if len(decoder.params) == 1 and encoder is not None:
                self.diagnostics.error("signature", decoder.name.span, "the decoder must take "
                                       f"{SIGNATURES[DECODER][3]} to use the encoder")
                return root
            args: list[Value] = [tgt, memory, src_mask] if encoder is not None else [tgt]
            logits = self._entry(root, decoder, args)
            self._output(LOGITS, logits, decoder.span)
        mtp = self.model.blocks.get(MTP)
        if mtp is not None and self._check_entry(mtp):
            self._multi_token_prediction(root, mtp, language_model=decoder is not None and encoder is None)
        for fn in self.uncalled.values():
            self.diagnostics.warning("unused", fn.span, "this function is never called, so its ops are not "
                                     "part of the model")
        return root

    def _multi_token_prediction(self, root: Instance, block: ast.Block, language_model: bool) -> None:
        """`mtp_depth` instances of the `mtp` block in a stack, each reading the state the one before it
        returns (the first: the state the output head reads) and the tokens (DeepSeek-V3 §2.2)."""
        if not language_model:
            self.diagnostics.error("signature", block.name.span, "block mtp predicts tokens further ahead for a "
                                   "language model: the model needs block decoder(tokens) and no encoder")
            return
        depth, width = self.model.params.get(MTP_DEPTH, 1), self.model.params.get("d_model")
        if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= MAX_REPEAT:
            self.diagnostics.error("repeat-count", block.name.span, f"{MTP_DEPTH} counts the depths of multi-token "
                                   f"prediction: a whole number from 0 to {MAX_REPEAT:,}, got {depth!r}")
            return
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            self.diagnostics.error("missing", block.name.span, "block mtp reads the states the output head reads, "
                                   "of d_model features: the model needs param d_model, a whole number")
            return
        if depth == 0:
            return
        count = ast.Name(MTP_DEPTH, block.name.span)
        stack = Instance(path=MTP, kind="stack", span=block.span,
                         count_source=config_expression(count, depth, self.config, lambda name: None))
        root.children[MTP] = stack
        hidden: Value = self._input(mtp_hidden(width), block.params[0].span)
        tokens = self._input(MTP_TOKENS, block.params[1].span)
        for index in range(depth):
            instance = Instance(path=f"{MTP}.{index}", kind="block", span=block.span, block_name=MTP,
                                block_span=block.span, has_cache=True)
            stack.children[str(index)] = instance
            self.stack_frames.append((stack.path, index, depth))
            try:
                hidden = self._run_block(instance, block, [hidden, tokens], decoding=True)
            finally:
                self.stack_frames.pop()
            self._output(mtp_output(index), hidden, block.span)

    def _check_entry(self, block: ast.Block) -> bool:
        signatures = SIGNATURES[block.name.id]
        if len(block.params) not in signatures:
            expected = " or ".join(signatures.values())
            self.diagnostics.error("signature", block.name.span,
                                   f"block '{block.name.id}' must take {expected}")
            return False
        return True

    def _entry(self, root: Instance, block: ast.Block, args: list[Value]) -> Value:
        instance = Instance(path=block.name.id, kind="block", span=block.span, block_name=block.name.id,
                            block_span=block.span, has_cache=takes_cache(block.name.id),
                            has_token_types=block.name.id == ENCODER and ENCODER in self.token_type_blocks)
        root.children[block.name.id] = instance
        return self._run_block(instance, block, args, decoding=takes_cache(block.name.id))

    def _input(self, graph_input: GraphInput, span: Span) -> Tensor:
        node = self.graph.add(Node(graph_input.node, "input", IOAttrs(name=graph_input.name, kind=graph_input.kind),
                                   {}, span, module=None, scope="", shape=graph_input.type))
        return Tensor(node.id, node.id)

    def _output(self, output: GraphOutput, value: Value, span: Span) -> None:
        if isinstance(value, Tensor):
            self.graph.add(Node(output.node, "output", IOAttrs(name=output.name, kind="output"), {"x": value.node},
                                span, module=None, scope=""))
        elif not isinstance(value, Poison):
            self.diagnostics.error("type", span, f"the {output.name} must be a tensor, got {describe(value)}")

    # --- blocks -----------------------------------------------------------------------------
    def _run_block(self, instance: Instance, block: ast.Block, args: list[Value], decoding: bool) -> Value:
        if block.name.id in self.call_stack:
            cycle = " -> ".join((*self.call_stack[self.call_stack.index(block.name.id):], block.name.id))
            self.diagnostics.error("cycle", block.name.span, f"blocks call each other in a cycle: {cycle}")
            return POISON
        self.call_stack.append(block.name.id)
        # forward() takes the tensors and functions; constants are written into the block's class.
        env: dict[str, Value] = {p.id: self._as(value, f"{instance.path}:in:{p.id}")
                                 for p, value in zip(block.params, args)}
        program = instance.program
        program.params = {name: value.ref for name, value in env.items() if _is_runtime(value)}
        frame = _Frame(instance, env, self.names, decoding, program)
        try:
            self._exec(block.body, frame)
            self.diagnostics.error("missing", block.name.span, f"block '{block.name.id}' does not return a value")
            result: Value = POISON
        except _Return as ret:
            result = ret.value
        finally:
            self.call_stack.pop()
        program.results = () if isinstance(result, Poison) else (_operand(result),)
        instance.result_node = result.node if isinstance(result, Tensor) else None
        return result

    def _exec(self, body: tuple[ast.Stmt, ...], frame: _Frame) -> None:
        for stmt in body:
            if isinstance(stmt, ast.If):
                condition = self._constant(stmt.condition, frame, "an if condition")
                if isinstance(condition, bool):
                    taken = self.forced.get(id(stmt), condition)
                    self._exec(stmt.then if taken else stmt.orelse, frame)
                    continue
                if not isinstance(condition, Poison):
                    self._error("type", stmt.condition.span, f"an if condition must be true or false, got "
                                f"{describe(condition)}")
                for name in assigned(stmt.then + stmt.orelse):  # reported: their uses say nothing more
                    frame.env[name] = POISON
                continue
            self.budget.step(stmt.span)
            if isinstance(stmt, ast.Assign):
                value = frame.env[stmt.target.id] = self._eval(stmt.value, frame)
                if _is_runtime(value):
                    frame.program.hint(value.ref, stmt.target.id)
            elif isinstance(stmt, ast.Return):
                raise _Return(self._eval(stmt.value, frame))
            else:
                self._repeat(stmt, frame)

    def _repeat(self, stmt: ast.Repeat, frame: _Frame) -> None:
        count = self._constant(stmt.count, frame, "a repeat count")
        if isinstance(count, Poison):
            return
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            self._error("repeat-count", stmt.count.span,
                        f"a repeat count must be a whole number of at least 1, got {count!r}")
            return
        if count > MAX_REPEAT:
            self._error("too-large", stmt.count.span, f"a repeat count of {count:,} is more than the limit of "
                        f"{MAX_REPEAT:,} layers")
            return
        name = frame.names[id(stmt)]
        if not self._claim(frame.instance, name, stmt):
            return
        # The count as the spec wrote it (`repeat layers`: config.layers), never a parameter of the same value.
        stack = Instance(path=_join(frame.instance.path, name), kind="stack", span=stmt.span,
                         count_source=config_expression(stmt.count, count, self.config, frame.env.get))
        self.budget.module(stmt.span)
        frame.instance.children[name] = stack
        single = single_block_call(stmt, self.model.blocks)
        if single is not None and stmt.index is not None and not self._same_call_in_every_layer(single[0], stmt, frame):
            single = None  # the layers' calls differ by more than constants: each layer runs its own body
        if single is not None and stmt.index is not None:
            stack.index_param = _index_parameter(single[0], self.model.blocks[single[0].callee.id], stmt.index.id)
        carried = tuple(v for v in assigned(stmt.body) if v in frame.env)
        watched = (single[1],) if single is not None else carried
        # What the layers carry is one local of the loop, a value of its own: the body reads it, not the
        # value before the loop (which another name may hold too, and keep).
        entry = {n: frame.env[n].ref for n in watched if _is_runtime(frame.env.get(n))}
        loop_refs = {n: f"{stack.path}:loop:{n}" for n in entry}
        for carried_name, ref in loop_refs.items():
            frame.env[carried_name] = self._as(frame.env[carried_name], ref)
        inputs = tuple(v for v in free_names(stmt.body) if _is_runtime(frame.env.get(v)))
        # A layer returns what it carries; one it may not assign (in an if's other branch) it must receive.
        inputs += tuple(v for v in passed_through(stmt.body, carried) if v not in inputs)
        visible = {n: frame.env[n] for s in stmt.body for n in stmt_reads(s) if n in frame.env}
        visible.update((n, frame.env[n]) for n in carried)
        # The code is one loop over the layers; the first layer's iteration is its body. The others are
        # recorded nowhere: they compute the same steps with their own layer.
        loop = Program()
        first: dict[str, str] = {}
        modules_before = self.budget.modules  # what the layer being built starts from
        for index in range(count):
            iteration = loop if index == 0 else Program()
            before = {n: frame.env[n] for n in watched if _is_constant(frame.env.get(n))}
            if index == 1 and single is not None and stmt.index is None:
                self._refuse_if_too_large(stmt, count, self.budget.modules - modules_before)
            modules_before = self.budget.modules
            self.stack_frames.append((stack.path, index, count))
            try:
                if single is not None:
                    call, target = single
                    # The layer's index is a constant of its call (each layer's class holds its own).
                    env = frame.env if stmt.index is None else {**frame.env, stmt.index.id: index}
                    called_from = _Frame(frame.instance, env, frame.names, frame.decoding, iteration)
                    value = self._call_block(call, called_from, instance_name=f"{name}.{index}", parent=stack)
                    frame.env[target] = value
                else:
                    self._repeat_body(stmt, frame, stack, index, inputs, carried, visible, iteration)
            finally:
                self.stack_frames.pop()
            # Layers that differ are each a class of their own in generated code: a constant changing in
            # every layer (`n = n + 1`) would make thousands of them.
            for carried_name, old in before.items():
                new = frame.env.get(carried_name)
                if _is_constant(new) and (type(new) is not type(old) or new != old):
                    self._error("value", stmt.span, f"layer {index} of this repeat changes '{carried_name}' from "
                                f"{old!r} to {new!r}: the layers run one body, so a constant they carry may not change",
                                "compute what it chooses before the repeat, or pass it to a block")
                    return
            now = {n: frame.env[n].ref for n in watched if _is_runtime(frame.env.get(n))}
            if index == 0:
                first = now
            elif any(isinstance(frame.env.get(n), Poison) for n in watched):
                return  # reported where it went wrong: what the layers carry says nothing more
            elif now.keys() != first.keys():
                changed = next(iter(now.keys() ^ first.keys()))
                self._error("value", stmt.span, f"layer {index} of this repeat leaves '{changed}' "
                            f"{'a constant' if changed in first else 'a tensor or function'}, and layer 0 does not: "
                            "the layers run one loop, so what they carry must be of one kind")
                frame.env[changed] = POISON  # reported: its uses say nothing more
                return
        last = {n: frame.env[n].ref for n in watched if n in first}
        # A value the layers only assign (`y = relu(x)`) needs no name before the loop.
        read = loop.reads()
        looped = {n: ref for n, ref in loop_refs.items() if ref in read}
        frame.program.steps.append(Step("stack", name, {}, tuple(last.values()), stmt.span, body=loop, carried=tuple(
            (entry[n] if n in looped else None, looped.get(n), first[n], last[n]) for n in last)))
        for carried_name, ref in last.items():
            frame.program.hint(ref, carried_name)

    def _refuse_if_too_large(self, stmt: ast.Repeat, count: int, per_layer: int) -> None:
        """Layers that are one call without an index make as many ops each as the first: refuse a stack whose
        layers would pass the bound at once, rather than after expanding up to it."""
        if self.budget.modules + (count - 1) * per_layer > MAX_MODULES:
            raise LimitExceeded(stmt.count.span, f"the model expands to more than {MAX_MODULES:,} ops and modules",
                                f"a repeat of {count:,} layers of {per_layer:,} ops and modules each")

    def _same_call_in_every_layer(self, call: ast.Call, stmt: ast.Repeat, frame: _Frame) -> bool:
        """Whether the one block call of an indexed repeat runs the same steps in every layer: the index
        may choose constants of the layer's class, but no function may be made there (a layer may call
        it or not, by its index, and the loop's one body passes what the first layer's did)."""
        assert stmt.index is not None
        arguments = (*call.args, *(k.value for k in call.kwargs))
        if any(isinstance(e, ast.Lambda) for a in arguments for e in subexpressions(a)):
            return False
        return self._constant_where_indexed(call, stmt.index.id, frame)

    def _constant_where_indexed(self, call: ast.Call, index: str, frame: _Frame) -> bool:
        """Whether every argument of a repeat's one block call that reads the layer index is a constant
        (then the layers differ in their classes only, and one loop line calls them all)."""
        for arg in (*call.args, *(k.value for k in call.kwargs)):
            names = reads(arg)
            if index not in names:
                continue
            def constant(name: str) -> bool:
                if name in frame.env:
                    return not isinstance(frame.env[name], (Tensor, Closure))
                return name == index or name in MATH_FUNCTIONS or name in self.model.params

            if isinstance(arg, ast.Lambda) or not all(constant(n) for n in names):
                return False
        return True

    def _repeat_body(self, stmt: ast.Repeat, frame: _Frame, stack: Instance, index: int, inputs: tuple[str, ...],
                     carried: tuple[str, ...], visible: dict[str, Value], iteration: Program) -> None:
        """One layer of a repeat whose body is not a single block call: a module of its own, which takes the
        values the body reads and returns the tensors and functions it carries to the next layer."""
        body = Instance(path=f"{stack.path}.{index}", kind="block", span=stmt.span, has_cache=frame.instance.has_cache,
                        has_token_types=frame.instance.has_token_types)
        self.budget.module(stmt.span)
        stack.children[str(index)] = body
        # The body sees the values it reads; carried ones as the previous layer left them.
        outer = {**visible, **{n: frame.env[n] for n in carried}}
        arguments = {n: outer[n] for n in inputs if _is_runtime(outer.get(n))}
        env = {**outer, **{n: self._as(value, f"{body.path}:in:{n}") for n, value in arguments.items()}}
        body.program.params = {n: env[n].ref for n in arguments}
        if stmt.index is not None:
            env[stmt.index.id] = index
        inner = _Frame(body, env, frame.names, frame.decoding, body.program)
        try:
            self._exec(stmt.body, inner)
        except _Return:
            self._error("syntax", stmt.span, "'return' cannot appear inside 'repeat'")
        returned = [n for n in carried if _is_runtime(inner.env.get(n))]
        body.program.results = tuple(inner.env[n].ref for n in returned)
        for name in carried:
            frame.env[name] = self._as(inner.env[name], f"{body.path}:out:{name}")
        iteration.steps.append(Step("layer", "", {n: v.ref for n, v in arguments.items()},
                                    tuple(frame.env[n].ref for n in returned), stmt.span))

    def _call_block(self, call: ast.Call, frame: _Frame, instance_name: Optional[str] = None,
                    parent: Optional[Instance] = None) -> Value:
        """A block call: a child module. As a layer of a stack (`parent`), the step calls the loop's layer."""
        block = self.model.blocks[call.callee.id]
        args = self._bind_block_args(block, call, frame)
        if args is None:
            return POISON
        name = instance_name or frame.names[id(call)]
        owner = parent or frame.instance
        path = _join(frame.instance.path, name)
        given = {**dict(zip((p.id for p in block.params), call.args)), **{kw.name: kw.value for kw in call.kwargs}}
        constants: dict[str, tuple[ast.Expr, object]] = {
            p.id: (given[p.id], value) for p, value in zip(block.params, args) if not _is_runtime(value)}
        child = Instance(path=path, kind="block", span=call.span, block_name=block.name.id, block_span=block.span,
                         has_cache=block.name.id in self.cache_blocks,
                         has_token_types=block.name.id in self.token_type_blocks, constant_args=constants)
        key = name.rsplit(".", 1)[-1]
        if not self._claim(owner, key, call):
            return POISON
        self.budget.module(call.span)
        owner.children[key] = child
        result = self._as(self._run_block(child, block, args, frame.decoding), f"{path}:out")
        inputs: dict[str, Operand] = {p.id: value.ref for p, value in zip(block.params, args) if _is_runtime(value)}
        outputs = (result.ref,) if _is_runtime(result) else ()
        frame.program.steps.append(Step("layer" if parent else "block", "" if parent else key, inputs, outputs,
                                        call.span))
        return result

    def _bind_block_args(self, block: ast.Block, call: ast.Call, frame: _Frame) -> Optional[list[Value]]:
        names = [p.id for p in block.params]
        values: dict[str, Value] = {}
        if len(call.args) > len(names):
            self._arguments_error(block, call, f"block '{block.name.id}' takes {_count(len(names), 'argument')} "
                                               f"({', '.join(names)}), got {len(call.args)}")
            return None
        for name, arg in zip(names, call.args):
            values[name] = self._eval(arg, frame)
        for kw in call.kwargs:
            if kw.name not in names:
                self._error("arguments", kw.span, f"block '{block.name.id}' has no argument '{kw.name}'",
                            did_you_mean(kw.name, names))
                return None
            if kw.name in values:
                self._error("arguments", kw.span, f"argument '{kw.name}' is given twice")
                return None
            values[kw.name] = self._eval(kw.value, frame)
        missing = [n for n in names if n not in values]
        if missing:
            self._arguments_error(block, call, f"block '{block.name.id}' is missing argument "
                                               f"{', '.join(repr(m) for m in missing)}")
            return None
        return [values[n] for n in names]

    def _arguments_error(self, block: ast.Block, call: ast.Call, message: str) -> None:
        """Arguments that do not fit the block, said in the spec being compiled: at the call, or, where the
        spec replaces a block that a block of a spec it extends calls, at its block, naming that call."""
        own = self.model.span.file
        if call.span.file == own or block.span.file != own:
            self._error("arguments", call.span, message)
            return
        self._error("arguments", block.span, f"{message} at {printable(Path(call.span.file).name)}:{call.span.line}",
                    "a block that replaces one of the spec it extends takes the arguments its callers there pass")

    # --- expressions ------------------------------------------------------------------------
    def _eval(self, expr: ast.Expr, frame: _Frame) -> Value:
        """The value of `expr`: a tensor (its graph node), a function, or a constant.

        Charged to the budget, and nested at most MAX_NESTING deep counting the block and function
        calls it goes through: a function applied to itself must end in a diagnostic."""
        self.budget.step(expr.span)
        self.nesting += 1
        try:
            if self.nesting > MAX_NESTING:
                raise LimitExceeded(expr.span, f"block calls, function calls and expressions nest more than "
                                    f"{MAX_NESTING} levels deep here", "a function that calls itself, or "
                                    "blocks nested far deeper than a model needs", code="too-deep")
            return self._eval_nested(expr, frame)
        finally:
            self.nesting -= 1

    def _eval_nested(self, expr: ast.Expr, frame: _Frame) -> Value:
        if isinstance(expr, ast.Literal):
            return expr.value
        if isinstance(expr, ast.Name):
            return self._lookup(expr, frame)
        if isinstance(expr, ast.Lambda):
            self.uncalled.setdefault((frame.instance.path, id(expr)), expr)
            captured = {n: frame.env[n] for n in reads(expr) if n in frame.env}
            ref = f"{frame.instance.path}:fn{next(self.serial)}"
            step = Step("function", ref, {}, (ref,), expr.span)
            frame.program.steps.append(step)
            return Closure(expr, captured, frame.instance, frame.decoding, step, ref)
        if isinstance(expr, ast.Call):
            return self._call(expr, frame)
        if isinstance(expr, ast.BinOp):
            return self._binop(expr, frame)
        if isinstance(expr, ast.UnaryOp):
            operand = self._eval(expr.operand, frame)
            if isinstance(operand, (Tensor, Closure)):
                self._error("type", expr.span, f"'{expr.op}' is not defined for {describe_value(operand)}")
                return POISON
            return self._constant(expr, frame, "this expression")
        return self._constant(expr, frame, "this expression")

    def _lookup(self, name: ast.Name, frame: _Frame) -> Value:
        if name.id in frame.env:
            return frame.env[name.id]
        if name.id in self.model.params:
            return self.model.params[name.id]
        if name.id in self.model.failed_params:
            return POISON  # its own error is already reported
        known = [*frame.env, *self.model.params]
        self._error("unknown-name", name.span, f"unknown value '{name.id}'", did_you_mean(name.id, known))
        return POISON

    def _constant(self, expr: ast.Expr, frame: _Frame, what: str) -> Value:
        def lookup(name: ast.Name) -> Constant:
            value = self._lookup(name, frame)
            if isinstance(value, Poison):
                raise _Poisoned()
            if isinstance(value, (Tensor, Closure)):
                raise ConstantError("type", name.span, f"{what} must be a constant, but '{name.id}' is "
                                    f"{describe_value(value)}")
            return value

        try:
            return evaluate(expr, lookup, self.budget)
        except ConstantError as error:
            self._error(error.code, error.span, error.message, error.hint)
        except _Poisoned:
            pass
        return POISON

    def _binop(self, expr: ast.BinOp, frame: _Frame) -> Value:
        left, right = self._eval(expr.left, frame), self._eval(expr.right, frame)
        if isinstance(left, Poison) or isinstance(right, Poison):
            return POISON
        if not isinstance(left, (Tensor, Closure)) and not isinstance(right, (Tensor, Closure)):
            return self._constant(expr, frame, "this expression")
        if expr.op in TENSOR_OPERATORS and isinstance(left, Tensor) and isinstance(right, Tensor):
            return self._node(TENSOR_OPERATORS[expr.op], {}, {"a": left, "b": right}, expr, frame, span=expr.op_span)
        if expr.op == "*" and isinstance(left, Tensor) != isinstance(right, Tensor):
            tensor, factor = (left, right) if isinstance(left, Tensor) else (right, left)
            source = expr.right if isinstance(left, Tensor) else expr.left
            if isinstance(tensor, Tensor) and isinstance(factor, (int, float)) and not isinstance(factor, bool):
                return self._node("scale", {"factor": float(factor)}, {"x": tensor}, expr, frame,
                                  sources={"factor": source})
        self._error("type", expr.op_span, f"'{expr.op}' is not defined for {describe_value(left)} and "
                    f"{describe_value(right)}", "tensors support a + b, a - b, a * b (elementwise) and x * number")
        return POISON

    def _call(self, call: ast.Call, frame: _Frame) -> Value:
        name = call.callee.id
        local = frame.env.get(name)
        if isinstance(local, Closure):
            return self._call_closure(local, call, frame)
        if isinstance(local, Poison):
            return POISON  # reported where it was made
        if local is not None:
            self._error("type", call.callee.span, f"'{name}' is {describe_value(local)}, not a function")
            return POISON
        if name in self.model.blocks:
            return self._call_block(call, frame)
        if callable_op(name):
            return self._call_op(OPS[name], call, frame)
        if name in MATH_FUNCTIONS:
            return self._constant(call, frame, "this expression")
        functions = (k for k, v in frame.env.items() if isinstance(v, Closure))
        candidates = [*filter(callable_op, OPS), *self.model.blocks, *functions]
        self._error("unknown-name", call.callee.span, f"unknown op or block '{name}'", did_you_mean(name, candidates))
        return POISON

    def _call_closure(self, closure: Closure, call: ast.Call, frame: _Frame) -> Value:
        if len(call.args) != 1 or call.kwargs or call.label:
            self._error("arguments", call.span, f"'{call.callee.id}' takes exactly one argument")
            return POISON
        arg = self._eval(call.args[0], frame)
        self.uncalled.pop((closure.owner.path, id(closure.fn)), None)
        # The body is code once, in its owner's forward: recorded at the first call; later calls (of a
        # function without modules) compute the same steps again.
        serial = next(self.serial)
        param = closure.fn.param.id
        body = Program(params={param: f"{closure.step.target}:in{serial}"})
        if closure.step.body is None:
            closure.step.body = body
        env = {**closure.env, param: self._as(arg, body.params[param])}
        inner = _Frame(closure.owner, env, self.names, closure.decoding, body)
        returned = self._eval(closure.fn.body, inner)
        if isinstance(returned, Poison) or isinstance(arg, Poison):
            return POISON
        body.results = (_operand(returned),)
        result = self._as(returned, f"{closure.step.target}:out{serial}")
        inputs: dict[str, Operand] = {"fn": closure.ref}
        if _is_runtime(arg):
            inputs["x"] = arg.ref
        frame.program.steps.append(Step("apply", call.callee.id, inputs, (result.ref,) if _is_runtime(result) else (),
                                        call.span, argument=None if _is_runtime(arg) else Const(arg)))
        return result

    def _call_op(self, op: OpDef[Any], call: ast.Call, frame: _Frame) -> Value:
        bound = _bind_op_args(op, call, self.diagnostics)
        if bound is None:
            return POISON
        inputs: dict[str, Tensor] = {}
        attrs: dict[str, Value] = {}
        ok = True
        for name, expr in bound.items():
            value = self._eval(expr, frame)
            if isinstance(value, Poison):
                ok = False
            elif any(i.name == name for i in op.inputs):
                if not isinstance(value, Tensor):
                    self._error("type", expr.span, f"argument '{name}' of {op.name} must be a tensor, got "
                                f"{describe_value(value)}")
                    ok = False
                else:
                    inputs[name] = value
            elif isinstance(value, (Tensor, Closure)):
                self._error("type", expr.span, f"argument '{name}' of {op.name} must be a constant, got "
                            f"{describe_value(value)}")
                ok = False
            else:
                attrs[name] = value
        if not ok:
            return POISON
        return self._node(op.name, attrs, inputs, call, frame, arg_spans={n: e.span for n, e in bound.items()},
                          sources={n: bound[n] for n in attrs})

    def _node(self, op_name: str, attrs: dict[str, Value], inputs: dict[str, Tensor], expr: ast.Expr, frame: _Frame,
              span: Optional[Span] = None, arg_spans: Optional[dict[str, Span]] = None,
              sources: Optional[dict[str, ast.Expr]] = None) -> Value:
        op = OPS[op_name]
        validated = self._validate_attrs(op, attrs, expr.span, arg_spans or {})
        if validated is None:
            return POISON
        local = frame.env.get
        written = {name: config_expression(source, getattr(validated, name), self.config, local)
                   for name, source in (sources or {}).items()}
        scope = frame.instance.path
        if op.module is not None:
            name = frame.names[id(expr)]
            node = module = _join(scope, name)
            if not self._claim(frame.instance, name, expr):
                return POISON
            frame.instance.children[name] = Instance(path=node, kind="op", span=expr.span, node=node)
        else:
            counter = self.counters.setdefault((scope, op_name), itertools.count(1))
            name = f"{op_name}_{next(counter)}"
            while name in self.module_names:
                name = f"{op_name}_{next(counter)}"
            node, module = _join(scope, name), None
        self.budget.module(expr.span)
        self.graph.add(Node(node, op_name, validated, {port: tensor.node for port, tensor in inputs.items()},
                            span or expr.span, module, scope, repeat=tuple(self.stack_frames), cached=frame.decoding,
                            sources={name: code for name, code in written.items() if code is not None}))
        frame.program.steps.append(Step("op", node, {port: tensor.ref for port, tensor in inputs.items()}, (node,),
                                        span or expr.span))
        return Tensor(node, node)

    def _validate_attrs(self, op: OpDef[Any], attrs: dict[str, Value], span: Span,
                        arg_spans: dict[str, Span]) -> Optional[Attrs]:
        for name, value in attrs.items():
            field = op.attrs.model_fields.get(name)
            wants_int = field is not None and int in (field.annotation, *get_args(field.annotation))
            if isinstance(value, InexactQuotient) and wants_int:
                message, hint = value.explain()
                self._error("not-divisible", value.expr.span, f"{message}, but {op.name} needs a whole {name}",
                            hint)
                return None
        try:
            validated = op.attrs(**attrs)
            problems = op.check(validated)
            for name, message in problems:  # rules between arguments: reported at the first one named
                self._error("arguments", arg_spans.get(name, span), f"{op.name}: {message}")
            return None if problems else validated
        except pydantic.ValidationError as error:
            for problem in error.errors():
                name = str(problem["loc"][0]) if problem["loc"] else ""
                given = f", got {describe(attrs[name])}" if name in attrs else ""
                self._error("type", arg_spans.get(name, span), f"argument '{name}' of {op.name}: "
                            f"{problem['msg'].lower()}{given}")
            return None

    def _claim(self, owner: Instance, name: str, call: Union[ast.Expr, ast.Repeat]) -> bool:
        """Each module name is taken by one call site, which runs once: it is one set of weights."""
        problem = None if name.isdigit() else module_name_problem(name)  # digits: the layers of a stack
        if problem is not None:
            label = getattr(call, "label", None)
            self._error("reserved-name", label.span if label is not None else call.span,
                        f"{problem}, so it cannot name a module",
                        f"name it differently: ... as {name.strip('_')}_{'block' if label is None else 'module'}")
            return False
        existing = owner.children.get(name)
        if existing is None:
            self.claims[owner.path, name] = id(call)
            return True
        if self.claims.get((owner.path, name)) == id(call):
            self._error("shared-call", call.span, "this call runs twice (through a function called twice); "
                        "each call site is one set of weights", "write a separate call for each use")
        else:
            self._error("duplicate", call.span, f"the name '{name}' is used by two calls in this block",
                        f"label one of them differently: ... as {name}_2")
        return False

    # --- checks -----------------------------------------------------------------------------
    def _check_names(self) -> None:
        """A block's values become local variables of generated code: refuse names that cannot be
        (module names are checked where modules are created, class names are made unique by lowering)."""
        for block in self.model.blocks.values():
            for name in (*block.params, *bound_names(block.body)):
                problem = local_name_problem(name.id)
                if problem is not None:
                    self._error("reserved-name", name.span, problem)
            # Arguments become forward()'s parameters, which Python refuses to name twice.
            for index, param in enumerate(block.params):
                if any(param.id == earlier.id for earlier in block.params[:index]):
                    self._error("duplicate", param.span, f"block '{block.name.id}' has two arguments named "
                                f"'{param.id}'")

    def _error(self, code: str, span: Span, message: str, hint: Optional[str] = None) -> None:
        self.diagnostics.error(code, span, message, hint)


class _Poisoned(Exception):
    pass


def _is_constant(value: object) -> bool:
    return value is not None and not isinstance(value, (Tensor, Closure, Poison))



def describe_value(value: Value) -> str:
    if isinstance(value, Tensor):
        return "a tensor"
    if isinstance(value, Closure):
        return "a function"
    return describe(value)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _bind_op_args(op: OpDef[Any], call: ast.Call, diagnostics: Diagnostics) -> Optional[dict[str, ast.Expr]]:
    """Match a call's arguments to the op's inputs, then its attributes, in declaration order; inputs given by
    name only come last."""
    positional = [i.name for i in op.inputs if not i.keyword] + list(op.attrs.model_fields)
    names = positional + [i.name for i in op.inputs if i.keyword]
    bound: dict[str, ast.Expr] = {}
    if len(call.args) > len(positional):
        diagnostics.error("arguments", call.args[len(positional)].span,
                          f"{op.name} takes at most {_count(len(positional), 'argument')}"
                          f"{' by position' if len(names) > len(positional) else ''} ({', '.join(positional)})")
        return None
    bound.update(zip(positional, call.args))
    for kw in call.kwargs:
        if kw.name not in names:
            diagnostics.error("arguments", kw.span, f"{op.name} has no argument '{kw.name}'",
                              did_you_mean(kw.name, names) or f"{op.name} takes {', '.join(names)}")
            return None
        if kw.name in bound:
            diagnostics.error("arguments", kw.span, f"argument '{kw.name}' of {op.name} is given twice")
            return None
        bound[kw.name] = kw.value
    required = [i.name for i in op.inputs if not i.optional] + [
        n for n, f in op.attrs.model_fields.items() if f.is_required()]
    missing = [n for n in required if n not in bound]
    if missing:
        diagnostics.error("arguments", call.span, f"{op.name} is missing argument "
                          f"{', '.join(repr(m) for m in missing)}")
        return None
    return bound


def _index_parameter(call: ast.Call, block: ast.Block, index: str) -> Optional[str]:
    """The parameter of `block` that `call` passes the repeat's index as it is (`lm_layer(x, i)`), if one."""
    for param, arg in zip(block.params, call.args):
        if isinstance(arg, ast.Name) and arg.id == index:
            return param.id
    for keyword in call.kwargs:
        if isinstance(keyword.value, ast.Name) and keyword.value.id == index:
            return keyword.name
    return None

