"""Grammar-aware generation of whole specs.

A spec is drawn from the language's structure: parameters with arithmetic, blocks whose bodies
assign, branch (`if`/`else`), stack (`repeat N as name`) and return, calls to every op and to other
blocks, lambdas (`h => ...`), `as` labels, the entry blocks of an encoder-decoder, a language model or an
encoder alone, ties and the train/data/decode sections. Left alone, the writer keeps widths, domains
(source or target positions) and causality consistent, so the model compiles; a drawn *wildness* bends
individual choices towards what the compiler must refuse: extreme values, reserved names, wrong arities,
mismatched widths, non-causal decoder attention, hostile strings, misspelled names.

Hypothesis draws the model's form, its wildness and a seed; the seed drives the many small choices
inside (sizes, names, statements), which would cost more than the compile as Hypothesis draws.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from hypothesis import strategies as st

from .atoms import (EXTREME_NUMBERS, FILE_NAMES, HOSTILE_CHARACTERS, HOSTILE_STRINGS, INVALID_STRINGS,
                    MISSPELLED_NAMES, RESERVED_NAMES)

FORMS = ("encoder-decoder", "language model", "encoder")
# Most specs are drawn clean (and compile); the rest with a chance per choice of going wrong.
WILDNESS = (0.0, 0.0, 0.0, 0.0, 0.01, 0.03, 0.08, 0.2)


@dataclass(frozen=True)
class Sizes:
    d_model: int
    heads: int
    d_k: int
    d_ff: int
    vocab: int
    layers: int
    dropout: float
    max_len: int
    norm_first: bool
    positions: str
    tie: bool


def random_sizes(rng: random.Random) -> Sizes:
    heads = rng.choice((1, 2, 3, 4))
    d_k = rng.choice((1, 2, 4))
    return Sizes(
        d_model=heads * d_k * rng.choice((1, 1, 1, 2)), heads=heads, d_k=d_k,
        d_ff=rng.choice((2, 4, 8, 16)),
        vocab=rng.randrange(2, 41),
        layers=rng.randrange(1, 4),
        dropout=rng.choice((0.0, 0.1, 0.3)),
        max_len=rng.choice((1, 2, 3, 8, 64, 1024)),
        norm_first=rng.random() < 0.5,
        positions=rng.choice(("sinusoidal", "learned")),
        tie=rng.random() < 0.5,
    )


@st.composite
def specs(draw) -> tuple[str, str]:
    """(file name, text) of one generated spec. Hypothesis draws the form, the wildness and a seed for
    the hundreds of choices after them (drawing each through Hypothesis would cost more than compiling)."""
    form = draw(st.sampled_from(FORMS))
    wildness = draw(st.sampled_from(WILDNESS))
    rng = random.Random(draw(st.integers(0, 2**64 - 1)))
    return rng.choice(FILE_NAMES), _Writer(rng, wildness, random_sizes(rng)).model(form)


# --- the writer -----------------------------------------------------------------------------------

SRC, TGT, OWN, OTHER = "src", "tgt", "own", "other"  # position domains; OWN/OTHER inside a block the entries call


@dataclass
class _Scope:
    """What a block body can read at this point: tensors by domain, masks, functions, constants."""

    tensors: dict[str, str] = field(default_factory=dict)  # name -> domain
    masks: dict[str, str] = field(default_factory=dict)  # name -> domain
    functions: list[str] = field(default_factory=list)  # each called at most once on a path
    tokens: dict[str, str] = field(default_factory=dict)
    decoding: bool = False  # inside the decoder: self-attention must be causal

    def copy(self) -> "_Scope":
        return _Scope(dict(self.tensors), dict(self.masks), list(self.functions), dict(self.tokens), self.decoding)

    def names_in(self, domain: str) -> list[str]:
        return [name for name, d in self.tensors.items() if d == domain]


@dataclass(frozen=True)
class _Callee:
    name: str
    # "unary" (x), "residual" (x, f), "masked" (x, mask), "cross" (x, memory, memory_mask), "sized" (x, n):
    # n is a constant width, "maker" (n): returns a function, "higher" (x, f): hands f to another block
    kind: str
    params: tuple[str, ...]


class _Writer:
    def __init__(self, rng: random.Random, wildness: float, sizes: Sizes) -> None:
        self.rng, self.wildness, self.sizes = rng, wildness, sizes
        self.counter = itertools.count(1)
        self.callees: list[_Callee] = []
        self.labels: set[str] = set()  # labels used in the block being written
        self.depth = 0

    # --- choices ----------------------------------------------------------------------------------
    def wild(self) -> bool:
        return self.wildness > 0 and self.rng.random() < self.wildness

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, options):
        return self.rng.choice(list(options))

    def body_length(self) -> int:
        """Statements in a block body: a few, and sometimes many (where values meet in repeats and ifs)."""
        return self.rng.randrange(3, 7) if self.chance(0.05) else self.rng.randrange(3)

    def fresh(self, stem: str) -> str:
        return f"{stem}{next(self.counter)}"

    def name(self, stem: str) -> str:
        """A new value or parameter name; sometimes reserved or clashing."""
        if self.wild():
            return self.pick(RESERVED_NAMES + MISSPELLED_NAMES)
        return self.fresh(stem)

    def label(self, stem: str) -> str:
        """` as NAME`, or nothing."""
        if self.wild():
            return " as " + self.pick(RESERVED_NAMES + tuple(self.labels or ("dup",)))
        if not self.chance(0.4):
            return ""
        label = self.fresh(stem)
        self.labels.add(label)
        return f" as {label}"

    # --- parameters -------------------------------------------------------------------------------
    def integer(self, value: int) -> str:
        """An expression worth `value`, written one of several ways."""
        if self.wild():
            return self.pick(EXTREME_NUMBERS)
        forms: list[Callable[[], str]] = [
            lambda: str(value),
            lambda: f"{value + 3} - 3",
            lambda: f"{value * 2} // 2",
            lambda: f"{value * 3} / 3",
            lambda: f"max({value}, 1)",
            lambda: f"min({value}, {value + 7})",
            lambda: f"int(sqrt({value * value}))",
            lambda: f"abs(-{value})",
            lambda: f"({value})",
        ]
        if value > 1 and value & (value - 1) == 0:
            forms.append(lambda: f"2 ** {value.bit_length() - 1}")
        if value >= 10:
            forms.append(lambda: f"{str(value)[0]}_{str(value)[1:]}")
        return self.pick(forms)()

    def real(self, value: float) -> str:
        if self.wild():
            return self.pick(EXTREME_NUMBERS)
        return self.pick((repr(value), f"{value * 10} / 10", f"{value} * 1.0", f"{value:e}", f"min({value}, 0.9)"))

    def params(self) -> list[str]:
        s = self.sizes
        lines = [f"param d_model = {self.integer(s.d_model)}", f"param heads = {self.integer(s.heads)}"]
        if s.d_model == s.heads * s.d_k and self.chance(0.7):
            lines.append("param d_k = d_model / heads")
        else:
            lines.append(f"param d_k = {self.integer(s.d_k)}")
        lines += [
            f"param d_v = {self.pick(('d_k', self.integer(s.d_k)))}",
            f"param d_ff = {self.pick((self.integer(s.d_ff), f'{s.d_ff} * d_model / d_model'))}",
            f"param vocab = {self.integer(s.vocab)}",
            f"param layers = {self.integer(s.layers)}",
            f"param dropout = {self.real(s.dropout)}",
            f"param max_len = {self.integer(s.max_len)}",
            f"param norm_first = {self.pick(('true', 'not false', '1 < 2')) if s.norm_first else 'false'}",
            f"param positions = \"{s.positions}\"",
            f"param share = {'true' if s.tie else self.pick(('false', 'vocab < 0'))}",
        ]
        # Parameters nothing reads: strings and numbers that must survive into comments and literals.
        for _ in range(self.rng.randrange(3)):
            value = self.pick(INVALID_STRINGS if self.wild() else HOSTILE_STRINGS)
            lines.append(f"param {self.name('note')} = {value}")
        if self.chance(0.2):
            lines.append(f"param {self.name('big')} = {self.pick(EXTREME_NUMBERS)}")
        if self.wild():
            lines.append(f"set {self.pick(('heads', 'layres', 'nothing'))} = {self.integer(2)}")
        if self.wild():
            lines.append(f"param d_model = {self.integer(8)}")
        self.rng.shuffle(lines)  # parameters may refer to each other in any order
        return lines

    # --- expressions ------------------------------------------------------------------------------
    def condition(self, scope: _Scope) -> str:
        if self.wild():
            return self.pick([*scope.tensors, "layers", "positions", "1", '"yes"', "undefined_flag"] or ["1"])
        return self.pick(("norm_first", "not norm_first", 'positions == "learned"', "layers > 1", "true",
                          "false", "d_model >= 8 and heads < 4", "share or norm_first", "(layers) != 2"))

    def tensor(self, scope: _Scope, domain: str) -> str:
        """An expression for a tensor of width d_model in `domain`, built from what `scope` holds."""
        names = scope.names_in(domain)
        if self.wild():
            return self._wild_tensor(scope, domain)
        if self.depth >= 3 or not self.chance(0.6):
            return self.pick(names) if names else self._wild_tensor(scope, domain)
        self.depth += 1
        try:
            return self.pick(self._tensor_forms(scope, domain))()
        finally:
            self.depth -= 1

    def _tensor_forms(self, scope: _Scope, domain: str) -> list[Callable[[], str]]:
        names = scope.names_in(domain)
        inner = lambda: self.tensor(scope, domain)  # noqa: E731
        forms: list[Callable[[], str]] = [
            lambda: f"relu({inner()})",
            lambda: f"gelu({inner()})",
            lambda: f"dropout({inner()}, {self.pick(('dropout', self.real(0.1), 'p = dropout'))})",
            lambda: f"layer_norm({inner()}{self.pick(('', ', 1e-6', ', eps = 1e-5'))}){self.label('norm')}",
            lambda: f"linear({inner()}, d_model{self.pick(('', ', false', ', bias = true'))}){self.label('proj')}",
            lambda: f"linear(relu(linear({inner()}, d_ff){self.label('w')}), d_model){self.label('w')}",
            lambda: f"{inner()} + {inner()}",
            lambda: f"{inner()} {self.pick(('-', '*'))} {inner()}",
            lambda: f"{self.pick(('silu', 'sigmoid', 'tanh'))}({inner()})",
            lambda: f"rms_norm({inner()}{self.pick(('', ', 1e-5', ', eps = 1e-6'))}){self.label('norm')}",
            lambda: (f"linear(silu(linear({inner()}, d_ff, bias = false){self.label('gate')}) * "
                     f"linear({inner()}, d_ff){self.label('up')}, d_model){self.label('down')}"),
            lambda: f"({inner()}) * {self.pick(('2.0', '0.5', 'dropout', '3', 'sqrt(d_model)'))}",
            lambda: f"{self.pick(('0.5', '2', 'heads'))} * {inner()}",
            lambda: f"{inner()} + sinusoidal_positions({inner()}, max_len){self.label('pos')}",
        ]
        if names:
            forms.append(lambda: self.self_attention(scope, domain))
        if scope.functions:
            forms.append(lambda: self.call_function(scope, domain))
        if self.callees:
            forms.append(lambda: self.call_block(scope, domain))
        return forms

    def _wild_tensor(self, scope: _Scope, domain: str) -> str:
        return self.pick([
            lambda: self.pick([*scope.tensors, *scope.masks, *scope.tokens] or ["x"]),
            lambda: f"{self.pick(MISSPELLED_NAMES)}({self.pick(list(scope.tensors) or ['x'])})",
            lambda: f"linear({self.pick(list(scope.tensors) or ['x'])}, {self.integer(3)})",
            lambda: f"attention({self.pick(list(scope.tensors) or ['x'])}, heads = heads)",
            lambda: self.pick(EXTREME_NUMBERS),
            lambda: self.pick(HOSTILE_STRINGS + INVALID_STRINGS),
            lambda: f"{self.pick(list(scope.tensors) or ['x'])} {self.pick(('-', '/', '**', '<', 'and'))} 2",
            lambda: f"relu({', '.join(scope.tensors) or 'x'}, {self.integer(1)})",
            lambda: f"layer_norm(x, eps = {self.real(0.0)}, eps = 1)",
            lambda: f"rms_norm({self.pick(list(scope.tensors) or ['x'])}, bias = false)",
            lambda: (f"attention({self.pick(list(scope.tensors) or ['x'])}, memory, memory, heads = heads, d_k = d_k, "
                     f"d_v = d_v, {self.pick(('rotary = true', 'alibi = true', 'kv_heads = 0', 'kv_heads = 3'))})"),
            lambda: f"embedding({self.pick([*scope.tensors, *scope.tokens] or ['x'])}, vocab, d_model)",
            lambda: f"(h => h)({self.pick(list(scope.tensors) or ['x'])})",
            lambda: f"{self.pick(list(scope.tensors) or ['x'])}{self.pick(HOSTILE_CHARACTERS)}",
        ])()

    def self_attention(self, scope: _Scope, domain: str) -> str:
        """Attention whose keys are its queries (the same name, so one graph node); causal where the
        decoder needs it, with a mask of the same positions when one is at hand."""
        name = self.pick(scope.names_in(domain))
        masks = [m for m, d in scope.masks.items() if d == domain]
        causal = scope.decoding or domain == OWN or self.chance(0.3)
        if self.wild():
            causal = not causal
        args = [name, name, name]
        if masks and not scope.decoding and self.chance(0.7):
            args.append(self.pick(masks))
        keywords = ["heads = heads", "d_k = d_k", self.pick(("d_v = d_v", "d_v = d_k"))]
        # Without a mask, a fourth positional argument would be the mask: sizes go by keyword.
        sizes = self.pick((["heads", "d_k", "d_v"], ["heads", "d_k", "d_v = d_k"], keywords)) if len(args) == 4 \
            else keywords
        extra = [f"causal = {'true' if causal else 'false'}"] if causal or self.chance(0.5) else []
        if self.chance(0.2):
            extra.append(f"dropout = {self.real(0.1)}")
        if self.chance(0.2):
            extra.append(f"bias = {self.pick(('true', 'false'))}")
        if self.chance(0.3):
            extra.append(f"kv_heads = {self.pick(('1', 'heads', 'heads / 2', '2'))}")
        if self.chance(0.3):
            extra.append(self.pick(("rotary = true", "alibi = true", "rotary = true, rotary_base = 500.0",
                                    "rotary = true, alibi = true", "rotary = true, rotary_fraction = 0.5",
                                    'rotary = true, rotary_scaling = "yarn", rotary_factor = 4.0, '
                                    "rotary_original_max_len = 4")))
        if self.chance(0.25):  # the newer family's options, a window also where it is not causal (an error)
            extra.append(self.pick(("window = 3", "window = 0", "softcap = 5.0", "sinks = true", "scale = 0.5",
                                    'qk_norm = "head"', 'qk_norm = "projection", qk_norm_offset = 1.0',
                                    "out_bias = false", "softcap = 2.0, sinks = true, window = 2")))
        return f"attention({', '.join(args + sizes + extra)}){self.label('attn')}"

    def cross_attention(self, query: str, memory: str, mask: Optional[str]) -> str:
        args = [query, memory, memory] + ([mask] if mask else []) + ["heads", "d_k", "d_v"]
        return f"attention({', '.join(args)}){self.label('cross')}"

    def call_function(self, scope: _Scope, domain: str) -> str:
        function = self.pick(scope.functions)
        if not self.wild():
            scope.functions.remove(function)  # a second call of one lambda would share its weights
        return f"{function}({self.tensor(scope, domain)})"

    def lambda_(self, scope: _Scope, domain: str) -> str:
        param = self.name("h")
        inner = scope.copy()
        inner.tensors = {param: domain, **({} if self.chance(0.7) else scope.tensors)}
        inner.functions = []
        body = self.pick([
            lambda: self.self_attention(inner, domain),
            lambda: self.tensor(inner, domain),
            lambda: f"linear(relu(linear({param}, d_ff)), d_model){self.label('ffn')}",
        ])()
        return f"{param} => {body}"

    def call_block(self, scope: _Scope, domain: str, alone_in_repeat: bool = False) -> str:
        usable = [h for h in self.callees if self._can_call(h, scope, domain)]
        if not usable:
            return self.pick(scope.names_in(domain)) if scope.names_in(domain) else "x"
        callee = self.pick(usable)
        x = self.tensor(scope, domain)
        if callee.kind == "unary":
            args = [x]
        elif callee.kind == "residual":
            args = [x, self.lambda_(scope, domain)]
        elif callee.kind == "higher":
            args = [x, self.lambda_(scope, domain)]
        elif callee.kind == "masked":
            args = [x, self.pick([m for m, d in scope.masks.items() if d == domain])]
        elif callee.kind == "sized":
            args = [x, self.pick(("d_model", "d_ff / d_ff * d_model", self.integer(self.sizes.d_model)))]
        else:
            memory, mask = self._memory(scope, domain)
            args = [x, memory, mask]
        if self.wild():
            args = args[:-1] if self.chance(0.5) else args + [x]
        if self.chance(0.15) and len(args) == len(callee.params):
            args = [f"{param} = {arg}" for param, arg in zip(callee.params, args)]
            self.rng.shuffle(args)
        label = self.label("blk") if self.chance(0.5) else ""
        if alone_in_repeat and callee.kind in ("residual", "higher") and not label:
            # Alone in a repeat, the call is the layer and its lambda belongs to the enclosing block,
            # so every layer would call the lambda's one set of weights: a label makes the body a layer.
            label = f" as {self.fresh('layer')}"
        return f"{callee.name}({', '.join(args)}){label}"

    def _can_call(self, callee: _Callee, scope: _Scope, domain: str) -> bool:
        if callee.kind == "maker":  # called for a function, in an assignment (see statement)
            return False
        if callee.kind == "masked":
            return any(d == domain for d in scope.masks.values()) and not scope.decoding
        if callee.kind == "cross":
            return self._memory(scope, domain) != (None, None)
        return True

    def _memory(self, scope: _Scope, domain: str) -> tuple:
        """A tensor and a mask of other positions than `domain` (the encoder output, in the decoder)."""
        for mask, mask_domain in scope.masks.items():
            memories = [n for n, d in scope.tensors.items() if d == mask_domain]
            if memories and (mask_domain != domain or not scope.decoding):
                return self.pick(memories), mask
        return None, None

    # --- statements -------------------------------------------------------------------------------
    def statements(self, scope: _Scope, domain: str, count: int, indent: str) -> list[str]:
        lines: list[str] = []
        for _ in range(count):
            lines += self.statement(scope, domain, indent)
        return lines

    def statement(self, scope: _Scope, domain: str, indent: str) -> list[str]:
        kind = self.pick(("assign", "assign", "reassign", "reassign", "if", "repeat", "call", "function", "capture"))
        if kind in ("if", "repeat") and len(indent) > 8:  # nested four deep: enough
            kind = "assign"
        names = scope.names_in(domain)
        if kind == "assign" or not names:
            target = self.name("v")
            line = f"{indent}{target} = {self.tensor(scope, domain)}"
            scope.tensors[target] = domain
            return [line]
        target = self.pick(names)
        if kind == "reassign":
            return [f"{indent}{target} = {self.tensor(scope, domain)}"]
        if kind == "capture" and len(names) > 1:  # another name stays for what follows
            # A function reading a value that is then assigned again, at another width: the function
            # must keep seeing the value it was made with.
            function, param = self.name("g"), self.name("h")
            scope.functions.append(function)
            del scope.tensors[target]
            return [f"{indent}{function} = {param} => {param} + {target}",
                    f"{indent}{target} = linear({target}, d_ff){self.label('wide')}"]
        if kind == "function":
            function = self.name("g")
            makers = [h for h in self.callees if h.kind == "maker"]
            if makers and self.chance(0.6):
                line = f"{indent}{function} = {self.pick(makers).name}({self.pick(('d_model', 'n = d_model'))})"
            else:
                line = f"{indent}{function} = {self.lambda_(scope, domain)}"
            scope.functions.append(function)
            return [line]
        if kind == "call":
            return [f"{indent}{target} = {self.call_block(scope, domain)}"]
        if kind == "if":
            then, orelse = scope.copy(), scope.copy()
            lines = [f"{indent}if {self.condition(scope)} {{",
                     *self.statements(then, domain, 1 + self.rng.randrange(2), indent + "  ")]
            if self.chance(0.2):
                orelse_if = scope.copy()
                lines += [f"{indent}}} else if {self.condition(scope)} {{",
                          *self.statements(orelse_if, domain, 1, indent + "  ")]
                orelse.tensors = {n: d for n, d in orelse_if.tensors.items() if n in orelse.tensors}
                orelse.functions = [f for f in orelse_if.functions if f in orelse.functions]
            if self.chance(0.6):
                lines += [f"{indent}}} else {{", *self.statements(orelse, domain, 1, indent + "  ")]
            # Only names both branches keep are known after the `if`.
            kept = {n: d for n, d in scope.tensors.items() if n in then.tensors and n in orelse.tensors}
            scope.tensors.clear(), scope.tensors.update(kept)
            scope.functions[:] = [f for f in scope.functions if f in then.functions and f in orelse.functions]
            return lines + [f"{indent}}}"]
        return self.repeat(scope, domain, target, indent)

    def repeat(self, scope: _Scope, domain: str, target: str, indent: str) -> list[str]:
        count = self.pick(("layers", self.integer(self.rng.randrange(1, 3)), "layers - 1 + 1"))
        if self.wild():
            count = self.pick(("0", "-1", "10**18", "10001", "1.5", "true", '"2"', "layers / 2", target))
        label = f" as {self.fresh('stack')}" if self.chance(0.4) else ""
        index = f"{self.fresh('i')} in " if self.chance(0.3) else ""
        body = scope.copy()
        body.functions = [] if not self.wild() else body.functions  # a lambda called in every layer
        usable = [h for h in self.callees if self._can_call(h, scope, domain)]
        if usable and self.chance(0.5):
            inner = [f"{indent}  {target} = {self.call_block(body, domain, alone_in_repeat=True)}"]
        else:
            inner = self.statements(body, domain, 1 + self.rng.randrange(2), indent + "  ")
            if self.chance(0.5) or not any(line.lstrip().startswith(f"{target} =") for line in inner):
                inner.append(f"{indent}  {target} = {self.tensor(body, domain)}")
        if index and self.chance(0.5):  # layers that differ by their index
            i = index.split()[0]
            inner = [f"{indent}  if {i} % 2 == {self.pick(('0', '1'))} {{",
                     f"{indent}    {target} = {self.tensor(body, domain)}", f"{indent}  }}", *inner]
        return [f"{indent}repeat {index}{count}{label} {{", *inner, f"{indent}}}"]

    # --- blocks -----------------------------------------------------------------------------------
    def block(self, kind: str) -> list[str]:
        name = self.fresh(self.pick(("sublayer", "ffn", "layer", "mix", "attend", "block")))
        if self.wild():
            name = self.pick(("relu", "linear", "gelu", "dropout", "add", "scale", "input", "F", "Model",
                              "decoder_cache", "embedding", "_", "sqrt") + RESERVED_NAMES)
        self.labels = set()
        x = self.pick(("x", "h", "inp", "value"))
        scope = _Scope(tensors={x: OWN})
        params = [x]
        if kind == "residual":
            f = self.pick(("f", "fn", "sub"))
            scope.functions.append(f)
            params.append(f)
        elif kind == "masked":
            scope.masks["mask"] = OWN
            params.append("mask")
        elif kind == "cross":
            scope.tensors["memory"] = OTHER
            scope.masks["memory_mask"] = OTHER
            params += ["memory", "memory_mask"]
        elif kind == "sized":
            params.append("n")
        elif kind == "maker":
            params = ["n"]
        elif kind == "higher":
            params.append("f")
        if self.wild():
            params.append(self.pick(RESERVED_NAMES))
        lines = [f"block {name}({', '.join(params)}) {{"]
        inner = [h for h in self.callees if h.kind == "residual"]
        if kind == "residual" and self.chance(0.5):
            lines += self._residual_body(x, scope.functions[0])
        elif kind == "maker":
            h = self.name("h")
            lines.append(f"  return {h} => " + self.pick((f"linear(relu(linear({h}, n)), n)", f"layer_norm({h})", h,
                                                           f"dropout(gelu({h}), dropout)")))
        elif kind == "higher":
            if inner and self.chance(0.7):
                lines.append(f"  return {self.pick(inner).name}({x}, f){self.label('inner')}")
            else:
                lines.append(f"  return f({x})")
        elif kind == "sized":
            lines += self.statements(scope, OWN, self.rng.randrange(2), "  ")
            lines.append(f"  return linear({self.tensor(scope, OWN)}, n){self.label('sized')}")
        else:
            lines += self.statements(scope, OWN, self.body_length(), "  ")
            if kind == "cross":
                lines.append(f"  {x} = {x} + {self.cross_attention(x, 'memory', 'memory_mask')}")
            lines.append(f"  return {self.tensor(scope, OWN)}")
        self.callees.append(_Callee(name, kind, tuple(params)))
        return lines + ["}"]

    def _residual_body(self, x: str, f: str) -> list[str]:
        return [
            "  if norm_first {",
            f"    return {x} + dropout({f}(layer_norm({x}) as norm), dropout)",
            "  }",
            f"  return layer_norm({x} + dropout({f}({x}), dropout)) as norm",
        ]

    def embed(self, tokens: str, domain: str, scope: _Scope) -> list[str]:
        scale = self.pick(("", ", scale = sqrt(d_model)", ", 1.0", f", scale = {self.real(2.0)}"))
        lines = [f"  x = embedding({tokens}, vocab, d_model{scale}) as embed"]
        learned = "learned_positions(x, max_len) as positions"
        sinusoidal = "sinusoidal_positions(x, max_len) as positions"
        lines += self.pick([
            lambda: ['  if positions == "learned" {', f"    x = dropout(x + {learned}, dropout)", "  } else {",
                     f"    x = dropout(x + {sinusoidal}, dropout)", "  }"],
            lambda: [f"  x = x + {self.pick((learned, sinusoidal))}"],
            lambda: [],
        ])()
        scope.tensors["x"] = domain
        return lines

    def encoder(self) -> list[str]:
        self.labels = {"embed", "positions"}
        src, mask = self.pick((("src", "src_mask"), ("tokens", "mask"), ("ids", "padding")))
        scope = _Scope(tensors={}, masks={mask: SRC}, tokens={src: SRC})
        lines = [f"block encoder({src}, {mask}) {{", *self.embed(src, SRC, scope)]
        lines += self.statements(scope, SRC, self.body_length(), "  ")
        lines.append(f"  return {self.pick(('x', 'layer_norm(x) as final_norm', self.tensor(scope, SRC)))}")
        return lines + ["}"]

    def decoder(self, with_memory: bool) -> list[str]:
        self.labels = {"embed", "positions", "generator"}
        if with_memory:
            tgt, memory, mask = self.pick((("tgt", "memory", "memory_mask"), ("tokens", "mem", "mask")))
            scope = _Scope(tensors={memory: SRC}, masks={mask: SRC}, tokens={tgt: TGT}, decoding=True)
            lines = [f"block decoder({tgt}, {memory}, {mask}) {{"]
        else:
            tgt = self.pick(("tokens", "tgt", "ids"))
            scope = _Scope(tokens={tgt: TGT}, decoding=True)
            lines = [f"block decoder({tgt}) {{"]
        lines += self.embed(tgt, TGT, scope)
        lines += self.statements(scope, TGT, self.body_length(), "  ")
        if with_memory and self.chance(0.5):
            lines.append(f"  x = x + {self.cross_attention('x', memory, mask)}")
        bias = self.pick(("", ", bias = false", ", false"))
        lines.append(f"  return linear({self.pick(('x', self.tensor(scope, TGT)))}, vocab{bias}) as generator")
        return lines + ["}"]

    def ties(self, form: str) -> list[str]:
        paths = {"encoder-decoder": ["encoder.embed.weight", "decoder.embed.weight", "decoder.generator.weight"],
                 "language model": ["decoder.embed.weight", "decoder.generator.weight"], "encoder": []}[form]
        if self.wild():
            paths = paths + [self.pick(("decoder.generator.bias", "encoder.embed.weigth", "decoder.layers.0.x.weight",
                                        "encoder", "decoder.embed.weight.0", "decoder.99.weight"))]
        if self.chance(0.15):  # a whole stack, or whole modules
            return [f"tie {self.pick(('encoder.layers', 'decoder.layers', 'decoder', 'encoder.embed', 'layers'))}"]
        if len(paths) < 2 or not self.chance(0.6):
            return []
        self.rng.shuffle(paths)
        tie = "tie " + ", ".join(paths[: max(2, self.rng.randrange(len(paths) + 1))])
        return self.pick(([tie], ["if share {", "  " + tie, "}"], ["if not share {", "  " + tie, "}"]))

    def sections(self) -> list[str]:
        lines: list[str] = []
        for section, keys in SECTION_VALUES.items():
            if not self.chance(0.4):
                continue
            chosen = self.rng.sample(sorted(keys), k=min(len(keys), self.rng.randrange(1, 5)))
            entries = []
            for key in chosen:
                valid, invalid = keys[key]
                value = self.pick(invalid) if self.wild() else self.pick(valid)
                entries.append(f"{key} = {value}")
            if self.wild():
                entries.append(f"{self.pick(MISSPELLED_NAMES)} = 1")
            lines.append(f"{section} {{ " + self.pick(("; ", "\n    ")).join(entries) + " }")
        return lines

    def model(self, form: str) -> str:
        name = self.pick(("m", "transformer", "fuzz_model")) if not self.wild() else self.pick(RESERVED_NAMES)
        members: list[str] = self.params()
        for _ in range(self.rng.randrange(4)):
            kinds = ["unary", "residual", "residual", "sized", "maker", "higher"]
            kinds += ["masked"] if form != "language model" else []
            kinds += ["cross"] if form == "encoder-decoder" else []
            members += [""] + self.block(self.pick(kinds))
        if form in ("encoder-decoder", "encoder"):
            members += [""] + self.encoder()
        if form in ("encoder-decoder", "language model"):
            members += [""] + self.decoder(with_memory=form == "encoder-decoder")
        if self.wild():
            members += [""] + self.pick((self.encoder, lambda: self.decoder(True), lambda: self.decoder(False)))()
        members += self.ties(form) + self.sections()
        if self.wild():
            members.append(self.pick(("remove encoder", "remove nothing", "import \"base.xspec\"",
                                      "extends base", "}", "block", "param")))
        return self._format(name, members)

    def _format(self, name: str, members: list[str]) -> str:
        """The model's text, with the layout varied: separators, comments, line endings."""
        lines = []
        for member in members:
            for line in member.split("\n"):
                if line and not line.endswith(("{", "}")) and self.chance(0.05):
                    line += ";"
                if line and self.chance(0.05):
                    line += "  # " + self.pick(("note", '"""', "} {", "\\", "\x00", "é", "#"))
                lines.append("  " + line if line else "")
        header = "" if not self.chance(0.2) else "# a generated spec\n"
        text = header + f"model {name} {{\n" + "\n".join(lines) + "\n}\n"
        if self.chance(0.05):
            text = text.replace("\n", "\r\n")
        return text


