"""Stage 5, lower: emit a readable PyTorch module from the module tree and its programs (compiler/ir.py).

One class per distinct block (identical instances share a class; the layers of a stack that a block
makes differently by their index share one that takes the index, compiler/layer_choice.py), and in each
`forward` one line per step of its program, with a comment naming the spec line it comes from: an op, a
block call, a spec function (a nested `def`), a function's call, and a repeated stack as one `for` loop
over an `nn.ModuleList`. Lowering reads the graph's nodes and the programs; of the spec's syntax, only
the condition of an `if` by which a layer's block chooses its modules. Names in the output are
identifiers the graph builder checked (compiler/names.py), or made here from them; constants are
emitted with `repr`; text from the spec (file names, string values) is escaped for the docstring or
comment it lands in, and the finished module's AST is checked (compiler/codecheck.py) before anything
compiles or runs it.
"""

from __future__ import annotations

import functools
import itertools
import re
from typing import Callable, Optional

from xspec.base.text import printable

from .code_reads import attributes_read, config_argument, names_used
from .codecheck import check_module
from .config import ConfigNames, condition_source, config_fields, derived_field
from .diagnostics import Span
from .entries import DECODER, ENCODER
from .forward import Arguments, Context, file_label, forward_lines, identifier, inline_calls, literal, where
from .ir import Instance
from .layer_choice import branch_guards, guarded_layer_class, layer_class_by_index
from .names import class_name, local_name_problem, module_name_problem
from .ops import OPS
from .library import MODULE, library_classes, with_bases
from .resolve import ResolvedModel
from .shapes import TensorType
from .validate import ValidatedModel
from .wrap import INDENT, LINE_LIMIT, assignment, wrap, wrapped

# torch's modules a generated file may import, as it names them.
MODULES = (("torch", "torch"), ("torch.nn as nn", "nn"), ("torch.nn.functional as F", "F"))
SHAPE_COMMENT = re.compile(r"  # \w*\[[^\]]*\]  ")  # `  # [batch, src_len, d_model]  base.xspec:33`


class Lowered:
    """The generated module: `source` imports the op library (`from xspec.nn import ...`); `standalone`
    copies the library classes it uses instead and depends on torch alone (made, and checked, when first
    asked for: most compilations never write it)."""

    def __init__(self, source: str, standalone: Callable[[], str]) -> None:
        self.source = source
        self._standalone = standalone

    @functools.cached_property
    def standalone(self) -> str:
        text = self._standalone()
        check_module(text)
        return text


def _library_used(named: set[str], combined: dict[str, tuple[str, ...]]) -> set[str]:
    """The library classes among the names generated code uses (`RMSNorm(`, not `nn.RMSNorm(`), and the
    pieces of the file's classes `combined` of several. Library classes construct none of each other (an
    attention's rotary embedding is built by the generated code and passed in), so the file needs these
    and, where it copies them, the classes they extend."""
    return (named & set(library_classes())) | {piece for pieces in combined.values() for piece in pieces}


def _library_import(names: set[str]) -> str:
    """`from xspec.nn import A, B`, the names packed in parentheses where one line is too long."""
    listed = ", ".join(sorted(names))
    line = f"from {MODULE} import {listed}"
    return line if len(line) < LINE_LIMIT else "\n".join(wrapped(f"from {MODULE} import ({listed})", "", split=True))


def _combined(name: str, pieces: tuple[str, ...]) -> str:
    """A class of the generated file that is the library classes `pieces` together."""
    # Where too long, the bases hang one level deeper than the body, as a long `def` line's arguments do.
    first, *rest = wrapped(f"class {name}({', '.join(pieces)})", INDENT)
    header = "\n".join([first.removeprefix(INDENT), *rest]) + ":"
    names = ", ".join(piece.removesuffix("Attention") for piece in pieces)
    return f'{header}\n{INDENT}"""{names}: each piece above."""\n'


def lower(model: ResolvedModel, validated: ValidatedModel) -> Lowered:
    lowered = _Lowering(model, validated).module_sources()
    check_module(lowered.source)
    return lowered


