"""The generated module is checked, as a Python AST, before it is compiled or run.

Lowering builds the module as a syntax tree from checked identifiers and constants, and escapes what it
puts in docstrings and comments; this check, of that tree and of a file's text before it runs, makes that
a verified property rather than a hope. The module
may contain only what the code generator emits:

  - a docstring, and the imports `math`, `torch`, `torch.nn as nn`, `torch.nn.functional as F`,
    `from dataclasses import dataclass` and `from xspec.nn import ...` of the op library's classes;
  - one `@dataclass` config class: a docstring, fields `name: int = 512` (int, float, str, bool,
    tuple; None where computed), and `__post_init__(self)` assigning the computed ones;
  - in a standalone file, instead of that import, classes copied from the library (compiler/library.py),
    each the library's own (compared as ASTs); and classes that only extend several library classes and
    have a docstring;
  - generated `nn.Module` classes whose methods assign, call, loop, branch, define functions (of the
    same statements) and return, over names they bind themselves, the module's classes, and
    `range`/`super`/`int` (a partial rotary width, int(head_dim * fraction)) and `min`/`max` (a config's
    computed field: Qwen2's sliding layers from min(max_window_layers, layers)) — no other builtin, and
    not `torch`; attributes only public ones (plus `super().__init__`); `nn.X`, `F.x` and `math.x`
    only called on the spot, so no module object (`F.torch`) can be reached or stored;
  - literals that are numbers, strings, booleans or None (finite floats only); powers only by a small
    literal exponent (`config.query_pre_attn_scalar ** -0.5`); arithmetic, comparisons, `and`, `or` and
    `not` (a layer's choice, `if (i + 1) % config.sliding_window_pattern != 0:`);
  - `raise ValueError(f"layer {i} ...")`, a string or an f-string of checked expressions (a layer whose
    branch the file was generated without);
  - `isinstance(module, (nn.Linear, Attention))` of a tuple of the module's classes, the library's, and the
    torch.nn modules whose reset_parameters() sets tensors (init_weights() chooses the modules to reset);
  - `Model = SomeGeneratedClass`.

Anything else (a `__import__`, an `eval`, a string that escaped its docstring, a dunder attribute) is
a GeneratedCodeError: a bug in the compiler, which must never run.
"""

from __future__ import annotations

import ast
import math
from types import CodeType
from typing import NoReturn

from .config import MAX_EXPONENT
from .library import MODULE, TORCH_RESETTABLE, is_copy, library_classes

