"""Static facts about block bodies: the names of the modules they create, the values they read and
assign, and what the decoder's cache reaches. The graph builder and the lowering both use them."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Collection, Iterator, Optional

from . import ast
from .diagnostics import Diagnostics
from .opdef import OpDef
from .ops import OPS


def call_site_names(body: tuple[ast.Stmt, ...], blocks: Collection[str]) -> dict[int, str]:
    """Attribute names for the modules a body creates: the `as` label, else the callee's name,
    numbered when it is called more than once (`sublayer_1`, `sublayer_2`). A block named like an op
    without weights (`relu`) is called instead of the op, so its calls are modules too."""
    sites: list[tuple[object, str, Optional[ast.Name]]] = []
    nested: list[tuple[ast.Stmt, ...]] = []

    def visit_expr(expr: ast.Expr) -> None:
        if isinstance(expr, ast.Call):
            op = OPS.get(expr.callee.id)
            if op is None or op.module is not None or expr.callee.id in blocks:
                sites.append((expr, expr.callee.id, expr.label))
            for arg in (*expr.args, *(k.value for k in expr.kwargs)):
                visit_expr(arg)
        elif isinstance(expr, ast.BinOp):
            visit_expr(expr.left)
            visit_expr(expr.right)
        elif isinstance(expr, ast.UnaryOp):
            visit_expr(expr.operand)
        elif isinstance(expr, ast.Index):
            visit_expr(expr.value)
            visit_expr(expr.index)
        elif isinstance(expr, ast.Lambda):
            visit_expr(expr.body)

    def visit(stmts: tuple[ast.Stmt, ...]) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.Assign, ast.Return)):
                visit_expr(stmt.value)
            elif isinstance(stmt, ast.If):
                visit(stmt.then)
                visit(stmt.orelse)
            elif isinstance(stmt, ast.Repeat):
                sites.append((stmt, "layers", stmt.label))
                nested.append(stmt.body)

    visit(body)
    names: dict[int, str] = {}
    labels = {label.id for _, _, label in sites if label}
    counts: dict[str, int] = {}
    for _, base, label in sites:
        if label is None:
            counts[base] = counts.get(base, 0) + 1
    numbered: dict[str, itertools.count] = {}
    for node, base, label in sites:
        if label is not None:  # used twice is an error only if both calls run (see _claim)
            names[id(node)] = label.id
            continue
        if counts[base] == 1 and base not in labels:
            names[id(node)] = base
            continue
        counter = numbered.setdefault(base, itertools.count(1))
        candidate = f"{base}_{next(counter)}"
        while candidate in labels:
            candidate = f"{base}_{next(counter)}"
        names[id(node)] = candidate
    for inner in nested:
        names.update(call_site_names(inner, blocks))
    return names


def single_block_call(stmt: ast.Repeat, blocks: dict[str, ast.Block]) -> Optional[tuple[ast.Call, str]]:
    """`repeat N { x = layer(x, ...) }`: the stack holds the called block itself. Its arguments are
    evaluated where the repeat is, so they may not make modules of their own (`layer(linear(x, 8))`):
    each layer needs its own, which only a layer of the repeat's body can hold."""
    if len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Assign):
        value = stmt.body[0].value
        if isinstance(value, ast.Call) and value.callee.id in blocks and value.label is None and not any(
                _makes_modules(arg, blocks) for arg in (*value.args, *(k.value for k in value.kwargs))):
            return value, stmt.body[0].target.id
    return None


def _makes_modules(expr: ast.Expr, blocks: Collection[str]) -> bool:
    """Whether `expr` calls a block or an op with weights, or makes a function that does."""
    return any(isinstance(node, ast.Call) and (node.callee.id in blocks or (
        node.callee.id in OPS and OPS[node.callee.id].module is not None)) for node in subexpressions(expr))


