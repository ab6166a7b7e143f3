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

from xspec.base.text import printable

from . import ast
from .diagnostics import COMMAND_LINE, Diagnostics, Span, did_you_mean
from .evaluate import Constant, ConstantError, check_value, evaluate
from .limits import MAX_FILES, MAX_RESOLVED_BYTES, MAX_RESOLVED_TOKENS, MAX_SOURCE_BYTES, MAX_SOURCE_TOKENS
from .parse import count_tokens, parse_expression, parse_text, quote
from .schedules import check_schedules
from .sections import SECTIONS
from .source import SourceError, read_source


@dataclass
class ResolvedModel:
    name: str
    span: Span
    params: dict[str, Constant]
    # Each parameter's expression as the spec (or a --set) last wrote it: what a config recomputes.
    expressions: dict[str, ast.Expr]
    blocks: dict[str, ast.Block]
    sections: dict[str, pydantic.BaseModel]
    ties: list[ast.Tie]  # those whose condition holds
    files: dict[str, str] = field(default_factory=dict)  # path -> source, every file involved
    written_ties: list[ast.Tie] = field(default_factory=list)  # every tie, with its condition
    failed_params: set[str] = field(default_factory=set)  # parameters whose errors are reported
    choices: dict[str, tuple[Constant, ...]] = field(default_factory=dict)  # the values a parameter may take


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
    choices = _checked_choices(merged, params, diagnostics)
    check_schedules(merged.blocks, merged.ties, merged.written, merged.params, params, diagnostics)
    sections = _evaluate_sections(merged, params, diagnostics)
    ties = _active_ties(merged.ties, params, diagnostics)
    # Later stages still run after errors here, to report theirs too; they poison failed parameters.
    return ResolvedModel(
        name=entry.model.name.id, span=entry.model.name.span, params=params,
        expressions={name: param.value for name, param in merged.params.items()},
        blocks=merged.blocks, sections=sections, ties=ties, written_ties=list(merged.ties),
        files={f.path: f.source for f in loader.files.values()},
        failed_params=set(merged.params) - set(params), choices=choices,
    )


