"""One module's `forward`, written from its program (compiler/ir.py) as one would write it by hand.

- A small block called with a function (`sublayer(x, h => attention(...))`) is written where it is
  called (compiler/lower.py chooses which): its steps, with the function's body in place of the call;
  its modules stay its own (`self.sublayer_1.norm`), so parameter names do not change.
- A value read only by the next step of the same spec line is written inside that step
  (`self.w_2(F.relu(self.w_1(x)))`) while the line stays under LINE_LIMIT characters. Only the value
  just computed is taken in, so the steps still run in the program's order (dropout draws and the
  decoder cache see the same sequence).
- A value is named after the spec name it was assigned to, else the module that computes it
  (`self_attn`), else what it is (`relu`, `dropout`, `sum`). In the forward's own body a name is used
  again once its value is dead, so `x = sublayer(x, ...)` stays `x = ...`; inside a loop or a function
  every value gets a name of its own, and a value a function reads is never dead. A loop over a stack
  gives each value it carries one name before, inside and after it.
- A line whose value has another shape than the value it reads says the new shape, in the spec's
  dimension names (`# [batch, tgt_len, vocab]`), before its pointer to the spec line.
"""

from __future__ import annotations

import ast as pyast
import functools
import itertools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from xspec.base.text import printable

from .code_reads import attributes_read, config_field
from .config import ConfigNames
from .diagnostics import Span
from .entries import TOKEN_TYPES
from .ir import Const, Instance, Node, OpGraph, Operand, Program, Step
from .names import local_name_problem
from .ops import OPS
from .python_code import (Note, assign, assign_many, call, constant, dotted, for_loop, function, identifier,
                          if_statement, note_of, noted, returns, text_of, variable)
from .python_print import INDENT, LINE_LIMIT

# What a value an op without a module computes is called, where the spec gives it no name.
ROLE_NAMES = {"add": "summed", "sub": "difference", "mul": "product", "scale": "scaled"}
# The longest function written where it is passed (a lambda); a longer one is a nested def.
AT_CALL_LIMIT = 72


@functools.cache
def file_label(path: str) -> str:
    """A spec file's name as comments show it (a file name may hold any character: escaped)."""
    return printable(Path(path).name)


def where(span: Span) -> str:
    """`base.xspec:41`, for comments and docstrings."""
    return f"{file_label(span.file)}:{span.line}"


def where_all(step: Step) -> str:
    """`modernbert.xspec:44, modernbert.xspec:45`: the spec lines a step stands for, in their order."""
    spans = sorted((step.span, *step.also), key=lambda span: (span.file, span.line))
    return ", ".join(dict.fromkeys(where(span) for span in spans))


@dataclass
class Context:
    """What every forward of one generated module shares (compiler/lower.py fills it in)."""

    graph: OpGraph
    tensors: dict[str, str]  # ref -> the node that computes it
    names: ConfigNames
    # The attribute a forward's class holds to call a parameter-free module (nn.Dropout), or a value its
    # forward reads: given the instance whose forward reads it, the node, and the module's constructor
    # (the value's code over the config).
    holder: Callable[[Instance, str, pyast.expr], str]
    # The parameters `if` statements read (`if final_logit_softcapping > 0`): a config edited to another
    # value of one would not take the other branch, so the forward writes values of them as numbers.
    decided: frozenset[str] = frozenset()
    # A node's last size as the spec's expressions give it (`config.d_ff`), for shape comments.
    width: Callable[[str], pyast.expr] = lambda node_id: constant(None)


@dataclass
class _Pending:
    """A value computed by the last step and not yet written: the next step may take it in."""

    ref: str
    code: pyast.expr
    span: Span
    pointer: str  # the spec lines its comment names (where_all)
    source: Optional[str]  # the tensor the expression reads first, for its shape comment
    index: int
    hint: str
    program: Program


def forward_method(context: Context, instance: Instance) -> pyast.FunctionDef:
    """`def forward(self, ...):` and its body, for a block instance or a layer of a repeat's own body."""
    return _Forward(context, instance).method()