def _numbers(*values) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


# Per section key: values that are valid, and values that are not (or are the wrong type).
SECTION_VALUES: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "train": {
        "adam_betas": (("[0.9, 0.98]", "[0.5, 0.5]"), ("[0.9]", "0.9", "[1, 2, 3]", '["a", "b"]')),
        "adam_eps": (("1e-9", "1e-6"), ("0", "-1e-9", '"small"')),
        "weight_decay": (("0.0", "0.01"), ("-1", "[0]")),
        "lr_schedule": (('"inverse_sqrt"', '"constant"'), ('"cosine"', "1")),
        "lr_scale": (("1.0", "2"), ("0", "-1")),
        "lr": (("1e-4", "0.001"), ("0", "1e999")),
        "warmup_steps": (("4000", "1", "layers"), ("0", "1.5", "-4000")),
        "batch_tokens": (("25000", "64"), ("0", '"many"')),
        "max_batch_tokens": (("1000",), ("0", "-1")),
        "label_smoothing": (("0.1", "dropout", "0"), ("1", "1.5", "-0.1")),
        "clip_norm": (("1.0",), ("0", "-1.0")),
        "max_steps": (("100", "100000"), ("0", "9223372036854775808")),
        "max_minutes": (("5", "0.5"), ("0", "-5")),
        "checkpoint_every_minutes": (("10.0",), ("0",)),
        "checkpoint_every_steps": (("100",), ("0",)),
        "keep_checkpoints": (("20", "5"), ("0", "1")),
        "average_last": (("5", "1"), ("0", "50")),
        "validate_every_steps": (("1000",), ("0",)),
        "seed": (("1", "-5", "0", "9223372036854775807"), ("1.5", '"seed"', "true")),
    },
    "data": {
        "vocab_size": (("37000", "8", "max(vocab, 8)"), ("7", "0", "-1")),
        "vocab_model": (('"bpe"', '"unigram"'), ('"word"', "1")),
        "train_src": (('"train.src"', '"../../etc/passwd"', '"a\\"b.src"', '"\\\\server\\\\x"', '"é.src"'),
                      ('"\\x00"', "1")),
        "test_tgt": (('"test.tgt"', '"$HOME/x"'), ('"tab\there"',)),
        "max_tokens": (("256", "1"), ("0",)),
    },
    "decode": {
        "beam": (("4", "1"), ("0", "-4")),
        "length_penalty": (("0.6", "0"), ("-0.6",)),
        "max_len_a": (("1.0",), ("-1",)),
        "max_len_b": (("50", "0"), ("-1",)),
        "nbest": (("1",), ("0", "100")),
    },
}