class _Loader:
    """Parses a file and, recursively, its imports; models are then looked up by name."""

    def __init__(self, diagnostics: Diagnostics, allow_imports: bool) -> None:
        self.diagnostics, self.allow_imports = diagnostics, allow_imports
        self.total_bytes = self.total_tokens = 0
        self.files: dict[str, ast.SpecFile] = {}
        self.models: dict[str, ast.Model] = {}

    def load(self, path: str, source: Optional[str], import_span: Optional[Span],
             stack: tuple[str, ...], written: str = "") -> Optional[ast.SpecFile]:
        """Parse `path` (or `source`, named `path`) and, recursively, what it imports. `written` is the
        import's path as the importing file spells it."""
        key = os.path.realpath(path) if source is None and "\0" not in path else path
        if key in stack:
            assert import_span is not None  # the file compiled first is in no import stack
            cycle = " -> ".join(printable(FilePath(p).name) for p in (*stack[stack.index(key):], key))
            self.diagnostics.error("import-cycle", import_span, f"import cycle: {cycle}")
            return None
        if key in self.files:
            return self.files[key]
        if import_span is not None and len(self.files) >= MAX_FILES:
            self.diagnostics.error("too-large", import_span, f"a spec may import at most {MAX_FILES} files")
            return None
        if source is None:
            try:
                source = read_source(path)
            except SourceError as error:
                if import_span is None:
                    raise FileNotFoundError(f"{printable(path)}: {error}") from None
                self.diagnostics.error("missing-import", import_span, f"cannot import \"{printable(written)}\": "
                                       f"{error}")
                return None
        self.total_bytes += len(source.encode("utf-8", "surrogatepass"))
        self.total_tokens += count_tokens(source)
        # A self-contained spec inlines its imports and parameter values, so it may be a little larger.
        max_bytes, max_tokens = ((MAX_SOURCE_BYTES, MAX_SOURCE_TOKENS) if self.allow_imports
                                 else (MAX_RESOLVED_BYTES, MAX_RESOLVED_TOKENS))
        if self.total_bytes > max_bytes or self.total_tokens > max_tokens:
            span = import_span or Span(path, 1, 1, 1, 2)
            self.diagnostics.error("too-large", span, f"the spec's files hold more than {max_bytes // 1024} KiB "
                                   f"or {max_tokens:,} tokens together, the limit for one spec")
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
            if not imp.path.isprintable() or not imp.path:
                self.diagnostics.error("missing-import", imp.span, "an import path must be a file name without "
                                       "control characters")
                continue
            target = os.path.normpath(FilePath(path).parent / imp.path)
            self.load(target, None, imp.span, (*stack, key), imp.path)
        previous = self.models.get(spec.model.name.id)
        if previous is not None and previous is not spec.model:
            self.diagnostics.error("duplicate", spec.model.name.span,
                                   f"model '{spec.model.name.id}' is already defined at "
                                   f"{printable(str(previous.name.span))}")
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
    written: dict[str, list[ast.Param]] = field(default_factory=dict)   # each parameter's lines in the files
    blocks: dict[str, ast.Block] = field(default_factory=dict)
    sections: dict[str, dict[str, ast.Entry]] = field(default_factory=dict)
    section_spans: dict[str, Span] = field(default_factory=dict)
    ties: list[ast.Tie] = field(default_factory=list)
    choices: dict[str, ast.Expr] = field(default_factory=dict)  # `param p = v in [...]`: the list, as written


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
            merged.written.setdefault(name, []).append(param)
            if param.choices is not None:  # a `set` may give a derived model's own
                merged.choices[name] = param.choices
            defined_here.add(name)
        blocks_here: set[str] = set()
        for block in model.blocks:
            if block.name.id in blocks_here:
                diagnostics.error("duplicate", block.name.span, f"block '{block.name.id}' is defined twice")
            blocks_here.add(block.name.id)
            merged.blocks[block.name.id] = block  # a derived model's block replaces its base's
        for removal in model.removed:
            for removed in removal.names:
                if merged.blocks.pop(removed.id, None) is None:
                    diagnostics.error("unknown-name", removed.span, f"cannot remove '{removed.id}': no such block",
                                      did_you_mean(removed.id, merged.blocks))
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
        if not isinstance(key, str) or not key.isprintable() or len(key) > 200:
            diagnostics.error("type", COMMAND_LINE, f"--set: {printable(repr(key))[:200]} is not a parameter "
                              "or section key")
            continue
        value = _override_expr(key, raw, merged.params, diagnostics)
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


def _override_expr(key: str, raw: Any, params: Mapping[str, ast.Param], diagnostics: Diagnostics
                   ) -> Optional[ast.Expr]:
    """An override as an expression. Text is read as a spec expression (`2 * d_model`, `d_k`, `true`), with
    two kindnesses of the command line: True/False in any case are booleans, and any other bare word that
    names no parameter is a string (`--set positions=learned`). Python values are checked like literals."""
    try:
        if isinstance(raw, str):
            check_value(raw, COMMAND_LINE)
            if raw.strip().lower() in ("true", "false"):
                return ast.Literal(raw.strip().lower() == "true", COMMAND_LINE)
            parsed = parse_expression(raw, "<command line>", Diagnostics())
            if parsed is None or (isinstance(parsed, ast.Name) and parsed.id not in params):
                _check_text_may_be(key, raw, params.get(key))
                return ast.Literal(raw, COMMAND_LINE)
            return _relocate(parsed)
        if isinstance(raw, (bool, int, float)):
            return ast.Literal(check_value(raw, COMMAND_LINE), COMMAND_LINE)
        if isinstance(raw, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in raw):
            return ast.ListExpr(tuple(ast.Literal(check_value(v, COMMAND_LINE), COMMAND_LINE) for v in raw),
                                COMMAND_LINE)
    except ConstantError as error:
        diagnostics.error(error.code, COMMAND_LINE, f"--set {key}: {error.message}", error.hint)
        return None
    diagnostics.error("type", COMMAND_LINE, f"--set {key}: cannot use a {type(raw).__name__} as a value")
    return None