def _docstring(text: str) -> str:
    """A docstring holding `text` verbatim (quotes and backslashes escaped, control characters shown)."""
    lines = [printable(line).replace("\\", "\\\\").replace('"', '\\"') for line in text.split("\n")]
    return '"""' + "\n".join(lines) + '"""'


class _Lowering:
    def __init__(self, model: ResolvedModel, validated: ValidatedModel) -> None:
        self.model, self.validated = model, validated
        self.graph = validated.graph.graph
        self.classes: dict[str, str] = {}  # class body (named "{NAME}", no shapes) -> class name
        self.class_of: dict[str, str] = {}  # instance path -> class name
        self.bodies: dict[str, str] = {}  # class name -> its source
        self.layer_classes: dict[str, list[str]] = {}  # stack path -> the class of each layer
        self.indexed: dict[str, str] = {}  # stack path -> the name its layers' one class takes the index by
        self.order: list[str] = []  # class sources in definition order
        # Classes of the file that combine library classes (an attention's pieces), by name.
        composed = dict(OPS[node.op].composes(node.attrs, node.inferred) for node in self.graph)
        self.combined = {name: pieces for name, pieces in composed.items() if len(pieces) > 1}
        self.library = {*library_classes(), *self.combined}  # names generated classes do not take
        self.model_class = class_name(model.name, self.library)
        self.config_class = class_name(f"{model.name}_config", {*self.library, self.model_class})
        self.fields = config_fields(model.params)
        self.names = ConfigNames(self.fields)
        self.widths: dict[str, str] = {}  # node id -> its output's last size, as generated code writes it
        self.holders: dict[str, dict[str, tuple[str, Span]]] = {}  # instance -> constructor -> attribute, line
        self.context = Context(self.graph, validated.graph.tensors, self.names,
                               inline_calls(validated.graph.root), self._holder)

    def module_sources(self) -> Lowered:
        root = self.validated.graph.root
        for child in root.children.values():
            self._define(child, child.name)
        model_class = self._model_class()
        used = names_used(*self.order, model_class)
        combined = {name: pieces for name, pieces in self.combined.items() if name in used}
        library = _library_used(used, combined)
        composites = [_combined(name, pieces) for name, pieces in sorted(combined.items())]
        classes = ["\n".join(wrapped for line in body.split("\n") for wrapped in _rewrap(line)) for body in self.order]
        generated = [*composites, *classes, model_class]
        config = self._config(self.order)
        copies = [library_classes()[name].source for name in with_bases(library)]
        return Lowered(self._module([config, *generated], library),
                       lambda: self._module([config, *copies, *generated], set()))

    def _module(self, body: list[str], imported: set[str]) -> str:
        """The file: its docstring, the imports `body` reads (a file reads clean under a linter), `body`."""
        doc = (f"Model '{self.model.name}' ({self.validated.parameter_count:,} parameters), generated by xspec "
               f"from\n{file_label(self.model.span.file)}: edit the spec, not this file.")
        standard = ["import math"] if attributes_read(*body, owner="math") else []
        torch = [f"import {module}" for module, name in MODULES if attributes_read(*body, owner=name)]
        library = ["", _library_import(imported)] if imported else []
        header = "\n".join([_docstring(doc), "", *standard, "from dataclasses import dataclass", "", *torch, *library])
        return "\n\n\n".join(p.rstrip("\n") for p in [header, *body]) + "\n"

    # --- classes ------------------------------------------------------------------------------
    def _define(self, instance: Instance, base: str) -> str:
        """Emit the class of a block instance (children first) and return its name. `base` is the
        block's name, from which the class is named (`encoder_layer` -> `EncoderLayer`)."""
        self._define_children(instance, base)
        return self._register(instance, base, self._class_body(instance))

    def _define_children(self, instance: Instance, base: str) -> None:
        for child in instance.children.values():
            if child.kind == "block" and child.path not in self.context.inline:
                self._define(child, child.block_name or f"{base}_layer")
            elif child.kind == "stack":
                self.layer_classes[child.path] = self._define_layers(child, base)

    def _define_layers(self, stack: Instance, base: str) -> list[str]:
        """The class of each layer of a stack. Layers differ where the first changes the width the others
        see (`x = linear(x, 4)` on 8 features), a value carried from layer to layer changes what a layer
        computes, or the block chooses modules by the layer's index: those are one class that takes the
        index (compiler/layer_choice.py)."""
        layers = list(stack.children.values())
        bases = [item.block_name or f"{base}_layer" for item in layers]
        for item, item_base in zip(layers, bases):
            self._define_children(item, item_base)
        bodies = [self._class_body(item) for item in layers]
        keys = [SHAPE_COMMENT.sub("  # ", body) for body in bodies]
        if stack.index_param is not None and layers[0].block_name is not None:
            block = self.model.blocks[layers[0].block_name]
            guards = branch_guards(block, stack.index_param, len(layers), self.fields)
            if len(set(keys)) > 1:
                merged = layer_class_by_index(block, stack.index_param, layers, bodies, keys, self.fields,
                                              self.combined, {piece: option for op in OPS.values() for piece, option
                                                              in op.optional_pieces.items()}, guards)
            else:
                merged = guarded_layer_class(bodies[0], stack.index_param, guards) if guards else None
            if merged is not None:
                name = self._register(layers[0], bases[0], merged)
                for item in layers:
                    self.class_of[item.path] = name
                self.indexed[stack.path] = stack.index_param
                return [name] * len(layers)
        return [self._register(item, item_base, body) for item, item_base, body in zip(layers, bases, bodies)]

    def _register(self, instance: Instance, base: str, body: str) -> str:
        """The class of `body`: one written before with the same code (its shape comments merged), or a new
        one named after `base`."""
        key = SHAPE_COMMENT.sub("  # ", body)  # layers that differ only in their lengths share a class
        name = self.classes.get(key)
        if name is not None:
            index = self.order.index(self.bodies[name])
            merged = _merge_shapes(self.order[index], body.replace("{NAME}", name, 1))
            self.bodies[name] = self.order[index] = merged
        else:
            # Not a name another class, a library class, the model class or the code's own names have.
            name = class_name(base, {*self.classes.values(), *self.library, self.model_class,
                                     self.config_class})
            self.classes[key] = name
            self.bodies[name] = body.replace("{NAME}", name, 1)
            self.order.append(self.bodies[name])
        self.class_of[instance.path] = name
        return name

    def _class_body(self, instance: Instance) -> str:
        doc = (f"block {instance.block_name}, {where(instance.block_span)}" if instance.block_span
               else f"a layer of the repeat at {where(instance.span)}")
        forward = forward_lines(self.context, instance)  # first: it names the modules it needs held
        lines = [f"{INDENT}def __init__(self, config):", f"{INDENT * 2}super().__init__()"]
        for name, child in instance.children.items():
            constructor = self._constructor(child)
            if constructor is not None:
                lines.append(f"{INDENT * 2}self.{identifier(name)} = {constructor}  # {where(child.span)}")
        for constructor, (attribute, span) in self.holders.get(instance.path, {}).items():
            lines.append(f"{INDENT * 2}self.{attribute} = {constructor}  # {where(span)}")
        lines += ["", *(INDENT + line for line in forward)]  # wrapped once classes are merged (module_source)
        return "\n".join([f"class {{NAME}}(nn.Module):  # {doc}", *lines]) + "\n"

    def _constructor(self, child: Instance) -> Optional[str]:
        if child.kind == "op":
            assert child.node is not None
            node = self.graph[child.node]
            module = OPS[node.op].module
            assert module is not None
            return module(node.attrs, node.inferred, Arguments(node, self._width))
        if child.kind == "stack":
            classes = self.layer_classes[child.path]
            count = child.count_source or literal(len(classes))
            if child.path in self.indexed:
                index = self.indexed[child.path]
                return f"nn.ModuleList([{classes[0]}(config, {index}) for {index} in range({count})])"
            if len(set(classes)) == 1:
                return f"nn.ModuleList([{classes[0]}(config) for _ in range({count})])"
            # flat: no deep expression
            return f"nn.ModuleList([{', '.join(f'{name}(config)' for name in classes)}])"
        if child.path in self.context.inline:  # its steps are written in the caller: it holds its modules
            modules = {name: self._constructor(c) for name, c in child.children.items()}
            if not modules:
                return None
            return "nn.ModuleDict({" + ", ".join(f"{literal(n)}: {c}" for n, c in modules.items()) + "})"
        return f"{self.class_of[child.path]}(config)"

    def _holder(self, instance: Instance, node_id: str, constructor: str) -> str:
        """The attribute of `instance`'s class that holds a parameter-free module: named after the spec's
        parameter it reads (`self.dropout = nn.Dropout(config.dropout)`), else after the op."""
        held = self.holders.setdefault(instance.path, {})
        if constructor not in held:
            base = config_argument(constructor) or self.graph[node_id].op
            taken = {*instance.children, *(attribute for attribute, _ in held.values())}
            name = base
            for n in itertools.count(2):
                if name not in taken and module_name_problem(name) is None and local_name_problem(name) is None:
                    break
                name = f"{base}_{n}"
            held[constructor] = (name, self.graph[node_id].span)
        return held[constructor][0]

    def _width(self, node_id: str) -> str:
        """The last size of a node's output as the spec's expressions give it: the attribute of the op that
        made it (OpDef.width), through the ops that keep an input's (a norm, attention, an addition). A
        graph input's reads the one parameter of its value, if one only."""
        pending = [node_id]
        while pending:
            node = self.graph[pending[-1]]
            if node.id in self.widths:
                pending.pop()
                continue
            own, size = OPS[node.op].width, node.checked_shape().dims[-1]
            kept = [source for source in node.inputs.values()
                    if (self.graph[source].shape or TensorType(())).dims[-1:] == (size,)]
            if own is not None:
                self.widths[node.id] = Arguments(node, self._width).attr(own)
            elif not kept:
                self.widths[node.id] = self.names.size(size)
            elif kept[0] in self.widths:
                self.widths[node.id] = self.widths[kept[0]]
            else:
                pending.append(kept[0])  # its input's first (a stack of thousands of layers: no recursion)
                continue
            pending.pop()
        return self.widths[node_id]

    # --- the file around the classes ----------------------------------------------------------
    def _config(self, classes: list[str]) -> str:
        """The spec's parameters that the code reads, as a dataclass (nanoGPT's GPTConfig): every class
        takes it. A parameter the spec computes from others (`d_k = d_model / heads`) is None unless
        given and computed from them after (`__post_init__`), so an edited config builds what --set builds."""
        derived = self._derived_fields()  # name -> (Python over `self`, the fields it reads)
        used = set(attributes_read(*classes, owner="config")) & set(self.fields)
        pending = [name for name in used if name in derived]
        while pending:  # and the parameters the computed ones read
            for name in derived[pending.pop()][1]:
                if name not in used:
                    used.add(name)
                    pending += [name] if name in derived else []
        fields = [_field(name, value, computed=name in derived) for name, value in self.fields.items()
                  if name in used]
        doc = f"The parameters of {file_label(self.model.span.file)} that sizes and rates are read from."
        lines = ["@dataclass", f"class {self.config_class}:", INDENT + _docstring(doc), "",
                 *(fields or [f"{INDENT}pass"])]
        computed = [name for name in _dependency_order(derived) if name in used]
        if computed:
            lines += ["", f"{INDENT}def __post_init__(self):  # None: computed from the others, as the spec does"]
            for name in computed:
                line = f"self.{name} = {derived[name][0]} if self.{name} is None else self.{name}"
                if len(INDENT * 2 + line) < LINE_LIMIT:
                    lines.append(INDENT * 2 + line)
                else:
                    lines += [f"{INDENT * 2}if self.{name} is None:",
                              *assignment(f"self.{name}", derived[name][0], INDENT * 3)]
        return "\n".join(lines)

    def _derived_fields(self) -> dict[str, tuple[str, list[str]]]:
        """The config's fields the spec computes from other fields: name -> Python over `self` (with only the
        parentheses Python needs), and the fields it reads."""
        derived = {}
        for name, value in self.fields.items():
            expression = self.model.expressions.get(name)
            code = derived_field(expression, value, self.fields) if expression is not None else None
            if code is not None:
                derived[name] = (condition_source(code), attributes_read(code, owner="self"))
        return derived

    def _tie_lines(self) -> list[str]:
        """One assignment per tied tensor, except where a tensor of every layer of a stack is tied to the
        first layer's: one loop over the stack for it (a tied stack of 9,000 layers is a few lines)."""
        ties, line_of = dict(self.validated.ties), self.validated.tie_lines
        spec_file = file_label(self.model.span.file)
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
                lines.append(f"for layer in {_attribute(stack)}:  # tie, {spec_file}:{written}")
                lines += [f"{INDENT}{_attribute(o[len(first):]).replace('self', 'layer', 1)} = {_attribute(o)}"
                          for o in shared]
        for tied, owner in ties.items():
            comment = f"  # tie, {spec_file}:{line_of[tied]}"
            line = f"{_attribute(tied)} = {_attribute(owner)}{comment}"
            if len(INDENT * 2 + line) >= LINE_LIMIT:  # the shared tensor first, then the assignment
                lines.append(f"shared = {_attribute(owner)}{comment}")
                line = f"{_attribute(tied)} = shared{comment}"
            lines.append(line)
        return lines

    def _model_class(self) -> str:
        root = self.validated.graph.root
        name = self.model_class
        has_encoder, has_decoder = ENCODER in root.children, DECODER in root.children
        methods = ", ".join([*(["encode"] if has_encoder else []), *(["decode"] if has_decoder else []), "forward"])
        lines = [f"class {name}(nn.Module):  # the whole model: {methods}",
                 f"{INDENT}def __init__(self, config=None):", f"{INDENT * 2}super().__init__()",
                 f"{INDENT * 2}config = config if config is not None else {self.config_class}()"]
        for child in root.children.values():
            lines.append(f"{INDENT * 2}self.{child.name} = {self.class_of[child.path]}(config)")
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
                      f"{INDENT * 2}return logits"]
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