# --- specs that import and extend the shipped ones --------------------------------------------------

SPECS_FOLDER = Path(__file__).resolve().parents[2] / "specs"
BASES = (("base.xspec", "transformer_base"), ("tiny.xspec", "transformer_tiny"), ("lm.xspec", "transformer_lm"),
         ("big.xspec", "transformer_big"), ("table3/E_learned_positions.xspec", "E_learned_positions"))
SMALL_SETS = (("vocab", "13"), ("d_model", "8"), ("d_ff", "16"), ("heads", "2"), ("layers", "1"), ("max_len", "16"))
VARIANT_SETS = (("positions", '"learned"'), ("norm_first", "true"), ("tie_embeddings", "false"), ("heads", "4"),
                ("heads", "1"), ("d_k", "2"), ("layers", "2"), ("dropout", "0.0"), ("label_smoothing", "0"),
                ("tie_embeddings", "true"), ("max_len", "2"))
REPLACED_BLOCKS = (
    "block feed_forward(x) { return linear(gelu(linear(x, d_ff) as w_1), d_model) as w_2 }",
    "block feed_forward(x) { return x }",
    "block sublayer(x, f) { return x + f(x) }",
    "block sublayer(x, f) { return layer_norm(x + f(layer_norm(x) as pre) as post) as norm }",
    "block embed(tokens) { return embedding(tokens, vocab, d_model) as embed }",
    "block embed(tokens) { e = embedding(tokens, vocab, d_model) as embed\n return e + learned_positions(e, max_len) }",
    "block encoder_layer(x, mask) { return sublayer(x, h => feed_forward(h) as ffn) }",
    "block lm_layer(x) { return sublayer(x, h => feed_forward(h) as ffn) }",
)


