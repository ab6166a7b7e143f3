"""The compiler's driver: parse -> resolve -> graph -> validate -> lower, each stage a module of its own."""

from __future__ import annotations

import functools
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping, Optional

from .diagnostics import Diagnostics, TooManyErrors
from .flatten import TooLarge, flatten
from .graph import build_graph
from .ir import lint_programs
from .limits import MAX_RESOLVED_BYTES
from .lower import Lowered, lower
from .resolve import ResolvedModel, resolve
from .validate import ValidatedModel, lint, validate


# Generated modules by what they were compiled from (the files' texts, the entry file, the overrides): a
# process that compiles one spec again (loading a run, a test) lowers it once.
LOWERED_KEPT = 32
_lowered: OrderedDict[str, Lowered] = OrderedDict()


@dataclass
class Compilation:
    model: ResolvedModel
    validated: ValidatedModel
    resolved_source: str  # the spec as one self-contained text (compiler/flatten.py)
    diagnostics: Diagnostics  # warnings (a compilation with errors raises instead)
    inputs: str = ""  # a digest of what it was compiled from: the files, the entry, the overrides

    @cached_property
    def lowered(self) -> Lowered:
        """The generated module (importing the op library, or standalone), made when first asked for: a
        spec checked, counted or drawn but never built is never lowered."""
        kept = _lowered.get(self.inputs) if self.inputs else None
        if kept is not None:
            _lowered.move_to_end(self.inputs)
            return kept
        lowered = lower(self.model, self.validated, functools.partial(_built_with, self.model))
        if self.inputs:
            _lowered[self.inputs] = lowered
            while len(_lowered) > LOWERED_KEPT:
                _lowered.popitem(last=False)
        return lowered

    @property
    def python_source(self) -> str:
        return self.lowered.source


def _built_with(model: ResolvedModel, forced: Mapping[int, bool]) -> Optional[ValidatedModel]:
    """`model` built and validated with the `if` statements `forced` taking the branches given (the branches
    no layer takes, which lowering writes too); None where that model does not check."""
    diagnostics = Diagnostics()
    try:
        built = build_graph(model, diagnostics, forced)
        return validate(model, built, diagnostics) if built is not None else None
    except TooManyErrors:
        return None


class CompileFailed(Exception):
    def __init__(self, diagnostics: Diagnostics) -> None:
        super().__init__(diagnostics.render())
        self.diagnostics = diagnostics


def compile_spec(path: str, overrides: Optional[Mapping[str, Any]] = None,
                 source: Optional[str] = None, allow_imports: bool = True) -> Compilation:
    """Run every stage; raise CompileFailed with all the diagnostics the stages could find.

    `allow_imports=False` is for specs that must be self-contained (a checkpoint's or a run's)."""
    diagnostics = Diagnostics()
    try:
        model = resolve(path, overrides or {}, diagnostics, source, allow_imports)
        built = build_graph(model, diagnostics) if model is not None else None
        if built is not None:
            lint(built.graph)
            lint_programs(built.root, built.graph)
        # Shapes are only inferred over a graph without errors (a partial one would mislead).
        validated = validate(model, built, diagnostics) if built is not None and model is not None else None
    except TooManyErrors:
        raise CompileFailed(diagnostics) from None
    if validated is None or model is None:
        raise CompileFailed(diagnostics)
    try:
        resolved = flatten(model, MAX_RESOLVED_BYTES)
    except TooLarge:
        # A run directory and a checkpoint keep this text; it must compile again.
        diagnostics.error("too-large", model.span, f"the resolved spec (parameters as values, imports inlined) "
                          f"takes more than {MAX_RESOLVED_BYTES // 1024} KiB, the limit for a self-contained spec",
                          "long string parameters are the usual cause")
        raise CompileFailed(diagnostics)
    inputs = json.dumps([path, sorted(model.files.items()), repr(sorted((overrides or {}).items(), key=repr))])
    return Compilation(model, validated, resolved, diagnostics, hashlib.sha256(inputs.encode()).hexdigest())
