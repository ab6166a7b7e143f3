"""Stage 5, lower: emit a readable PyTorch module from the validated model.

One class per distinct block (identical instances share a class), straight-line `forward`s with
one line per spec statement and a comment naming that line, repeated stacks as `nn.ModuleList`s
iterated in a loop. Names in the output are identifiers the graph builder checked (compiler/names.py),
constants are emitted with `repr`, text from the spec (file names, string values) is escaped for the
docstring or comment it lands in, and the finished module's AST is checked (compiler/codecheck.py)
before anything compiles or runs it.
"""

from __future__ import annotations

import ast as pyast
import functools
import keyword
from pathlib import Path as FilePath

from . import ast
from .body import reads
from .codecheck import check_module
from .diagnostics import Span, printable
from .evaluate import MATH_FUNCTIONS, evaluate
from .graph import Closure, Instance, Recorded, Tensor
from .names import class_name
from .entries import DECODER, ENCODER
from .ops import OPS, callable_op
from .resolve import ResolvedModel
from .validate import ValidatedModel

INDENT = "    "
PRELUDE = FilePath(__file__).with_name("prelude.py")


@functools.cache
def _prelude_classes() -> dict[str, str]:
    """Class name -> source, read from prelude.py as text (compiling a spec does not import torch)."""
    text = PRELUDE.read_text()
    return {node.name: pyast.get_source_segment(text, node) or ""
            for node in pyast.parse(text).body if isinstance(node, pyast.ClassDef)}


def lower(model: ResolvedModel, validated: ValidatedModel) -> str:
    source = _Lowering(model, validated).module_source()
    check_module(source)
    return source


def _identifier(name: str) -> str:
    assert name.isidentifier() and not keyword.iskeyword(name), f"not a plain identifier: {name!r}"
    return name


@functools.cache
def _file_label(path: str) -> str:
    """A spec file's name as comments show it (a file name may hold any character: escaped)."""
    return printable(FilePath(path).name)


def _docstring(text: str) -> str:
    """A docstring holding `text` verbatim (quotes and backslashes escaped, control characters shown)."""
    lines = [printable(line).replace("\\", "\\\\").replace('"', '\\"') for line in text.split("\n")]
    return '"""' + "\n".join(lines) + '"""'