def _check_text_may_be(key: str, raw: str, old: Optional[ast.Param]) -> None:
    """Refuses text read as a string (no expression, or a bare word) where the spec writes the parameter as
    a number or a truth value: said at the command line, not where the spec first computes with it."""
    value = old.value.value if old is not None and isinstance(old.value, ast.Literal) else None
    if isinstance(value, bool):
        raise ConstantError("type", COMMAND_LINE, f"{quote(raw)} is not true or false, as {key} is")
    if isinstance(value, (int, float)):
        raise ConstantError("type", COMMAND_LINE, f"{quote(raw)} is not a number, as {key} is ({value})")


def _relocate(expr: ast.Expr) -> ast.Expr:
    """Command-line expressions are reported against the command line, not a fake file."""
    if isinstance(expr, ast.Literal):
        return ast.Literal(expr.value, COMMAND_LINE)
    if isinstance(expr, ast.ListExpr):
        return ast.ListExpr(tuple(_relocate(i) for i in expr.items), COMMAND_LINE)
    if isinstance(expr, ast.Index):
        return ast.Index(_relocate(expr.value), _relocate(expr.index), COMMAND_LINE)
    if isinstance(expr, ast.UnaryOp):
        return ast.UnaryOp(expr.op, _relocate(expr.operand), COMMAND_LINE)
    if isinstance(expr, ast.BinOp):
        return ast.BinOp(expr.op, _relocate(expr.left), _relocate(expr.right), COMMAND_LINE, COMMAND_LINE)
    if isinstance(expr, ast.Name):
        return ast.Name(expr.id, COMMAND_LINE)
    if isinstance(expr, ast.Call):  # sqrt(-1); a call of an op or a lambda is refused, at the command line too
        label = ast.Name(expr.label.id, COMMAND_LINE) if expr.label else None
        return ast.Call(ast.Name(expr.callee.id, COMMAND_LINE), tuple(_relocate(a) for a in expr.args),
                        tuple(ast.Keyword(k.name, _relocate(k.value), COMMAND_LINE) for k in expr.kwargs), label,
                        COMMAND_LINE)
    assert isinstance(expr, ast.Lambda), expr
    return ast.Lambda(ast.Name(expr.param.id, COMMAND_LINE), _relocate(expr.body), COMMAND_LINE)


def _checked_choices(merged: _Merged, params: dict[str, Constant], diagnostics: Diagnostics
                     ) -> dict[str, tuple[Constant, ...]]:
    """Each parameter declared with the values it may take (`param pooling = "cls" in ["cls", "mean"]`): the
    list, a constant one, and the parameter's final value (a `set`'s or a --set's) among them, or each item of
    a schedule; else an error at that value. A parameter that fails is left out of `params`, so later stages
    do not build with it."""
    checked = {}
    for name, written in merged.choices.items():
        try:
            allowed = evaluate(written, lambda n: params[n.id] if n.id in params else _unknown(n, params))
        except ConstantError as error:
            diagnostics.error(error.code, error.span, error.message, error.hint)
            continue
        except _AlreadyReported:
            continue
        if not isinstance(allowed, tuple) or not allowed:
            diagnostics.error("type", written.span, f"the values '{name}' may take must be a list of at least one")
            continue
        checked[name] = allowed
        if name not in params:
            continue
        value = params[name]
        # A schedule (a list of one value per layer) takes its items from the choices.
        items = value if isinstance(value, tuple) and not any(isinstance(v, tuple) for v in allowed) else (value,)
        itemwise = items is value
        outside = [item for item in items if not any(type(item) is type(v) and item == v for v in allowed)]
        if outside:
            written = merged.params[name].value
            given = "--set " if written.span is COMMAND_LINE else ""
            what = f"holds {_spelled(outside[0])}; it may hold" if itemwise else f"is {_spelled(value)}; it may be"
            diagnostics.error("value", written.span, f"{given}{name} {what} {_either(allowed)}")
            del params[name]
    return checked