@st.composite
def derived_specs(draw) -> tuple[str, str]:
    """(file name, text) of a spec beside the shipped ones that imports one and changes it: `set`,
    `param`, `remove`, replaced blocks, ties and sections. Mostly small enough to build and run."""
    base_file, base_model = draw(st.sampled_from(BASES))
    wildness = draw(st.sampled_from(WILDNESS))
    rng = random.Random(draw(st.integers(0, 2**64 - 1)))
    writer = _Writer(rng, wildness, Sizes(8, 2, 4, 16, 13, 1, 0.1, 16, False, "sinusoidal", True))
    members = [f"set {key} = {writer.integer(int(value))}" for key, value in SMALL_SETS if rng.random() < 0.95]
    members += [f"set {key} = {value}" for key, value in rng.sample(VARIANT_SETS, rng.randrange(3))]
    if rng.random() < 0.4:
        members.append(rng.choice(REPLACED_BLOCKS))
    if writer.wild():
        members.append(f"remove {rng.choice(('encoder', 'decoder', 'decoder_layer', 'feed_forward', 'nothing'))}")
    if writer.wild():
        members.append(f"set {rng.choice(('vocab', 'haeds', 'label_smoothing'))} = {rng.choice(EXTREME_NUMBERS)}")
    if rng.random() < 0.2:
        members.append(f"param extra = {rng.choice(HOSTILE_STRINGS)}")
    members += writer.sections()
    rng.shuffle(members)
    imports = f'import "{base_file}"\n' if not writer.wild() else rng.choice(
        ('import "missing.xspec"\n', 'import "."\n', 'import "/dev/zero"\n', "", f'import "{base_file}"\n' * 2))
    text = imports + f"model derived extends {base_model} {{\n  " + "\n  ".join(members) + "\n}\n"
    return str(SPECS_FOLDER / "fuzz_derived.xspec"), text