IMPORTS = {("math", None), ("torch", None), ("torch.nn", "nn"), ("torch.nn.functional", "F")}
FROM_IMPORTS = {("dataclasses", "dataclass", None)}
BUILTINS = frozenset({"int", "range", "super", "min", "max"})
# The concat op's, and init_weights()'s tensor of its own for a tied one; torch's others are the library's only.
TORCH_FUNCTIONS = frozenset({"cat", "empty_like"})
LIBRARIES = frozenset({"nn", "F", "math"})  # nn.Linear, F.relu, math.sqrt; torch: the library's only
FIELD_TYPES = frozenset({"int", "float", "str", "bool", "tuple"})
OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.MatMult, ast.FloorDiv, ast.Mod)
COMPARISONS = (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


class GeneratedCodeError(Exception):
    """The generated module contains something the code generator never emits."""


def compile_checked(source: str, filename: str) -> CodeType:
    """The code object of a generated module, compiled from the AST that passed the check."""
    # dont_inherit: this file's `from __future__ import annotations` would make the config's fields strings
    return compile(check_module(source), filename, "exec", dont_inherit=True)


def check_module(source: str | ast.Module) -> ast.Module:
    """The module's tree, checked: `source` as text (a file to run), or the tree lowering built."""
    if isinstance(source, ast.Module):
        tree = source
    else:
        try:
            tree = ast.parse(source)
        except SyntaxError as error:
            raise GeneratedCodeError(f"line {error.lineno}: {error.msg}") from None
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    imported = {alias.name for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == MODULE
                for alias in node.names}
    module_names = classes | imported | {"Model"}
    for index, node in enumerate(tree.body):
        if index == 0 and _is_docstring(node):
            continue
        if isinstance(node, ast.Import):
            if any((alias.name, alias.asname) not in IMPORTS for alias in node.names):
                _refuse(node, "an import other than math, torch, torch.nn and torch.nn.functional")
        elif isinstance(node, ast.ImportFrom) and node.module == MODULE and not node.level:
            if any(alias.name not in library_classes() or alias.asname or alias.name in classes
                   for alias in node.names):
                _refuse(node, f"an import from {MODULE} of something other than its classes, as they are named")
        elif isinstance(node, ast.ImportFrom):
            if node.level or any((node.module, a.name, a.asname) not in FROM_IMPORTS for a in node.names):
                _refuse(node, f"an import other than `from dataclasses import dataclass` and `from {MODULE} import`")
        elif isinstance(node, ast.ClassDef) and node.decorator_list:
            _check_config(node)
        elif isinstance(node, ast.ClassDef):
            if node.name in library_classes():
                if not is_copy(library_classes()[node.name], node):
                    _refuse(node, f"class {node.name} differs from the library's")
            else:
                _check_class(node, module_names)
        elif isinstance(node, ast.Assign):
            target, value = node.targets, node.value
            if not (len(target) == 1 and isinstance(target[0], ast.Name) and target[0].id == "Model"
                    and isinstance(value, ast.Name) and value.id in classes):
                _refuse(node, "a module-level assignment other than Model = <class>")
        else:
            _refuse(node, f"a module-level {type(node).__name__}")
    return tree


def _check_config(node: ast.ClassDef) -> None:
    """The config: `@dataclass`, no base, a docstring and `name: type = constant` fields only."""
    decorator = node.decorator_list[0] if len(node.decorator_list) == 1 else None
    if node.bases or node.keywords or not (isinstance(decorator, ast.Name) and decorator.id == "dataclass"):
        _refuse(node, f"class {node.name} is not a plain dataclass")
    for index, item in enumerate(node.body):
        if index == 0 and _is_docstring(item):
            continue
        if isinstance(item, ast.Pass) and len(node.body) <= 2:
            continue
        if isinstance(item, ast.FunctionDef) and index == len(node.body) - 1:
            _check_post_init(item, node.name)
            continue
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.simple
                and _is_field_type(item.annotation)
                and (isinstance(item.value, (ast.Constant, ast.Tuple)) or (isinstance(item.value, ast.UnaryOp)
                                                                          and isinstance(item.value.op, ast.USub)))):
            _refuse(item, f"a {type(item).__name__} in the config {node.name}")
        _check_expr(item.value, set())


def _is_field_type(node: ast.expr) -> bool:
    """`int`, `tuple`, `tuple[bool, ...]`, or any of them `| None`."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return isinstance(node.right, ast.Constant) and node.right.value is None and _is_field_type(node.left)
    if isinstance(node, ast.Subscript):
        items = node.slice
        return (isinstance(node.value, ast.Name) and node.value.id == "tuple" and isinstance(items, ast.Tuple)
                and len(items.elts) == 2 and isinstance(items.elts[1], ast.Constant) and items.elts[1].value is ...
                and isinstance(items.elts[0], ast.Name) and items.elts[0].id in FIELD_TYPES - {"tuple"})
    return isinstance(node, ast.Name) and node.id in FIELD_TYPES


def _check_post_init(node: ast.FunctionDef, config: str) -> None:
    """`__post_init__(self)`: fields the spec computes from others, each where it is None."""
    arguments = node.args
    if node.name != "__post_init__" or node.decorator_list or node.returns or len(arguments.args) != 1 \
            or arguments.args[0].arg != "self" or arguments.vararg or arguments.kwarg or arguments.kwonlyargs \
            or arguments.posonlyargs or arguments.defaults:
        _refuse(node, f"a method of the config {config} other than __post_init__(self)")

    def check_assignment(statement: ast.stmt) -> None:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Attribute) and _is_self(statement.targets[0].value)):
            _refuse(statement, f"a {type(statement).__name__} in {config}.__post_init__")
        _check_attribute(statement.targets[0], {"self"})
        _check_expr(statement.value, {"self"})

    for statement in node.body:
        if isinstance(statement, ast.If) and not statement.orelse:
            _check_expr(statement.test, {"self"})
            for inner in statement.body:
                check_assignment(inner)
        else:
            check_assignment(statement)


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _check_class(node: ast.ClassDef, module_names: set[str]) -> None:
    base = node.bases[0] if len(node.bases) == 1 else None
    if node.decorator_list or node.keywords or not (
            isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "nn"
            and base.attr == "Module"):
        _refuse(node, f"class {node.name} is not a plain nn.Module")
    for index, item in enumerate(node.body):
        if index == 0 and _is_docstring(item):
            continue
        if not isinstance(item, ast.FunctionDef):
            _refuse(item, f"a {type(item).__name__} in class {node.name}")
        _check_function(item, module_names)


def _check_function(node: ast.FunctionDef, module_names: set[str]) -> None:
    if any(not (isinstance(d, ast.Name) and d.id == "staticmethod") for d in node.decorator_list):
        _refuse(node, "a decorator other than staticmethod")
    _check_body(node, module_names)


def _check_body(node: ast.FunctionDef, outer: set[str]) -> None:
    """A function's statements, over the names it can see: its own locals and those of what encloses it."""
    scope = outer | _parameters(node.args) | _locals(node.body)
    for index, statement in enumerate(node.body):
        if not (index == 0 and _is_docstring(statement)):
            _check_statement(statement, scope)