def _either(values: tuple[Constant, ...]) -> str:
    """`"cls" or "mean"`, `1, 2 or 4`."""
    shown = [_spelled(value) for value in values]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


def _spelled(value: Constant) -> str:
    """A value as a spec writes it (`"mean"`, `true`, `4`), escaped for the terminal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return printable(quote(value))
    return "a list" if isinstance(value, tuple) else repr(value)


def _evaluate_params(merged: _Merged, diagnostics: Diagnostics) -> dict[str, Constant]:
    """Evaluate every parameter after the ones it reads, so order does not matter and overrides
    propagate (`set d_model = 1024` changes `d_k = d_model / heads`).

    The order comes from a depth-first walk with an explicit stack: a chain of thousands of
    parameters, each reading the last, must not exhaust Python's recursion limit."""
    values: dict[str, Constant] = {}
    failed: set[str] = set()

    def lookup(name: ast.Name) -> Constant:
        if name.id in values:
            return values[name.id]
        if name.id in failed:
            raise _AlreadyReported()
        raise ConstantError("unknown-name", name.span, f"unknown parameter '{name.id}'",
                            did_you_mean(name.id, merged.params))

    def evaluate_one(name: str) -> None:
        try:
            values[name] = evaluate(merged.params[name].value, lookup)
        except ConstantError as error:
            # A --set value's error names the --set: the command line may hold several.
            given = merged.params[name].value.span is COMMAND_LINE and not error.message.startswith("--set ")
            diagnostics.error(error.code, error.span, f"--set {name}: {error.message}" if given else error.message,
                              error.hint)
            failed.add(name)
        except _AlreadyReported:
            failed.add(name)

    for root in merged.params:
        if root in values or root in failed:
            continue
        path = [root]  # parameters being evaluated, each reading the next
        pending = [iter(_names_read(merged.params[root].value))]
        while pending:
            name = next(pending[-1], None)
            if name is None:
                pending.pop()
                evaluate_one(path.pop())
            elif name.id in path:
                cycle = " -> ".join((*path[path.index(name.id):], name.id))
                diagnostics.error("cycle", name.span, f"parameters depend on each other: {cycle}")
                failed.update(path)
                path.clear()
                pending.clear()
            elif name.id in merged.params and name.id not in values and name.id not in failed:
                path.append(name.id)
                pending.append(iter(_names_read(merged.params[name.id].value)))
    return values


def _names_read(expr: ast.Expr) -> list[ast.Name]:
    """The names a constant expression reads, in evaluation order (function names excluded)."""
    found: list[ast.Name] = []
    pending = [expr]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Name):
            found.append(node)
        elif isinstance(node, ast.ListExpr):
            pending.extend(reversed(node.items))
        elif isinstance(node, ast.Index):
            pending.extend((node.index, node.value))
        elif isinstance(node, ast.UnaryOp):
            pending.append(node.operand)
        elif isinstance(node, ast.BinOp):
            pending.extend((node.right, node.left))
        elif isinstance(node, ast.Call):
            pending.extend(reversed([*node.args, *(k.value for k in node.kwargs)]))
    return found


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
                given = entries.get(key)
                span = given.value.span if given else merged.section_spans.get(section_name, COMMAND_LINE)
                diagnostics.error("type", span, f"{section_name}.{key}: {problem['msg']}" if key
                                  else f"{section_name}: {problem['msg'].removeprefix('Value error, ')}")
    return sections