def subexpressions(expr: ast.Expr) -> Iterator[ast.Expr]:
    """`expr` and every expression inside it, functions' bodies included."""
    pending = [expr]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.Call):
            pending += [*node.args, *(k.value for k in node.kwargs)]
        elif isinstance(node, ast.BinOp):
            pending += [node.left, node.right]
        elif isinstance(node, ast.UnaryOp):
            pending.append(node.operand)
        elif isinstance(node, ast.Lambda):
            pending.append(node.body)
        elif isinstance(node, ast.ListExpr):
            pending += node.items
        elif isinstance(node, ast.Index):
            pending += [node.value, node.index]


def assigned(body: tuple[ast.Stmt, ...]) -> list[str]:
    """The names a body assigns, each once (both branches of an `if` may assign one), in order."""
    names: dict[str, None] = {}  # an ordered set
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            names[stmt.target.id] = None
        elif isinstance(stmt, ast.If):
            names.update(dict.fromkeys(assigned(stmt.then) + assigned(stmt.orelse)))
        elif isinstance(stmt, ast.Repeat):
            names.update(dict.fromkeys(assigned(stmt.body)))
    return list(names)


def ifs_in(body: tuple[ast.Stmt, ...]) -> list[ast.If]:
    """The `if` statements of a body, nested ones (in branches and repeats) too, in order."""
    found: list[ast.If] = []
    for stmt in body:
        if isinstance(stmt, ast.If):
            found += [stmt, *ifs_in(stmt.then), *ifs_in(stmt.orelse)]
        elif isinstance(stmt, ast.Repeat):
            found += ifs_in(stmt.body)
    return found


def reads(expr: ast.Expr) -> list[str]:
    if isinstance(expr, ast.Name):
        return [expr.id]
    if isinstance(expr, ast.Call):
        return [expr.callee.id] + [n for a in (*expr.args, *(k.value for k in expr.kwargs)) for n in reads(a)]
    if isinstance(expr, ast.BinOp):
        return reads(expr.left) + reads(expr.right)
    if isinstance(expr, ast.UnaryOp):
        return reads(expr.operand)
    if isinstance(expr, ast.Lambda):
        return [n for n in reads(expr.body) if n != expr.param.id]
    if isinstance(expr, ast.ListExpr):
        return [n for item in expr.items for n in reads(item)]
    if isinstance(expr, ast.Index):
        return reads(expr.value) + reads(expr.index)
    return []


def stmt_reads(stmt: ast.Stmt) -> list[str]:
    if isinstance(stmt, (ast.Assign, ast.Return)):
        return reads(stmt.value)
    if isinstance(stmt, ast.If):
        return reads(stmt.condition) + [n for s in (*stmt.then, *stmt.orelse) for n in stmt_reads(s)]
    # A repeat also reads the values its layers may pass through unchanged (see passed_through).
    body_reads = [n for s in stmt.body for n in stmt_reads(s)]
    return reads(stmt.count) + body_reads + passed_through(stmt.body, assigned(stmt.body))


def free_names(body: tuple[ast.Stmt, ...]) -> list[str]:
    """Names a body reads before assigning them: the inputs of a repeated body."""
    free: list[str] = []
    written: set[str] = set()
    for stmt in body:
        for name in stmt_reads(stmt):  # a statement may read a name twice: attention(x, x, x)
            if name not in written and name not in free:
                free.append(name)
        written.update(_assigned_on_every_path((stmt,)))
    return free


def passed_through(body: tuple[ast.Stmt, ...], carried: Collection[str]) -> list[str]:
    """The carried values a repeated body may leave as they were: only some branch of an `if` assigns them."""
    every = _assigned_on_every_path(body)
    return [name for name in carried if name not in every]


def _assigned_on_every_path(body: tuple[ast.Stmt, ...]) -> set[str]:
    """Names a body assigns whichever way its `if`s go: one branch's assignment may not run, and then a
    later read is of the value from before the body."""
    names: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            names.add(stmt.target.id)
        elif isinstance(stmt, ast.If):
            names |= _assigned_on_every_path(stmt.then) & _assigned_on_every_path(stmt.orelse)
        elif isinstance(stmt, ast.Repeat):
            names |= _assigned_on_every_path(stmt.body)
    return names


