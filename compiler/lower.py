"""Stage 5, lower: emit a readable PyTorch module from the module tree and its programs (compiler/ir.py).

One class per distinct block (identical instances share a class), and in each `forward` one line per
step of its program, with a comment naming the spec line it comes from: an op, a block call, a spec
function (a nested `def`, or a `lambda` for one step), a function's call, and a repeated stack as one
`for` loop over an `nn.ModuleList`. Lowering reads the graph's nodes and the programs, never the spec's
syntax. Names in the output are identifiers the graph builder checked (compiler/names.py), or made here
from them; constants are emitted with `repr`; text from the spec (file names, string values) is escaped
for the docstring or comment it lands in, and the finished module's AST is checked (compiler/codecheck.py)
before anything compiles or runs it.
"""

from __future__ import annotations

import re

from .codecheck import check_module
from .diagnostics import printable
from .entries import DECODER, ENCODER
from .forward import file_label, forward_lines, identifier, where
from .ir import Instance
from .names import class_name
from .ops import OPS
from .prune import prelude_classes
from .resolve import ResolvedModel
from .validate import ValidatedModel

INDENT = "    "


def _preludes_used(code: str, always: set[str], features: frozenset[str]) -> list[str]:
    """The prelude classes the generated `code` names (`RMSNorm(`, not `nn.RMSNorm(`), in the prelude's
    order, each cut to the `features` the model uses. Prelude classes construct none of each other (an
    attention's rotary embedding is built by the generated code and passed in), so these are all the
    file needs."""
    return [prelude.source(features) for name, prelude in prelude_classes().items()
            if name in always or re.search(rf"(?<![\w.]){name}\b", code)]


def lower(model: ResolvedModel, validated: ValidatedModel) -> str:
    source = _Lowering(model, validated).module_source()
    check_module(source)
    return source


def _docstring(text: str) -> str:
    """A docstring holding `text` verbatim (quotes and backslashes escaped, control characters shown)."""
    lines = [printable(line).replace("\\", "\\\\").replace('"', '\\"') for line in text.split("\n")]
    return '"""' + "\n".join(lines) + '"""'


class _Lowering:
    def __init__(self, model: ResolvedModel, validated: ValidatedModel) -> None:
        self.model, self.validated = model, validated
        self.graph = validated.graph.graph
        self.classes: dict[str, str] = {}  # class body (named "{NAME}") -> class name
        self.class_of: dict[str, str] = {}  # instance path -> class name
        self.layer_classes: dict[str, list[str]] = {}  # stack path -> the class of each layer
        self.order: list[str] = []  # class sources in definition order
        self.model_class = class_name(model.name, set(prelude_classes()))

    def module_source(self) -> str:
        root = self.validated.graph.root
        for child in root.children.values():
            self._define(child, child.name)
        model_class = self._model_class()
        features = frozenset().union(*(OPS[node.op].features(node.attrs, node.inferred) for node in self.graph))
        preludes = _preludes_used("".join(self.order) + model_class,
                                  {"DecoderCache"} if DECODER in root.children else set(), features)
        parts = [self._header(), *preludes, *self.order, model_class]
        return "\n\n\n".join(p.rstrip("\n") for p in parts) + "\n"

    # --- classes ------------------------------------------------------------------------------
    def _define(self, instance: Instance, base: str) -> str:
        """Emit the class of a block instance (children first) and return its name. `base` is the
        block's name, from which the class is named (`encoder_layer` -> `EncoderLayer`)."""
        for child in instance.children.values():
            if child.kind == "block":
                self._define(child, child.block_name or f"{base}_layer")
            elif child.kind == "stack":
                # Layers differ where the first changes the width the others see (`x = linear(x, 4)` on
                # 8 features), or a value carried from layer to layer changes what a layer computes.
                self.layer_classes[child.path] = [self._define(item, item.block_name or f"{base}_layer")
                                                  for item in child.children.values()]
        body = self._class_body(instance)
        name = self.classes.get(body)
        if name is None:
            # Not a name another class, a prelude class, the model class or the code's own names have.
            name = class_name(base, {*self.classes.values(), *prelude_classes(), self.model_class})
            self.classes[body] = name
            self.order.append(body.replace("{NAME}", name, 1))
        self.class_of[instance.path] = name
        return name

    def _class_body(self, instance: Instance) -> str:
        doc = (f"Block '{instance.block_name}' ({where(instance.block_span)})." if instance.block_span
               else f"One layer of the repeat at {where(instance.span)}.")
        lines = ["class {NAME}(nn.Module):", INDENT + _docstring(doc), "", f"{INDENT}def __init__(self):",
                 f"{INDENT * 2}super().__init__()"]
        for name, child in instance.children.items():
            lines.append(f"{INDENT * 2}self.{identifier(name)} = {self._constructor(child)}"
                         f"  # {where(child.span)}")
        lines += ["", *(INDENT + line for line in forward_lines(self.graph, instance))]
        return "\n".join(lines) + "\n"

    def _constructor(self, child: Instance) -> str:
        if child.kind == "op":
            assert child.node is not None
            node = self.graph[child.node]
            return OPS[node.op].module(node.attrs, node.inferred)
        if child.kind == "stack":
            classes = self.layer_classes[child.path]
            if len(set(classes)) == 1:
                return f"nn.ModuleList([{classes[0]}() for _ in range({len(classes)!r})])"
            return f"nn.ModuleList([{', '.join(f'{name}()' for name in classes)}])"  # flat: no deep expression
        return f"{self.class_of[child.path]}()"

    # --- the file around the classes ----------------------------------------------------------
    def _header(self) -> str:
        params = "\n".join(f"    {name} = {value!r}" for name, value in self.model.params.items())
        doc = (f"Model '{self.model.name}', generated by xspec from {file_label(self.model.span.file)}.\n\n"
               f"Edit the spec, not this file. Trainable parameters: {self.validated.parameter_count:,}.\n"
               f"Resolved parameters:\n{params}\n")
        return (_docstring(doc) + "\n\n"
                "import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n")

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
        lines += [f"{_attribute(tied)} = {_attribute(owner)}  # tie, {spec_file}:{line_of[tied]}"
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
        losses = sorted({OPS[node.op].auxiliary_loss for node in self.validated.graph.graph} - {""})
        if losses:  # e.g. a mixture of experts' load balancing, which the trainer adds to the loss
            lines += ["", f"{INDENT}def auxiliary_loss(self):",
                      f'{INDENT * 2}"""The training loss the model adds to its own, from its last forward."""',
                      f"{INDENT * 2}return {' + '.join(f'{identifier(c)}.auxiliary_loss(self)' for c in losses)}"]
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
        code += f"[{int(part)}]" if part.isdigit() else f".{identifier(part)}"
    return code
