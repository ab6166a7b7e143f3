"""One module's `forward`, written from its program (compiler/ir.py): a line per step, named locals.

A value is named after the spec name it was assigned to (`x = ...`), else after what computes it (`w_1`,
`relu_1`, `sublayer_1`). In the forward's own body a name is used again once its value is dead, so
`x = sublayer(x, ...)` stays `x = self.sublayer_1(x, fn)`; inside a loop or a function every value gets a
name of its own, and a value a function reads is never dead (the function may be called later). A loop
over a stack gives each value it carries one name before, inside and after it.
"""

from __future__ import annotations

import functools
import itertools
import keyword
from pathlib import Path
from typing import Optional

from .diagnostics import Span, printable
from .ir import Const, Instance, OpGraph, Operand, Program, Step
from .names import local_name_problem
from .ops import OPS

INDENT = "    "


def identifier(name: str) -> str:
    assert name.isidentifier() and not keyword.iskeyword(name), f"not a plain identifier: {name!r}"
    return name


@functools.cache
def file_label(path: str) -> str:
    """A spec file's name as comments show it (a file name may hold any character: escaped)."""
    return printable(Path(path).name)


def where(span: Span) -> str:
    """`base.xspec:41`, for comments and docstrings."""
    return f"{file_label(span.file)}:{span.line}"


def literal(value: object) -> str:
    """A constant as Python source (a quotient that does not divide evenly is the float it is)."""
    if isinstance(value, tuple):
        return "(" + "".join(f"{literal(item)}, " for item in value) + ")"
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return repr(kind(value))
    raise AssertionError(f"not a constant: {value!r}")


def forward_lines(graph: OpGraph, instance: Instance) -> list[str]:
    """`def forward(self, ...):` and its body, for a block instance or a layer of a repeat's own body."""
    return _Forward(graph, instance).lines()


def _captured(program: Program) -> set[str]:
    """The refs some function defined in `program` (or in its loops and functions) reads."""
    refs: set[str] = set()
    for step in program.steps:
        if step.body is not None:
            refs |= _captured(step.body)
            if step.kind == "function":
                refs |= step.body.reads()
    return refs