def bound_names(body: tuple[ast.Stmt, ...]) -> list[ast.Name]:
    """The values a body defines: assigned names, function arguments and layer indices (locals of generated
    code, or constants in it)."""
    names: list[ast.Name] = []

    def lambdas(expr: ast.Expr) -> None:
        if isinstance(expr, ast.Lambda):
            names.append(expr.param)
            lambdas(expr.body)
        elif isinstance(expr, ast.Call):
            for a in (*expr.args, *(k.value for k in expr.kwargs)):
                lambdas(a)
        elif isinstance(expr, ast.BinOp):
            lambdas(expr.left)
            lambdas(expr.right)

    for stmt in body:
        if isinstance(stmt, ast.Assign):
            names.append(stmt.target)
            lambdas(stmt.value)
        elif isinstance(stmt, ast.Return):
            lambdas(stmt.value)
        elif isinstance(stmt, ast.If):
            names += bound_names(stmt.then) + bound_names(stmt.orelse)
        elif isinstance(stmt, ast.Repeat):
            names += ([stmt.index] if stmt.index else []) + bound_names(stmt.body)
    return names


def reachable(entry: str, blocks: dict[str, ast.Block]) -> set[str]:
    found: set[str] = set()
    pending = [entry] if entry in blocks else []
    while pending:
        name = pending.pop()
        if name not in found:
            found.add(name)
            pending += [n for s in blocks[name].body for n in stmt_reads(s) if n in blocks]
    return found


def cache_blocks(entry: str, blocks: dict[str, ast.Block]) -> set[str]:
    """The blocks reachable from `entry` that contain, or call a block that contains, an op that
    continues from the decoder cache (attention, positions): their forward() takes the cache."""
    return blocks_using(entry, blocks, lambda op: op.uses_cache)


def token_type_blocks(entry: str, blocks: dict[str, ast.Block]) -> set[str]:
    """The blocks reachable from `entry` that contain, or call a block that contains, an op that reads
    each position's token type (BERT's token type embedding): their forward() takes the token types."""
    return blocks_using(entry, blocks, lambda op: op.reads_token_types)


def blocks_using(entry: str, blocks: dict[str, ast.Block], uses: Callable[[OpDef[Any]], bool]) -> set[str]:
    """The blocks reachable from `entry` that contain, or call a block that contains, an op that `uses`.

    Computed as a fixed point over the call graph rather than by recursion: a chain of hundreds of
    blocks, each calling the next, is a user's mistake to report, not a RecursionError."""
    found = reachable(entry, blocks)
    calls = {name: {n for s in blocks[name].body for n in stmt_reads(s)} for name in found}
    using = {name for name in found if any(uses(OPS[n]) for n in calls[name] if n in OPS and n not in blocks)}
    changed = True
    while changed:
        grown = {name for name in found - using if calls[name] & using}
        changed = bool(grown)
        using |= grown
    return using


def warn_unused(block: ast.Block, diagnostics: Diagnostics) -> None:
    """A value assigned in a block and never read afterwards is dead wiring: usually a typo."""

    def scan(body: tuple[ast.Stmt, ...], later_reads: set[str]) -> None:
        after = set(later_reads)  # names read by the statements after the current one
        for stmt in reversed(body):
            if isinstance(stmt, ast.Assign) and stmt.target.id not in after:
                diagnostics.warning("unused", stmt.target.span,
                                    f"'{stmt.target.id}' is computed but never used")
            elif isinstance(stmt, ast.If):
                scan(stmt.then, after)
                scan(stmt.orelse, after)
            elif isinstance(stmt, ast.Repeat):
                # Loop-carried values are read by the next iteration.
                scan(stmt.body, after | set(free_names(stmt.body)))
            after.update(stmt_reads(stmt))

    scan(block.body, set())
