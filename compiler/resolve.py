"""Stage 2, resolve: imports, `extends` chains, overrides, and parameter values.

The result is one flat model: every parameter evaluated to a constant, every block by name (a
derived model's block replaces its base's), and the train/data/decode sections validated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any, Mapping, Optional

import pydantic

from . import ast
from .diagnostics import COMMAND_LINE, Diagnostics, Span, did_you_mean
from .evaluate import Constant, ConstantError, evaluate
from .parse import parse_expression, parse_text
from .sections import SECTIONS


@dataclass
class ResolvedModel:
    name: str
    span: Span
    params: dict[str, Constant]
    blocks: dict[str, ast.Block]
    sections: dict[str, pydantic.BaseModel]
    ties: list[ast.Tie]  # those whose condition holds
    files: dict[str, str] = field(default_factory=dict)  # path -> source, every file involved
    failed_params: set[str] = field(default_factory=set)  # parameters whose errors are reported


def resolve(
    path: str,
    overrides: Mapping[str, Any],
    diagnostics: Diagnostics,
    source: Optional[str] = None,
    allow_imports: bool = True,
) -> Optional[ResolvedModel]:
    """Load `path` (or `source`, named `path`) and everything it imports, and resolve its model.

    None if a file cannot be parsed or imported; otherwise the model, even when some parameters or
    sections had errors (reported), so that later stages can report theirs too."""
    loader = _Loader(diagnostics, allow_imports)
    entry = loader.load(path, source, import_span=None, stack=())
    if entry is None or diagnostics.errors:
        return None
    chain = loader.chain(entry.model)
    if chain is None:
        return None
    merged = _merge(chain, diagnostics)
    _apply_overrides(merged, overrides, diagnostics)
    params = _evaluate_params(merged, diagnostics)
    sections = _evaluate_sections(merged, params, diagnostics)
    ties = _active_ties(merged.ties, params, diagnostics)
    # Later stages still run after errors here, to report theirs too; they poison failed parameters.
    return ResolvedModel(
        name=entry.model.name.id, span=entry.model.name.span, params=params,
        blocks=merged.blocks, sections=sections, ties=ties,
        files={f.path: f.source for f in loader.files.values()},
        failed_params=set(merged.params) - set(params),
    )


class _Loader:
    """Parses a file and, recursively, its imports; models are then looked up by name."""

    def __init__(self, diagnostics: Diagnostics, allow_imports: bool) -> None:
        self.diagnostics, self.allow_imports = diagnostics, allow_imports
        self.files: dict[str, ast.SpecFile] = {}
        self.models: dict[str, ast.Model] = {}

    def load(self, path: str, source: Optional[str], import_span: Optional[Span],
             stack: tuple[str, ...]) -> Optional[ast.SpecFile]:
        key = str(FilePath(path).resolve()) if source is None else path
        if key in stack:
            cycle = " -> ".join(FilePath(p).name for p in (*stack[stack.index(key):], key))
            self.diagnostics.error("import-cycle", import_span, f"import cycle: {cycle}")
            return None
        if key in self.files:
            return self.files[key]
        if source is None:
            try:
                source = FilePath(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                reason = "not valid UTF-8" if isinstance(error, UnicodeDecodeError) else (
                    error.strerror or str(error))
                if import_span is None:
                    raise FileNotFoundError(f"{path}: {reason}") from None
                written = os.path.relpath(path, FilePath(import_span.file).parent)
                self.diagnostics.error("missing-import", import_span, f"cannot import \"{written}\": {reason}")
                return None
        spec = parse_text(source, path, self.diagnostics)
        if spec is None:
            return None
        self.files[key] = spec
        for imp in spec.imports:
            if not self.allow_imports:
                self.diagnostics.error("import-refused", imp.span, "this spec must be self-contained: it may "
                                       "not import other files", "a checkpoint or run directory carries its "
                                       "resolved spec, imports inlined")
                continue
            target = os.path.normpath(FilePath(path).parent / imp.path)
            self.load(target, None, imp.span, (*stack, key))
        previous = self.models.get(spec.model.name.id)
        if previous is not None and previous is not spec.model:
            self.diagnostics.error("duplicate", spec.model.name.span,
                                   f"model '{spec.model.name.id}' is already defined at {previous.name.span}")
        self.models[spec.model.name.id] = spec.model
        return spec

    def chain(self, model: ast.Model) -> Optional[list[ast.Model]]:
        """[root base, ..., model]: the models whose members are merged, base first."""
        chain = [model]
        while chain[0].base is not None:
            base = chain[0].base
            found = self.models.get(base.id)
            if found is None:
                self.diagnostics.error("unknown-name", base.span, f"unknown model '{base.id}'",
                                       did_you_mean(base.id, self.models) or "import the file that defines it")
                return None
            if found in chain:
                self.diagnostics.error("cycle", base.span, f"model '{base.id}' extends itself")
                return None
            chain.insert(0, found)
        return chain


@dataclass
class _Merged:
    params: dict[str, ast.Param] = field(default_factory=dict)
    blocks: dict[str, ast.Block] = field(default_factory=dict)
    sections: dict[str, dict[str, ast.Entry]] = field(default_factory=dict)
    section_spans: dict[str, Span] = field(default_factory=dict)
    ties: list[ast.Tie] = field(default_factory=list)


def _merge(chain: list[ast.Model], diagnostics: Diagnostics) -> _Merged:
    merged = _Merged()
    for model in chain:
        defined_here: set[str] = set()
        for param in model.params:
            name = param.name.id
            if param.is_override and name not in merged.params:
                diagnostics.error("unknown-name", param.name.span,
                                  f"cannot set '{name}': no such parameter",
                                  did_you_mean(name, merged.params) or "declare it with 'param'")
                continue
            if not param.is_override and name in merged.params:
                where = "in this model" if name in defined_here else "by the model this extends"
                diagnostics.error("duplicate", param.name.span,
                                  f"parameter '{name}' is already defined {where}",
                                  f"use 'set {name} = ...' to change it" if name not in defined_here else None)
                continue
            merged.params[name] = param
            defined_here.add(name)
        blocks_here: set[str] = set()
        for block in model.blocks:
            if block.name.id in blocks_here:
                diagnostics.error("duplicate", block.name.span, f"block '{block.name.id}' is defined twice")
            blocks_here.add(block.name.id)
            merged.blocks[block.name.id] = block  # a derived model's block replaces its base's
        for removal in model.removed:
            for name in removal.names:
                if merged.blocks.pop(name.id, None) is None:
                    diagnostics.error("unknown-name", name.span, f"cannot remove '{name.id}': no such block",
                                      did_you_mean(name.id, merged.blocks))
        for section in model.sections:
            if section.name.id not in SECTIONS:
                diagnostics.error("unknown-name", section.name.span, f"unknown section '{section.name.id}'",
                                  did_you_mean(section.name.id, SECTIONS) or "sections are train, data, decode")
                continue
            entries = merged.sections.setdefault(section.name.id, {})
            merged.section_spans.setdefault(section.name.id, section.name.span)
            for entry in section.entries:
                entries[entry.key.id] = entry
        merged.ties.extend(model.ties)
    return merged


def _apply_overrides(merged: _Merged, overrides: Mapping[str, Any], diagnostics: Diagnostics) -> None:
    """`--set heads=16` / `overrides={"heads": 16, "train.warmup_steps": 400}`."""
    for key, raw in overrides.items():
        value = _override_expr(key, raw, diagnostics)
        if value is None:
            continue
        section, _, entry_key = key.partition(".")
        if entry_key:
            if section not in SECTIONS:
                diagnostics.error("unknown-name", COMMAND_LINE, f"--set {key}: unknown section '{section}'",
                                  did_you_mean(section, SECTIONS))
                continue
            fields = SECTIONS[section].model_fields
            if entry_key not in fields:
                diagnostics.error("unknown-name", COMMAND_LINE,
                                  f"--set {key}: section '{section}' has no key '{entry_key}'",
                                  did_you_mean(entry_key, fields))
                continue
            merged.sections.setdefault(section, {})[entry_key] = ast.Entry(
                ast.Name(entry_key, COMMAND_LINE), value, COMMAND_LINE)
        elif key not in merged.params:
            diagnostics.error("unknown-name", COMMAND_LINE, f"--set {key}: no parameter '{key}' to override",
                              did_you_mean(key, merged.params))
        else:
            old = merged.params[key]
            merged.params[key] = ast.Param(old.name, value, old.span, is_override=True)


def _override_expr(key: str, raw: Any, diagnostics: Diagnostics) -> Optional[ast.Expr]:
    if isinstance(raw, str):
        parsed = parse_expression(raw, "<command line>", Diagnostics())
        # A bare word that is not an expression (`--set positions=learned`) is a string.
        if parsed is None or isinstance(parsed, ast.Name):
            return ast.Literal(raw, COMMAND_LINE)
        return _relocate(parsed)
    if isinstance(raw, (bool, int, float, str)):
        return ast.Literal(raw, COMMAND_LINE)
    if isinstance(raw, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in raw):
        return ast.ListExpr(tuple(ast.Literal(v, COMMAND_LINE) for v in raw), COMMAND_LINE)
    diagnostics.error("type", COMMAND_LINE, f"--set {key}: cannot use a {type(raw).__name__} as a value")
    return None


def _relocate(expr: ast.Expr) -> ast.Expr:
    """Command-line expressions are reported against the command line, not a fake file."""
    if isinstance(expr, ast.Literal):
        return ast.Literal(expr.value, COMMAND_LINE)
    if isinstance(expr, ast.ListExpr):
        return ast.ListExpr(tuple(_relocate(i) for i in expr.items), COMMAND_LINE)
    if isinstance(expr, ast.UnaryOp):
        return ast.UnaryOp(expr.op, _relocate(expr.operand), COMMAND_LINE)
    if isinstance(expr, ast.BinOp):
        return ast.BinOp(expr.op, _relocate(expr.left), _relocate(expr.right), COMMAND_LINE, COMMAND_LINE)
    if isinstance(expr, ast.Name):
        return ast.Name(expr.id, COMMAND_LINE)
    return expr


def _evaluate_params(merged: _Merged, diagnostics: Diagnostics) -> dict[str, Constant]:
    """Evaluate every parameter lazily, so order does not matter and overrides propagate
    (`set d_model = 1024` changes `d_k = d_model / heads`)."""
    values: dict[str, Constant] = {}
    failed: set[str] = set()
    in_progress: list[str] = []

    def lookup(name: ast.Name) -> Constant:
        if name.id in values:
            return values[name.id]
        if name.id in failed:
            raise _AlreadyReported()
        param = merged.params.get(name.id)
        if param is None:
            raise ConstantError("unknown-name", name.span, f"unknown parameter '{name.id}'",
                                did_you_mean(name.id, merged.params))
        if name.id in in_progress:
            cycle = " -> ".join((*in_progress[in_progress.index(name.id):], name.id))
            raise ConstantError("cycle", name.span, f"parameters depend on each other: {cycle}")
        in_progress.append(name.id)
        try:
            values[name.id] = evaluate(param.value, lookup)
        finally:
            in_progress.pop()
        return values[name.id]

    for name, param in merged.params.items():
        if name in values or name in failed:
            continue
        try:
            lookup(param.name)
        except ConstantError as error:
            diagnostics.error(error.code, error.span, error.message, error.hint)
            failed.add(name)
            failed.update(in_progress)
        except _AlreadyReported:
            failed.add(name)
    return values


def _active_ties(ties: list[ast.Tie], params: dict[str, Constant], diagnostics: Diagnostics) -> list[ast.Tie]:
    """The ties whose `if` condition holds (conditions are constants, like every choice in a spec)."""
    active = []
    for tie in ties:
        if tie.condition is None:
            active.append(tie)
            continue
        try:
            enabled = evaluate(tie.condition, lambda n: params[n.id] if n.id in params else _unknown(n, params))
        except ConstantError as error:
            diagnostics.error(error.code, error.span, error.message, error.hint)
            continue
        except _AlreadyReported:
            continue
        if not isinstance(enabled, bool):
            diagnostics.error("type", tie.condition.span, "an if condition must be true or false")
        elif enabled:
            active.append(tie)
    return active


def _unknown(name: ast.Name, params: dict[str, Constant]) -> Constant:
    raise ConstantError("unknown-name", name.span, f"unknown parameter '{name.id}'", did_you_mean(name.id, params))


class _AlreadyReported(Exception):
    """A parameter this one depends on failed; its error is already reported."""


def _evaluate_sections(merged: _Merged, params: dict[str, Constant],
                       diagnostics: Diagnostics) -> dict[str, pydantic.BaseModel]:
    def lookup(name: ast.Name) -> Constant:
        if name.id not in params:
            if name.id in merged.params:
                raise _AlreadyReported()
            raise ConstantError("unknown-name", name.span, f"unknown parameter '{name.id}'",
                                did_you_mean(name.id, params))
        return params[name.id]

    sections: dict[str, pydantic.BaseModel] = {}
    for section_name, schema in SECTIONS.items():
        entries = merged.sections.get(section_name, {})
        values: dict[str, Any] = {}
        for key, entry in entries.items():
            if key not in schema.model_fields:
                diagnostics.error("unknown-name", entry.key.span, f"section '{section_name}' has no key '{key}'",
                                  did_you_mean(key, schema.model_fields))
                continue
            try:
                values[key] = evaluate(entry.value, lookup)
            except ConstantError as error:
                diagnostics.error(error.code, error.span, error.message, error.hint)
            except _AlreadyReported:
                pass
        try:
            sections[section_name] = schema(**values)
        except pydantic.ValidationError as error:
            for problem in error.errors():
                key = str(problem["loc"][0]) if problem["loc"] else ""
                entry = entries.get(key)
                span = entry.value.span if entry else merged.section_spans.get(section_name, COMMAND_LINE)
                diagnostics.error("type", span, f"{section_name}.{key}: {problem['msg']}" if key
                                  else f"{section_name}: {problem['msg'].removeprefix('Value error, ')}")
    return sections