def _field(name: str, value: object, computed: bool) -> str:
    """A config field (None where `__post_init__` computes it); a list's items packed on the lines after it
    where one line would be too long."""
    return "\n".join(wrapped(f"{name}: {type(value).__name__} = {'None' if computed else literal(value)}", INDENT))


def _dependency_order(derived: dict[str, tuple[str, list[str]]]) -> list[str]:
    """The computed fields, each after the computed fields it reads."""
    order: list[str] = []

    def visit(name: str, seen: tuple[str, ...]) -> None:
        if name in order or name in seen:
            return
        for read in derived[name][1]:
            if read in derived:
                visit(read, (*seen, name))
        order.append(name)

    for name in derived:
        visit(name, ())
    return order


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
        code += f"[{int(part)}]" if part.isdigit() else f".{identifier(part)}"
    return code


def _rewrap(line: str) -> list[str]:
    """A forward's line that is too long, wrapped at its outermost call."""
    if len(line) < LINE_LIMIT or "  # " not in line:
        return [line]
    code, comment = line.rsplit("  # ", 1)
    indent = code[:len(code) - len(code.lstrip())]
    return wrap(code.strip(), comment, indent)


def _merge_shapes(first: str, second: str) -> str:
    """The class source `first`, its shape comments naming both instances' dimensions where they differ
    (`[batch, src_len|tgt_len, d_model]`). The two are the same code line for line."""
    mine_lines, their_lines = first.split("\n"), second.split("\n")
    assert len(mine_lines) == len(their_lines), "classes merged from different code"
    lines = []
    for mine, theirs in zip(mine_lines, their_lines):
        a, b = SHAPE_COMMENT.search(mine), SHAPE_COMMENT.search(theirs)
        if a and b and a.group() != b.group() and len(_dims(a.group())) == len(_dims(b.group())):
            dims = [x if y in x.split("|") else f"{x}|{y}" for x, y in zip(_dims(a.group()), _dims(b.group()))]
            mine = mine.replace(a.group(), "  # [" + ", ".join(dims) + "]  ")
        lines.append(mine)
    return "\n".join(lines)


def _dims(comment: str) -> list[str]:
    return comment.split("[", 1)[1].split("]", 1)[0].split(", ")