def _locals(body: list[ast.stmt]) -> set[str]:
    """The names a function's statements bind: assigned, looped over, or defined (a nested function's own
    names are its alone)."""
    names: set[str] = set()
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if not isinstance(node, ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))
    return names


def _parameters(args: ast.arguments) -> set[str]:
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        _refuse(args, "*args, **kwargs or keyword-only arguments")
    for default in args.defaults:
        if not (isinstance(default, ast.Constant) and default.value is None):
            _refuse(default, "an argument default other than None")
    return {a.arg for a in args.args}


def _check_statement(node: ast.stmt, scope: set[str]) -> None:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        _check_expr(node.value, scope)
    elif isinstance(node, ast.Assign) and len(node.targets) == 1:
        _check_target(node.targets[0], scope)
        _check_expr(node.value, scope)
    elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
        _check_target(node.target, scope)
        _check_expr(node.value, scope)
    elif isinstance(node, ast.Return) and node.value is not None:
        _check_expr(node.value, scope)
    elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and not node.orelse:
        _check_expr(node.iter, scope)
        for statement in node.body:
            _check_statement(statement, scope)
    elif isinstance(node, ast.If):
        _check_expr(node.test, scope)
        for statement in (*node.body, *node.orelse):
            _check_statement(statement, scope)
    elif isinstance(node, ast.FunctionDef) and not node.decorator_list and not node.returns:
        _check_body(node, scope)  # a spec function of more than one step
    elif (message := _refusal_message(node)) is not None:  # a branch the file lacks (compiler/layer_choice.py)
        _check_expr(message, scope)
    else:
        _refuse(node, f"a {type(node).__name__} statement")


def _refusal_message(node: ast.stmt) -> ast.expr | None:
    """The message of `raise ValueError(message)`, a string or an f-string; None for any other statement."""
    if not (isinstance(node, ast.Raise) and node.cause is None and isinstance(node.exc, ast.Call)):
        return None
    call = node.exc
    if not (isinstance(call.func, ast.Name) and call.func.id == "ValueError" and len(call.args) == 1
            and not call.keywords and isinstance(call.args[0], (ast.Constant, ast.JoinedStr))):
        return None
    return call.args[0]


def _check_target(node: ast.expr, scope: set[str]) -> None:
    """What an assignment may write: a local name, a tuple of them, or an attribute or item of one."""
    if isinstance(node, ast.Tuple):
        for element in node.elts:
            _check_target(element, scope)
    elif isinstance(node, ast.Name):
        pass  # a local variable of this function
    elif isinstance(node, (ast.Attribute, ast.Subscript)):
        _check_expr(node, scope)
    else:
        _refuse(node, f"an assignment to a {type(node).__name__}")