class _Lowering:
    def __init__(self, model: ResolvedModel, validated: ValidatedModel) -> None:
        self.model, self.validated = model, validated
        self.graph = validated.graph.graph
        self.names = validated.graph.names
        self.classes: dict[str, str] = {}  # class body (named "{NAME}") -> class name
        self.class_of: dict[str, str] = {}  # instance path -> class name
        self.layer_classes: dict[str, list[str]] = {}  # stack path -> the class of each layer
        # Where the forward being lowered stands: the statement's index, and each local's last assignment.
        self.statement_index = 0
        self.last_assigned: dict[str, int] = {}
        self.order: list[str] = []  # class sources in definition order
        self.model_class = class_name(model.name, set(_prelude_classes()))

    def module_source(self) -> str:
        root = self.validated.graph.root
        for child in root.children.values():
            self._define(child, child.name)
        used = "".join(self.order)
        preludes = [source for name, source in _prelude_classes().items()
                    if f"{name}(" in used or (name == "DecoderCache" and DECODER in root.children)]
        parts = [self._header(), *preludes, *self.order, self._model_class()]
        return "\n\n\n".join(p.rstrip("\n") for p in parts) + "\n"

    # --- classes ------------------------------------------------------------------------------
    def _define(self, instance: Instance, base: str) -> str:
        """Emit the class of a block instance (children first) and return its name. `base` is the
        block's name, from which the class is named (`encoder_layer` -> `EncoderLayer`)."""
        for child in instance.children.values():
            if child.kind == "block":
                self._define(child, child.block.name.id if child.block else f"{base}_layer")
            elif child.kind == "stack":
                # Layers differ where the first changes the width the others see (`x = linear(x, 4)` on
                # 8 features), or a value carried from layer to layer changes what a layer computes.
                self.layer_classes[child.path] = [
                    self._define(item, item.block.name.id if item.block else f"{base}_layer")
                    for item in child.children.values()]
        body = self._class_body(instance)
        name = self.classes.get(body)
        if name is None:
            # Not a name another class, a prelude class, the model class or the code's own names have.
            name = class_name(base, {*self.classes.values(), *_prelude_classes(), self.model_class})
            self.classes[body] = name
            self.order.append(body.replace("{NAME}", name, 1))
        self.class_of[instance.path] = name
        return name

    def _class_body(self, instance: Instance) -> str:
        doc = (f"Block '{instance.block.name.id}' ({self._where(instance.block.span)})." if instance.block
               else f"One layer of the repeat at {self._where(instance.span)}.")
        lines = ["class {NAME}(nn.Module):", INDENT + _docstring(doc), "", f"{INDENT}def __init__(self):",
                 f"{INDENT * 2}super().__init__()"]
        for name, child in instance.children.items():
            lines.append(f"{INDENT * 2}self.{_identifier(name)} = {self._constructor(child)}"
                         f"  # {self._where(child.span)}")
        args = ", ".join(["self", *(_identifier(p) for p in instance.params)] +
                         (["cache=None"] if instance.has_cache else []))
        lines += ["", f"{INDENT}def forward({args}):"]
        self.last_assigned = self._last_assignments(instance)
        for index, recorded in enumerate(instance.statements):
            self.statement_index = index
            lines += [INDENT * 2 + line for line in self._statement(instance, recorded)]
        if instance.outputs:
            lines.append(f"{INDENT * 2}return {', '.join(_identifier(o) for o in instance.outputs)}")
        return "\n".join(lines) + "\n"

    def _last_assignments(self, instance: Instance) -> dict[str, int]:
        """Each local a forward assigns -> the index of the last statement that assigns it."""
        last: dict[str, int] = {}
        for index, recorded in enumerate(instance.statements):
            stmt = recorded.stmt
            if isinstance(stmt, ast.Assign):
                last[stmt.target.id] = index
            elif isinstance(stmt, ast.Repeat):
                stack = instance.children[self.names[id(stmt)]]
                single = stmt.body[0] if stack.repeat_single_call else None
                for name in [single.target.id] if isinstance(single, ast.Assign) else stack.children["0"].outputs:
                    last[name] = index
        return last

    def _constructor(self, child: Instance) -> str:
        if child.kind == "op":
            node = self.graph[child.node]
            return OPS[node.op].module(node.attrs, node.inferred)
        if child.kind == "stack":
            classes = self.layer_classes[child.path]
            if len(set(classes)) == 1:
                return f"nn.ModuleList([{classes[0]}() for _ in range({len(classes)!r})])"
            return f"nn.ModuleList([{', '.join(f'{name}()' for name in classes)}])"  # flat: no deep expression
        return f"{self.class_of[child.path]}()"

    # --- statements and expressions -----------------------------------------------------------
    def _statement(self, instance: Instance, recorded: Recorded) -> list[str]:
        stmt, env = recorded.stmt, recorded.env
        comment = f"  # {self._where(stmt.span)}"
        if isinstance(stmt, ast.Assign):
            return [f"{_identifier(stmt.target.id)} = {self._expr(instance, env, stmt.value)[0]}{comment}"]
        if isinstance(stmt, ast.Return):
            return [f"return {self._expr(instance, env, stmt.value)[0]}{comment}"]
        assert isinstance(stmt, ast.Repeat)
        stack = instance.children[self.names[id(stmt)]]
        first = stack.children["0"]
        cache = ", cache=cache" if first.has_cache and instance.has_cache else ""
        if stack.repeat_single_call:
            assign = stmt.body[0]
            assert isinstance(assign, ast.Assign) and isinstance(assign.value, ast.Call)
            args = self._call_args(instance, env, assign.value, first)
            call_line = f"{_identifier(assign.target.id)} = layer({args}{cache})"
        else:
            outputs = ", ".join(_identifier(o) for o in first.outputs) or "_"
            call_line = f"{outputs} = layer({', '.join(_identifier(p) for p in first.params)}{cache})"
        return [f"for layer in self.{_identifier(stack.name)}:{comment}", INDENT + call_line]

    def _expr(self, instance: Instance, env: dict, expr: ast.Expr) -> tuple[str, int]:
        """Python code for `expr`, and its precedence (100: atomic, lower: needs parentheses)."""
        if not _reads_runtime_value(expr, env, self.model.blocks):
            return repr(self._constant(env, expr)), 100
        if isinstance(expr, ast.Name):
            return _identifier(expr.id), 100
        if isinstance(expr, ast.Lambda):
            if (instance.path, id(expr)) in self.validated.graph.uncalled:
                return "None", 100
            inner = {**env, expr.param.id: Tensor("")}
            function = f"lambda {_identifier(expr.param.id)}: {self._expr(instance, inner, expr.body)[0]}"
            # A spec's function sees values as they were when it was made; a Python closure would see a
            # local assigned again later (`y = linear(y, 4)` after `f = h => h + y`): bind those now.
            kept = sorted(n for n in set(reads(expr)) if self.last_assigned.get(n, -1) >= self.statement_index
                          and isinstance(env.get(n), (Tensor, Closure)))
            if kept:
                return f"(lambda {', '.join(map(_identifier, kept))}: {function})({', '.join(kept)})", 100
            return function, 0
        if isinstance(expr, ast.BinOp):
            return self._infix(instance, env, expr)
        assert isinstance(expr, ast.Call), f"unexpected runtime expression {expr}"
        return self._call(instance, env, expr), 100

    def _infix(self, instance: Instance, env: dict, expr: ast.BinOp) -> tuple[str, int]:
        node = self.graph[instance.call_nodes[id(expr)]]
        op = OPS[node.op]
        if len(op.inputs) == 1:  # a tensor and a constant: `x * 2.0`
            tensor_side = expr.left if _reads_runtime_value(expr.left, env, self.model.blocks) else expr.right
            text, prec = self._expr(instance, env, tensor_side)
            inputs = {"x": f"({text})" if prec < op.precedence else text}
        else:
            (left, lp), (right, rp) = self._expr(instance, env, expr.left), self._expr(instance, env, expr.right)
            inputs = {"a": f"({left})" if lp < op.precedence else left,
                      "b": f"({right})" if rp <= op.precedence else right}
        return op.call("", inputs, node.attrs, None), op.precedence

    def _call(self, instance: Instance, env: dict, call: ast.Call) -> str:
        name = call.callee.id
        if isinstance(env.get(name), Closure):
            return f"{_identifier(name)}({self._expr(instance, env, call.args[0])[0]})"
        if name in self.model.blocks:
            child = instance.children[self.names[id(call)]]
            cache = ", cache=cache" if child.has_cache and instance.has_cache else ""
            return f"self.{_identifier(child.name)}({self._call_args(instance, env, call, child)}{cache})"
        assert callable_op(name), f"unexpected call {name}"
        node = self.graph[instance.call_nodes[id(call)]]
        op = OPS[node.op]
        arguments = self.validated.graph.arguments[node.id]
        inputs = {i.name: self._expr(instance, env, arguments[i.name])[0] for i in op.inputs if i.name in arguments}
        target = self.names[id(call)] if op.module is not None else ""
        cache = "cache" if op.uses_cache and instance.has_cache else None
        return op.call(_identifier(target) if target else "", inputs, node.attrs, cache)

    def _call_args(self, instance: Instance, env: dict, call: ast.Call, callee: Instance) -> str:
        """The arguments of a block call that its forward() takes (tensors and functions), in its order."""
        names = [p.id for p in self.model.blocks[call.callee.id].params]
        bound = {**dict(zip(names, call.args)), **{k.name: k.value for k in call.kwargs}}
        return ", ".join(self._expr(instance, env, bound[name])[0] for name in callee.params)

    def _constant(self, env: dict, expr: ast.Expr):
        return evaluate(expr, lambda n: env[n.id] if n.id in env else self.model.params[n.id])

    # --- the file around the classes ----------------------------------------------------------
    def _where(self, span: Span) -> str:
        """`base.xspec:41`, for comments and docstrings."""
        return f"{_file_label(span.file)}:{span.line}"

    def _header(self) -> str:
        params = "\n".join(f"    {name} = {value!r}" for name, value in self.model.params.items())
        doc = (f"Model '{self.model.name}', generated by xspec from {_file_label(self.model.span.file)}.\n\n"
               f"Edit the spec, not this file. Trainable parameters: {self.validated.parameter_count:,}.\n"
               f"Resolved parameters:\n{params}\n")
        return (_docstring(doc) + "\n\n"
                "import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n")

    def _tie_lines(self) -> list[str]:
        """One assignment per tied tensor, except where a tensor of every layer of a stack is tied to the
        first layer's: one loop over the stack for it (a tied stack of 9,000 layers is a few lines)."""
        ties, line_of = dict(self.validated.ties), self.validated.tie_lines
        where = printable(FilePath(self.model.span.file).name)
        lines = []
        for stack, count in _stack_sizes(self.validated.graph.root).items():
            first, shared = f"{stack}.0.", []
            for owner in sorted({o for o in ties.values() if o.startswith(first)}):
                layers = [f"{stack}.{i}.{owner[len(first):]}" for i in range(1, count)]
                if count > 2 and all(ties.get(t) == owner for t in layers):
                    shared.append(owner)
                    for tensor in layers:
                        del ties[tensor]
            if shared:  # layer 0 assigns its own tensors to itself: harmless
                written = line_of[f"{stack}.1.{shared[0][len(first):]}"]
                lines.append(f"for layer in {_attribute(stack)}:  # tie, {where}:{written}")
                lines += [f"{INDENT}{_attribute(o[len(first):]).replace('self', 'layer', 1)} = {_attribute(o)}"
                          for o in shared]
        lines += [f"{_attribute(tied)} = {_attribute(owner)}  # tie, {where}:{line_of[tied]}"
                  for tied, owner in ties.items()]
        return lines

    def _model_class(self) -> str:
        root = self.validated.graph.root
        name = self.model_class
        has_encoder, has_decoder = ENCODER in root.children, DECODER in root.children
        lines = [f"class {name}(nn.Module):", f'{INDENT}"""The whole model: encode, decode, forward."""', "",
                 f"{INDENT}def __init__(self):", f"{INDENT * 2}super().__init__()"]
        for child in root.children.values():
            lines.append(f"{INDENT * 2}self.{child.name} = {self.class_of[child.path]}()")
        lines += [INDENT * 2 + line for line in self._tie_lines()]
        if has_encoder:
            lines += ["", f"{INDENT}def encode(self, src_tokens, src_padding_mask=None):",
                      f'{INDENT * 2}"""[B, S] tokens, [B, S] True at padding -> [B, S, d_model] memory."""',
                      f"{INDENT * 2}return self.encoder(src_tokens, src_padding_mask)"]
        if has_decoder:
            memory_args = ", memory, memory_padding_mask=None" if has_encoder else ""
            decoder_args = ", memory, memory_padding_mask" if has_encoder else ""
            lines += ["", f"{INDENT}def decode(self, tgt_tokens{memory_args}, cache=None):",
                      f'{INDENT * 2}"""[B, T] tokens -> [B, T, vocab] logits; with a cache, only the new tokens."""',
                      f"{INDENT * 2}logits = self.decoder(tgt_tokens{decoder_args}, cache=cache)",
                      f"{INDENT * 2}if cache is not None:",
                      f"{INDENT * 3}cache.length += tgt_tokens.size(1)",
                      f"{INDENT * 2}return logits",
                      "", f"{INDENT}@staticmethod", f"{INDENT}def new_cache():", f"{INDENT * 2}return DecoderCache()"]
        if has_encoder and has_decoder:
            forward = ["def forward(self, src_tokens, tgt_tokens, src_padding_mask=None):",
                       f"{INDENT}memory = self.encode(src_tokens, src_padding_mask)",
                       f"{INDENT}return self.decode(tgt_tokens, memory, src_padding_mask)"]
        elif has_decoder:
            forward = ["def forward(self, tgt_tokens):", f"{INDENT}return self.decode(tgt_tokens)"]
        else:
            forward = ["def forward(self, src_tokens, src_padding_mask=None):",
                       f"{INDENT}return self.encode(src_tokens, src_padding_mask)"]
        lines += ["", *(INDENT + line for line in forward), "", "", f"Model = {name}"]
        return "\n".join(lines)