class _Forward:
    def __init__(self, context: Context, instance: Instance) -> None:
        self.context, self.graph, self.instance = context, context.graph, instance
        self.names: dict[str, str] = {}  # ref -> its local name
        self.taken: set[str] = set()  # the names of the scope being written
        self.holder: dict[str, str] = {}  # in the forward's own body: name -> the ref it holds now
        self.pending: Optional[_Pending] = None
        self.at_call: dict[str, pyast.expr] = {}  # a function ref -> its code where the one call it is passed to
        self.depth = 2  # indentation of the lines being written: class, def
        items = instance.program.steps
        # Where a value of the forward's own body is read for the last time; values read by a function
        # or returned never die.
        self.last_read: dict[str, int] = {}
        self.reads: dict[str, int] = {}  # how many steps read each value, anywhere in this forward
        for index, step in enumerate(items):
            for ref in self._reads(step):
                self.last_read[ref] = index
        self.captured = self._captured(instance.program)
        self.results = {r for r in instance.program.results if isinstance(r, str)}
        self.immortal = self.captured | self.results
        self.top_items = items

    def _reads(self, step: Step) -> set[str]:
        return step.reads()

    def _captured(self, program: Program) -> set[str]:
        """The refs from outside it that some function written as a function (or a loop) reads."""
        refs: set[str] = set()
        for step in program.steps:
            for inner in step.programs():
                if step.kind == "branch":  # written in place: what its arms read, only their own closures keep
                    refs |= self._captured(inner)
                    continue
                inside = _defined(inner) | set(inner.params.values())
                refs |= {r for r in inner.reads() - inside if isinstance(r, str)}
        return refs

    # --- the forward --------------------------------------------------------------------------
    def method(self) -> pyast.FunctionDef:
        for name, ref in self.instance.program.params.items():
            self._bind(ref, identifier(name), top=True)
        optional = ([TOKEN_TYPES] if self.instance.has_token_types else []) + (["cache"] if self.instance.has_cache
                                                                               else [])
        args = ["self", *self.instance.program.params, *optional]
        body = self._body(self.instance.program, top=True, items=self.top_items)
        return function("forward", args, body, defaults=[constant(None)] * len(optional))

    def _body(self, program: Program, top: bool, items: Optional[list[Step]] = None) -> list[pyast.stmt]:
        """A forward's or a function's steps, then its return: `return self.w_2(...)` where the last
        step computes what it returns (rather than naming the value only to return it)."""
        lines = self._program(program, top, items)
        results = [r for r in program.results]
        pending = self.pending
        if pending is not None and results == [pending.ref]:
            self.pending = None
            return [*lines, returns(pending.code, self._note(pending.pointer, pending.ref, pending.source))]
        lines += self._flush()
        values = [self._operand(r) for r in results]
        value = values[0] if len(values) == 1 else pyast.Tuple(values, pyast.Load()) if values else constant(None)
        return [*lines, returns(value)]

    def _program(self, program: Program, top: bool, items: Optional[list[Step]] = None,
                 stack: Optional[Instance] = None) -> list[pyast.stmt]:
        lines: list[pyast.stmt] = []
        for index, step in enumerate(items if items is not None else program.steps):
            if step.kind == "function":
                lines += self._flush()
                lines += self._function(step, program, top, index)
            elif step.kind == "stack":
                lines += self._flush()
                lines += self._stack(step, program, top, index)
            elif step.kind == "branch":
                lines += self._flush()
                lines += self._branch(step, program, top, index)
            else:
                lines += self._step(step, program, top, index, stack)
        return lines

    def _step(self, step: Step, program: Program, top: bool, index: int,
              stack: Optional[Instance]) -> list[pyast.stmt]:
        """A step's expression, taking in the pending value where it fits; the step's own value pends in
        turn where only the next step may read it."""
        lines: list[pyast.stmt] = []
        pending = self.pending
        if pending is not None:
            code, source = self._call(step, stack, taking=pending)
            if code is None:
                lines += self._flush()
                code, source = self._call(step, stack)
        else:
            code, source = self._call(step, stack)
        self.pending = None
        assert code is not None
        outputs = list(step.outputs)
        if len(outputs) == 1 and self.reads_once(outputs[0]):
            self.pending = _Pending(outputs[0], code, step.span, where_all(step), source, index,
                                    self._default_hint(step), program)
            return lines
        names = [self._name_output(ref, self._default_hint(step), program, top, index) for ref in outputs]
        ref = outputs[0] if len(outputs) == 1 else None
        return [*lines, assign_many(names or ["_"], code, self._note(where_all(step), ref, source))]

    def reads_once(self, ref: str) -> bool:
        """Whether one step reads `ref` (the forward's return counts as one), and no function."""
        if ref in self.captured or ref in self.names:
            return False
        if not self.reads:
            for step in self.top_items:
                for read in self._reads_all(step):
                    self.reads[read] = self.reads.get(read, 0) + 1
        return self.reads.get(ref, 0) + (ref in self.results) == 1

    def _reads_all(self, step: Step) -> list[str]:
        """Every read of a step, counted once per input (attention(h, h, h) reads h three times)."""
        refs = [v for v in step.inputs.values()]
        refs += [b for b, _, _, _ in step.carried if b is not None]
        for inner in step.programs():
            refs += [r for s in inner.steps for r in (*s.inputs.values(),)]
            refs += [r for r in inner.results]
            refs += [r for s in inner.steps for body in s.programs() for r in body.reads()]
        return [r for r in refs if isinstance(r, str)]

    def _flush(self) -> list[pyast.stmt]:
        """The pending value written on a line of its own."""
        pending, self.pending = self.pending, None
        if pending is None:
            return []
        name = self._name_output(pending.ref, pending.hint, pending.program, self.depth == 2, pending.index)
        return [assign(name, pending.code, self._note(pending.pointer, pending.ref, pending.source))]

    def _note(self, pointer: str, ref: Optional[str], source: Optional[str]) -> Note:
        """A line's comment: the new shape where it differs from what it read, and the spec line."""
        shape = self._shape(ref)
        if shape is not None and shape != self._shape(source):
            return Note(pointer, *shape)
        return Note(pointer)

    def _shape(self, ref: Optional[str]) -> Optional[tuple[tuple[str, ...], str]]:
        if ref is None:
            return None
        node_id = self.context.tensors.get(ref, ref)
        shape = self.graph[node_id].shape if node_id in self.graph else None
        if shape is None:
            return None
        dims, dtype = self.context.names.shape(shape)
        # The last size as the op that made it reads it (`d_ff` where d_model is the same number too).
        last = shape.dims[-1] if shape.dims else None
        if not isinstance(last, int):
            return dims, dtype
        field = config_field(self.context.width(node_id))
        if field is not None and self.context.names.fields.get(field) == last:
            return (*dims[:-1], field), dtype
        return (*dims[:-1], str(last)), dtype  # computed (int(head_dim * fraction)): no one field's

    # --- names --------------------------------------------------------------------------------
    def _bind(self, ref: str, name: str, top: bool) -> str:
        self.names[ref] = name
        self.taken.add(name)
        if top:
            self.holder[name] = ref
        return name

    def _fresh(self, hint: str) -> str:
        base = hint.lstrip("_") if hint.lstrip("_").isidentifier() else "value"
        for candidate in itertools.chain([base], (f"{base}_{n}" for n in itertools.count(2))):
            if candidate not in self.taken and local_name_problem(candidate) is None:
                return candidate
        raise AssertionError("unreachable")

    def _dead(self, ref: str, index: int) -> bool:
        """Whether the forward's own body reads `ref` no more after its step `index`."""
        return ref not in self.immortal and self.last_read.get(ref, -1) <= index

    def _name_output(self, ref: str, hint: str, program: Program, top: bool, index: int) -> str:
        if ref in self.names:  # a loop's carried value, named by the loop
            return self.names[ref]
        hint = program.hints.get(ref) or hint
        held = self.holder.get(hint)
        if top and held is not None and local_name_problem(hint) is None and self._dead(held, index):
            return self._bind(ref, hint, top)
        return self._bind(ref, self._fresh(hint), top)

    def _default_hint(self, step: Step) -> str:
        if step.kind == "op":
            node = self.graph[step.target]
            if node.module is not None:
                return node.id.rsplit(".", 1)[-1]  # the module's name: `self_attn`, `w_1`
            return ROLE_NAMES.get(node.op, node.op)
        if step.kind == "block":
            return step.target
        return "layer_out" if step.kind == "layer" else f"{step.target}_out"  # apply: `f_out = f(x)`

    def _operand(self, operand: Operand) -> pyast.expr:
        if isinstance(operand, str) and operand in self.at_call:
            return self.at_call[operand]
        if isinstance(operand, Const):
            return constant(operand.value)
        assert operand in self.names, f"{operand} is read before it is defined"
        return variable(self.names[operand])

    # --- expressions --------------------------------------------------------------------------
    def _call(self, step: Step, stack: Optional[Instance] = None,
              taking: Optional[_Pending] = None) -> tuple[Optional[pyast.expr], Optional[str]]:
        """The expression a step computes, and the tensor it reads first. With `taking`, the pending
        value written in its place: None where the step does not read it, or the line would be long."""
        if taking is not None and (list(step.inputs.values()).count(taking.ref) != 1 or
                                   (taking.span.file, taking.span.line) != (step.span.file, step.span.line)):
            return None, None
        code = self._expression(step, taking, stack)
        first = next((v for v in step.inputs.values() if isinstance(v, str) and self._is_tensor(v)), None)
        source = taking.source if taking is not None and first == taking.ref else first
        if taking is not None and self._length(step, code, source) >= LINE_LIMIT:
            return None, None
        return code, source

    def _length(self, step: Step, code: pyast.expr, source: Optional[str]) -> int:
        """About how long the step's line will be: its name (none where its value pends in turn), the
        code and the comment."""
        length = len(INDENT * self.depth) + len(text_of(code)) + len("  # ") + len(where_all(step))
        outputs = list(step.outputs)
        if len(outputs) != 1 or not isinstance(outputs[0], str):
            return length + 4
        ref = outputs[0]
        if self.reads_once(ref) and ref not in self.results:
            return length  # it pends: the step that takes it in measures again
        shape = self._shape(ref)
        if shape is not None and shape != self._shape(source):
            length += len(str(Note("", *shape)))
        name = "return" if ref in self.results else \
            self.instance.program.hints.get(ref) or self._default_hint(step)
        return length + len(name) + (1 if ref in self.results else 3)

    def _is_tensor(self, ref: str) -> bool:
        return ref in self.context.tensors or ref in self.graph

    def _expression(self, step: Step, taking: Optional[_Pending], stack: Optional[Instance]) -> pyast.expr:
        def code(port: str) -> pyast.expr:
            value = step.inputs[port]
            return taking.code if taking is not None and value == taking.ref else self._operand(value)

        if step.kind == "op":
            node = self.graph[step.target]
            op = OPS[node.op]
            if op.module is not None:
                attribute = identifier(node.id.rsplit(".", 1)[-1])
            elif op.holder is not None:
                attribute = self.context.holder(self.instance, node.id, op.holder(node.attrs, Arguments(node)))
            else:
                attribute = ""
            inputs = {port: code(port) for port in step.inputs}
            if op.reads_token_types and self.instance.has_token_types:
                inputs[TOKEN_TYPES] = variable(TOKEN_TYPES)
            inputs.update(self._held_values(node))
            return op.call(attribute, inputs, node.attrs, op.uses_cache and self.instance.has_cache)
        args = [code(port) for port in step.inputs]
        if step.kind == "block":
            child = self.instance.children[step.target]
            return call(f"self.{identifier(step.target)}", *args, **self._passed(child))
        if step.kind == "layer":
            assert stack is not None, "a layer step outside a stack's loop"
            return call("layer", *args, **self._passed(stack.children["0"]))
        assert step.kind == "apply", f"no expression for a {step.kind} step"
        if step.argument is not None:  # a constant passed to a function
            args.append(constant(step.argument.value))
        function_code, argument = args
        return pyast.Call(function_code, [argument], [])

    def _held_values(self, node: Node) -> dict[str, pyast.expr]:
        """The attributes the op's forward code reads (OpDef.forward_attrs) that the spec computes from
        parameters, each as the attribute of the class that holds it over the config, so that an edited config
        computes it: `self.scale` of `self.scale = 1 / math.sqrt(config.d_model)`."""
        held = {}
        for name in OPS[node.op].forward_attrs:
            source = node.sources.get(name)
            if source is not None and not self.context.decided & set(attributes_read(source, owner="config")):
                held[name] = dotted(f"self.{self.context.holder(self.instance, node.id, source)}")
        return held

    def _passed(self, child: Instance) -> dict[str, pyast.expr]:
        """What a block's forward passes on to a child's beside its arguments: the token types and the cache,
        where both take them."""
        passed = [name for name, taken in ((TOKEN_TYPES, child.has_token_types and self.instance.has_token_types),
                                           ("cache", child.has_cache and self.instance.has_cache)) if taken]
        return {name: variable(name) for name in passed}

    # --- functions and loops ------------------------------------------------------------------
    def _function(self, step: Step, program: Program, top: bool, index: int) -> list[pyast.stmt]:
        """A spec function: `None` if nothing calls it; where one expression passed to one block call, that
        expression at the call (`self.ffn`, `lambda h: self.self_attn(h, h, h, mask)`), as the Annotated
        Transformer passes its sublayers; else a nested def (a def, not a lambda bound to a name, as PEP 8
        and the project's linter ask)."""
        ref, comment, body = step.outputs[0], where(step.span), step.body
        if body is None:
            return [assign(self._name_output(ref, "fn", program, top, index), constant(None), comment)]
        # The body is a scope of its own: its names need only avoid those it can see.
        outer, outer_holder = set(self.taken), self.holder
        self.holder = {}
        (param, param_ref), = body.params.items()
        param = self._bind(param_ref, self._fresh(param), top=False)
        only = body.steps[0] if len(body.steps) == 1 else None
        expression: Optional[pyast.expr] = None
        if not body.steps:
            expression = self._operand(body.results[0])
        elif only is not None and only.kind != "function" and list(only.outputs) == list(body.results):
            expression, _ = self._call(only)
            assert expression is not None
        if expression is not None and self._passed_once(ref, program):
            at_call = _applied_to(expression, param) or pyast.Lambda(
                pyast.arguments([], [pyast.arg(param)], None, [], [], None, []), expression)
            if len(text_of(at_call)) <= AT_CALL_LIMIT:
                self.taken, self.holder = outer, outer_holder
                self.at_call[ref] = at_call
                return []
        # Every statement names its spec line: the def, and the return (which the comment lets wrap, if long).
        statements: list[pyast.stmt]
        if expression is not None:
            statements = [returns(expression, comment)]
        else:
            self.depth += 1
            statements = self._body(body, top=False)
            self.depth -= 1
        self.taken, self.holder = outer, outer_holder
        name = self._name_output(ref, "fn", program, top, index)
        return [function(name, [param], statements, comment)]

    def _passed_once(self, ref: str, program: Program) -> bool:
        """Whether the function `ref` is an argument of one block call of `program`, and read nowhere else."""
        readers = [step for step in program.steps if ref in step.inputs.values()]
        nested = any(ref in step.body.reads() for step in program.steps if step.body is not None)
        return len(readers) == 1 and readers[0].kind == "block" and not nested and ref not in program.results

    def _stack(self, step: Step, program: Program, top: bool, index: int) -> list[pyast.stmt]:
        """`for layer in self.layers:` around the first layer's iteration."""
        stack = self.instance.children[step.target]
        lines: list[pyast.stmt] = []
        chosen = set()
        carried_names = []
        assert step.body is not None
        inside = step.body.reads()  # a value from before the loop the layers also read unchanged keeps its name
        for before, loop, first, last in step.carried:
            hint = program.hints.get(last, "carried")
            held = self.holder.get(hint)
            if (before is not None and top and self._dead(before, index) and before not in inside
                    and self.names[before] not in chosen):
                name = self.names[before]  # the loop takes the value's own name: no copy
            elif (before is None and top and held is not None and self._dead(held, index) and held not in inside
                  and hint not in chosen):
                name = hint  # what the layers define takes the name of a value no longer read
            else:
                name = self._fresh(hint)
                self.taken.add(name)
                if before is not None:
                    lines.append(assign(name, variable(self.names[before]), where(step.span)))
            chosen.add(name)
            if loop is not None:
                self.names[loop] = name
            self.names[first] = name
            carried_names.append((last, name))
        self.depth += 1
        body = self._program(step.body, top=False, stack=stack)
        body += self._flush()
        self.depth -= 1
        lines.append(for_loop("layer", dotted(f"self.{identifier(step.target)}"), body, where(step.span)))
        for last, name in carried_names:
            self._bind(last, name, top)
        return lines

    def _branch(self, step: Step, program: Program, top: bool, index: int) -> list[pyast.stmt]:
        """`if <the layer's kind>:` around one arm, `else:` around the other, each yielding the branch's
        values under the same names; one assignment where the arms differ in one argument only."""
        assert step.body is not None and step.orelse is not None and step.condition is not None
        # A name of a value the arms read is taken only where each arm is one step, which reads it first.
        reusing = top and all(len(arm.steps) == 1 for arm in step.programs())
        names = [self._name_output(ref, self._branch_hint(step, n), program, reusing, index)
                 for n, ref in enumerate(step.outputs)]
        arms = []
        self.depth += 1
        for arm in (step.body, step.orelse):
            made = _defined(arm)
            for result, name in zip(arm.results, names):
                if isinstance(result, str) and result in made:
                    self.names[result] = name
            lines = self._program(arm, top=False)
            lines += self._flush()
            for result, name in zip(arm.results, names):  # an arm that yields a value from before it
                if not (isinstance(result, str) and result in made):
                    lines.append(assign(name, self._operand(result)))
            arms.append(lines or [pyast.Pass()])
        self.depth -= 1
        one = _one_choice(arms[0], arms[1], step.condition)
        if one is not None:
            return [one]
        return [if_statement(step.condition, arms[0], arms[1], where(step.span))]

    def _branch_hint(self, step: Step, n: int) -> str:
        """What the `n`th value a branch yields is called: what both arms call it, else `hidden`."""
        hints = {self._yielded_hint(arm, arm.results[n]) for arm in step.programs()}
        return hints.pop() if len(hints) == 1 else "hidden"

    def _yielded_hint(self, arm: Program, result: Operand) -> str:
        maker = next((step for step in arm.steps if result in step.outputs), None)
        if not isinstance(result, str) or maker is None:
            return "hidden"
        if result in arm.hints:
            return arm.hints[result]
        return self._branch_hint(maker, maker.outputs.index(result)) if maker.kind == "branch" else \
            self._default_hint(maker)