class _Forward:
    def __init__(self, graph: OpGraph, instance: Instance) -> None:
        self.graph, self.instance, self.program = graph, instance, instance.program
        self.names: dict[str, str] = {}  # ref -> its local name
        self.taken: set[str] = set()  # the names of the scope being written
        self.holder: dict[str, str] = {}  # in the forward's own body: name -> the ref it holds now
        # Where a value of the forward's own body is read for the last time; values read by a function or
        # returned never die.
        self.last_read: dict[str, int] = {}
        for index, step in enumerate(self.program.steps):
            for ref in step.reads():
                self.last_read[ref] = index
        self.immortal = _captured(self.program) | {r for r in self.program.results if isinstance(r, str)}

    def lines(self) -> list[str]:
        for name, ref in self.program.params.items():
            self._bind(ref, identifier(name), top=True)
        args = ["self", *self.program.params] + (["cache=None"] if self.instance.has_cache else [])
        body = self._body(self.program, top=True)
        return [f"def forward({', '.join(args)}):", *(INDENT + line for line in body)]

    def _body(self, program: Program, top: bool) -> list[str]:
        """A forward's or a function's steps, then its return: `return self.w_2(relu_1)` where the last
        step computes what it returns (rather than naming the value only to return it)."""
        steps = program.steps
        tail = steps[-1] if steps and steps[-1].kind in ("op", "block", "apply") else None
        if tail is not None and list(tail.outputs) == list(program.results):
            return [*self._program(program, top, stop=len(steps) - 1),
                    f"return {self._call(tail)}  # {where(tail.span)}"]
        return [*self._program(program, top), self._return(program)]

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
        hint = program.hints.get(ref, hint)
        held = self.holder.get(hint)
        if top and held is not None and local_name_problem(hint) is None and self._dead(held, index):
            return self._bind(ref, hint, top)
        return self._bind(ref, self._fresh(hint), top)

    def _operand(self, operand: Operand) -> str:
        if isinstance(operand, Const):
            return literal(operand.value)
        assert operand in self.names, f"{operand} is read before it is defined"
        return self.names[operand]

    # --- steps --------------------------------------------------------------------------------
    def _program(self, program: Program, top: bool, stop: Optional[int] = None,
                 stack: Optional[Instance] = None) -> list[str]:
        lines: list[str] = []
        for index, step in enumerate(program.steps[:stop]):
            if step.kind == "function":
                lines += self._function(step, program, top, index)
            elif step.kind == "stack":
                lines += self._stack(step, program, top, index)
            else:
                call = self._call(step, stack)
                outputs = [self._name_output(ref, self._default_hint(step), program, top, index)
                           for ref in step.outputs]
                lines.append(f"{', '.join(outputs) or '_'} = {call}  # {where(step.span)}")
        return lines

    def _default_hint(self, step: Step) -> str:
        if step.kind == "op":
            return step.target.rsplit(".", 1)[-1]  # the module's name, or the op's numbered name: `relu_1`
        return step.target if step.kind == "block" else f"{step.target}_out"  # apply: `f_out = f(x)`

    def _call(self, step: Step, stack: Optional[Instance] = None) -> str:
        """The expression a step computes."""
        args = [self._operand(v) for v in step.inputs.values()]
        if step.kind == "op":
            node = self.graph[step.target]
            op = OPS[node.op]
            inputs = {port: self._operand(v) for port, v in step.inputs.items()}
            attribute = identifier(node.id.rsplit(".", 1)[-1]) if op.module is not None else ""
            cache = "cache" if op.uses_cache and self.instance.has_cache else None
            return op.call(attribute, inputs, node.attrs, cache)
        if step.kind == "block":
            child = self.instance.children[step.target]
            cache = ", cache=cache" if child.has_cache and self.instance.has_cache else ""
            return f"self.{identifier(step.target)}({', '.join(args)}{cache})"
        if step.kind == "layer":
            assert stack is not None, "a layer step outside a stack's loop"
            cache = ", cache=cache" if stack.children["0"].has_cache and self.instance.has_cache else ""
            return f"layer({', '.join(args)}{cache})"
        assert step.kind == "apply", f"no expression for a {step.kind} step"
        if step.argument is not None:  # a constant passed to a function
            args.append(literal(step.argument.value))
        function, argument = args
        return f"{function}({argument})"

    def _return(self, program: Program) -> str:
        return f"return {', '.join(self._operand(r) for r in program.results) or 'None'}"

    def _function(self, step: Step, program: Program, top: bool, index: int) -> list[str]:
        """A spec function: `None` if nothing calls it, a lambda for one step, else a nested def."""
        name = self._name_output(step.outputs[0], "fn", program, top, index)
        comment = f"  # {where(step.span)}"
        body = step.body
        if body is None:
            return [f"{name} = None{comment}"]
        # The body is a scope of its own: its names need only avoid those it can see.
        outer, outer_holder = set(self.taken), self.holder
        self.holder = {}
        (param, param_ref), = body.params.items()
        param = self._bind(param_ref, self._fresh(param), top=False)
        only = body.steps[0] if len(body.steps) == 1 else None
        if not body.steps:
            lines = [f"{name} = lambda {param}: {self._return(body)[len('return '):]}{comment}"]
        elif only is not None and only.kind != "function" and list(only.outputs) == list(body.results):
            lines = [f"{name} = lambda {param}: {self._call(only)}{comment}"]
        else:
            lines = [f"def {name}({param}):{comment}", *(INDENT + line for line in self._body(body, top=False))]
        self.taken, self.holder = outer, outer_holder
        return lines

    def _stack(self, step: Step, program: Program, top: bool, index: int) -> list[str]:
        """`for layer in self.layers:` around the first layer's iteration."""
        stack = self.instance.children[step.target]
        lines, chosen = [], set()
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
                    lines.append(f"{name} = {self.names[before]}  # {where(step.span)}")
            chosen.add(name)
            if loop is not None:
                self.names[loop] = name
            self.names[first] = name
            carried_names.append((last, name))
        lines.append(f"for layer in self.{identifier(step.target)}:  # {where(step.span)}")
        lines += [INDENT + line for line in self._program(step.body, top=False, stack=stack)]
        for last, name in carried_names:
            self._bind(last, name, top)
        return lines