def _check_expr(node: ast.expr, scope: set[str]) -> None:
    if isinstance(node, ast.Name):
        if node.id not in scope and node.id not in BUILTINS:
            _refuse(node, f"the name {node.id!r} here")
    elif isinstance(node, ast.Attribute):
        _check_attribute(node, scope)
    elif isinstance(node, ast.Call) and _is_class_check(node):  # init_weights(): which modules set tensors
        _check_expr(node.args[0], scope)
        for cls in node.args[1].elts:  # type: ignore[attr-defined]
            if isinstance(cls, ast.Name):
                _check_expr(cls, scope)
    elif isinstance(node, ast.Call):
        if not _is_library_function(node.func):  # nn.Linear(...), F.dropout(...) need no more checking
            _check_expr(node.func, scope)
        for argument in (*node.args, *(k.value for k in node.keywords)):
            _check_expr(argument, scope)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            _refuse(node, "*args or **kwargs in a call")
    elif isinstance(node, ast.Constant):
        value = node.value
        if not (value is None or isinstance(value, (bool, int, str)) or
                (isinstance(value, float) and math.isfinite(value))):
            _refuse(node, f"the constant {value!r}")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        _check_expr(node.operand, scope)
    elif isinstance(node, ast.JoinedStr):  # an f-string: its text, and names or expressions formatted plainly
        for part in node.values:
            if isinstance(part, ast.FormattedValue) and part.conversion == -1 and part.format_spec is None:
                _check_expr(part.value, scope)
            elif not isinstance(part, ast.Constant):
                _refuse(part, "a formatted value with a conversion or a format")
            else:
                _check_expr(part, scope)
    elif isinstance(node, ast.BoolOp):
        for operand in node.values:
            _check_expr(operand, scope)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and _is_small_exponent(node.right):
        _check_expr(node.left, scope)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, OPERATORS):
        _check_expr(node.left, scope)
        _check_expr(node.right, scope)
    elif isinstance(node, ast.Compare) and all(isinstance(op, COMPARISONS) for op in node.ops):
        for operand in (node.left, *node.comparators):
            _check_expr(operand, scope)
    elif isinstance(node, ast.Lambda):
        _check_expr(node.body, scope | _parameters(node.args))
    elif isinstance(node, ast.IfExp):
        for part in (node.test, node.body, node.orelse):
            _check_expr(part, scope)
    elif isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                            for k in node.keys):
        for entry in node.values:
            _check_expr(entry, scope)
    elif isinstance(node, ast.ListComp) and len(node.generators) == 1:
        generator = node.generators[0]
        if not isinstance(generator.target, ast.Name) or generator.ifs or generator.is_async:
            _refuse(node, "a comprehension other than [X() for _ in range(n)]")
        _check_expr(generator.iter, scope)
        _check_expr(node.elt, scope | {generator.target.id})
    elif isinstance(node, (ast.List, ast.Tuple)) and isinstance(node.ctx, ast.Load):
        for element in node.elts:
            _check_expr(element, scope)
    elif isinstance(node, ast.Subscript):  # an item by a whole number or a name (`config.layer_types[i]`)
        _check_expr(node.value, scope)
        _check_expr(node.slice, scope)
    else:
        _refuse(node, f"a {type(node).__name__} expression")


def _check_attribute(node: ast.Attribute, scope: set[str]) -> None:
    owner = node.value
    if isinstance(owner, ast.Name) and owner.id in LIBRARIES:
        _refuse(node, f"{owner.id}.{node.attr} other than called on the spot")
    is_super_init = (node.attr == "__init__" and isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                     and owner.func.id == "super" and not owner.args and not owner.keywords)
    if node.attr.startswith("_") and not is_super_init:
        _refuse(node, f"the private attribute {node.attr!r}")
    _check_expr(owner, scope)


def _is_library_function(node: ast.expr) -> bool:
    """`nn.Linear`, `F.dropout`: a public name of torch.nn or torch.nn.functional; `torch.cat`."""
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
        return False
    if node.value.id == "torch":
        return node.attr in TORCH_FUNCTIONS
    return node.value.id in LIBRARIES and not node.attr.startswith("_")


def _is_class_check(node: ast.Call) -> bool:
    """`isinstance(x, (nn.Linear, Attention))`: a tuple of classes, torch.nn's of those the library's
    TORCH_RESETTABLE names or names the module's scope checks (its classes and the library's)."""
    if not (isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2
            and not node.keywords and isinstance(node.args[1], ast.Tuple)):
        return False
    return all(isinstance(cls, ast.Name) or (isinstance(cls, ast.Attribute) and isinstance(cls.value, ast.Name)
                                             and cls.value.id == "nn" and cls.attr in TORCH_RESETTABLE)
               for cls in node.args[1].elts)


def _is_small_exponent(node: ast.expr) -> bool:
    """A literal number no larger than config.MAX_EXPONENT, or its negation: `x ** -0.5`."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool) and abs(node.value) <= MAX_EXPONENT)


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _refuse(node: ast.AST, what: str) -> NoReturn:
    raise GeneratedCodeError(f"generated code, line {getattr(node, 'lineno', '?')}: {what} is not allowed")