def _one_choice(then: list[pyast.stmt], orelse: list[pyast.stmt], condition: pyast.expr) -> Optional[pyast.stmt]:
    """Two arms that assign one call each, the same but for one argument, as one assignment whose argument the
    condition chooses (`position_embeddings=rope_local if self.layer_type == 'sliding_attention' else rope`);
    None where they differ otherwise."""
    if len(then) != 1 or len(orelse) != 1:
        return None
    mine, theirs = then[0], orelse[0]
    if not (isinstance(mine, pyast.Assign) and isinstance(theirs, pyast.Assign)
            and isinstance(mine.value, pyast.Call) and isinstance(theirs.value, pyast.Call)
            and text_of(mine.targets[0]) == text_of(theirs.targets[0])
            and text_of(mine.value.func) == text_of(theirs.value.func)
            and len(mine.value.args) == len(theirs.value.args)
            and [k.arg for k in mine.value.keywords] == [k.arg for k in theirs.value.keywords]):
        return None
    pairs = [*zip(mine.value.args, theirs.value.args),
             *((a.value, b.value) for a, b in zip(mine.value.keywords, theirs.value.keywords))]
    differing = [n for n, (a, b) in enumerate(pairs) if text_of(a) != text_of(b)]
    if len(differing) != 1:
        return None
    chosen = [pyast.IfExp(condition, a, b) if n == differing[0] else a for n, (a, b) in enumerate(pairs)]
    count = len(mine.value.args)
    keywords = [pyast.keyword(k.arg, value) for k, value in zip(mine.value.keywords, chosen[count:])]
    merged = pyast.Assign(mine.targets, pyast.Call(mine.value.func, chosen[:count], keywords))
    note, other = note_of(mine), note_of(theirs)
    if note is not None:   # both arms' spec lines
        lines = dict.fromkeys([*note.text.split(", "), *(other.text.split(", ") if other is not None else [])])
        noted(merged, replace(note, text=", ".join(lines)))
    return merged


