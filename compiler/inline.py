"""Spec functions called once, written in place of their call.

`mix = h => attention(h, h, h)` and then `x = x + mix(norm(x))` would lower to a nested def and its call.
Where a forward calls a function once (an `if` that binds it in each branch, a layer's class chosen by
branch), its steps take the call's place, reading the argument where they read the parameter, so the
forward reads as one written by hand: `h = self.input_layernorm(x)`, `x = x + self.self_attn(h, h, h)`.
The steps keep their nodes and modules (nothing in the state dict moves) and take the call's spec line,
where they now run. A function passed to a block, or called twice, stays a function.
"""

from __future__ import annotations

from dataclasses import replace

from .ir import Instance, Operand, Program, Step

INLINED_KINDS = {"op", "block", "apply", "function"}  # a body of these is straight-line code


def inline_called_once(root: Instance) -> None:
    """Every block's forward in the module tree with its once-called functions inlined."""
    pending = [root]
    while pending:
        instance = pending.pop()
        pending += instance.children.values()
        if instance.kind == "block":
            instance.program = inlined(instance.program)


def inlined(program: Program) -> Program:
    """`program` with each function it defines and calls once (and nothing else reads) in place of the call."""
    steps = [replace(step, body=inlined(step.body)) if step.body is not None else step for step in program.steps]
    once = {step.outputs[0]: step for step in steps
            if _straight_line(step) and _called_once(step.outputs[0], steps, program)}
    hints = dict(program.hints)
    renamed: dict[str, Operand] = {}   # a call's result -> what the function's steps return
    written: list[Step] = []
    for step in steps:
        if step.kind == "function" and step.outputs[0] in once:
            continue  # written where it is called
        step = step.reading(renamed)
        function = once.get(str(step.inputs["fn"])) if step.kind == "apply" else None
        if function is None or function.body is None:
            written.append(step)
            continue
        (name, param), = function.body.params.items()
        argument = step.inputs["x"]
        body = {param: argument}
        written += [replace(inner.reading(body), span=step.span) for inner in function.body.steps]
        for ref, hint in function.body.hints.items():
            hints.setdefault(ref, hint)
        hints.setdefault(str(argument), name)  # the value takes the parameter's name where it has none
        (returned,) = function.body.results
        result = body.get(returned, returned) if isinstance(returned, str) else returned
        (out,) = step.outputs
        renamed[out] = result
        if out in hints and isinstance(result, str):
            hints[result] = hints[out]  # the name the caller gave the result
    results = tuple(renamed.get(r, r) if isinstance(r, str) else r for r in program.results)
    return Program(dict(program.params), written, results, hints)


def _straight_line(step: Step) -> bool:
    """A function whose body is straight-line code returning one value."""
    body = step.body
    return (step.kind == "function" and body is not None and len(body.params) == 1 and len(body.results) == 1
            and all(inner.kind in INLINED_KINDS for inner in body.steps))


def _called_once(ref: str, steps: list[Step], program: Program) -> bool:
    """Whether one step reads the function `ref`, an apply of it to a value, and nothing else does."""
    readers = [step for step in steps if ref in step.inputs.values()]
    nested = any(ref in step.body.reads() for step in steps if step.body is not None)
    return (len(readers) == 1 and readers[0].kind == "apply" and readers[0].inputs.get("fn") == ref
            and isinstance(readers[0].inputs.get("x"), str) and len(readers[0].outputs) == 1
            and list(readers[0].inputs.values()).count(ref) == 1 and not nested and ref not in program.results)