def _stack_sizes(instance: Instance) -> dict[str, int]:
    """Every repeated stack under `instance`: its path and its number of layers."""
    sizes: dict[str, int] = {}
    pending = [instance]
    while pending:
        node = pending.pop()
        if node.kind == "stack":
            sizes[node.path] = len(node.children)
        pending += node.children.values()
    return sizes


def _attribute(path: str) -> str:
    """`decoder.layers.0.embed.weight` -> `self.decoder.layers[0].embed.weight`."""
    code = "self"
    for part in path.split("."):
        code += f"[{int(part)}]" if part.isdigit() else f".{_identifier(part)}"
    return code


def _reads_runtime_value(expr: ast.Expr, env: dict, blocks: dict) -> bool:
    """Whether `expr` involves a tensor or a function (else it is a constant, emitted as a literal)."""
    if isinstance(expr, ast.Name):
        return isinstance(env.get(expr.id), (Tensor, Closure))
    if isinstance(expr, ast.Lambda):
        return True
    if isinstance(expr, ast.Call):
        name = expr.callee.id
        is_math = name in MATH_FUNCTIONS and name not in env and name not in blocks
        return not is_math or any(_reads_runtime_value(a, env, blocks) for a in expr.args)
    if isinstance(expr, ast.BinOp):
        return _reads_runtime_value(expr.left, env, blocks) or _reads_runtime_value(expr.right, env, blocks)
    if isinstance(expr, ast.UnaryOp):
        return _reads_runtime_value(expr.operand, env, blocks)
    return False