def _applied_to(expression: pyast.expr, param: str) -> Optional[pyast.expr]:
    """`self.ffn` of `self.ffn(h)`, a module of the class called on `param` alone; else None."""
    if isinstance(expression, pyast.Call) and not expression.keywords and len(expression.args) == 1 \
            and isinstance(expression.args[0], pyast.Name) and expression.args[0].id == param \
            and isinstance(expression.func, pyast.Attribute) and isinstance(expression.func.value, pyast.Name) \
            and expression.func.value.id == "self":
        return expression.func
    return None


def _defined(program: Program) -> set[str]:
    """The refs a program's steps make, in its loops and functions too."""
    refs = {ref for step in program.steps for ref in step.outputs}
    for step in program.steps:
        if step.body is not None:
            refs |= _defined(step.body) | set(step.body.params.values())
    return refs


class Arguments:
    """An op's constructor arguments as generated code writes them (opdef.Written): each attribute as the
    spec's parameter expression over the config (`config.d_ff`), else its value; an input's width as
    `width` gives it (the lowering follows the graph for it)."""

    def __init__(self, node: Node, width: Optional[Callable[[str], pyast.expr]] = None) -> None:
        self.node, self._width = node, width

    def attr(self, name: str) -> pyast.expr:
        source = self.node.sources.get(name)
        return source if source is not None else constant(getattr(self.node.attrs, name))

    def width(self, port: str) -> pyast.expr:
        assert self._width is not None, f"{self.node.id}: an input's width read where the graph is not followed"
        return self._width(self.node.inputs[port])

    def from_config(self, name: str) -> bool:
        return name in self.node.sources
