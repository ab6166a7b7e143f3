"""Free-form generation: any construct of the grammar in any place, with any name.

Where grammar.py writes models that mostly make sense, this walks compiler/grammar.lark's rules with
no regard for meaning: lambdas as repeat counts, sections inside blocks' places, ties to nothing,
calls of parameters, `extends` of models that do not exist, imports of any path, nesting far deeper
than a model needs. Nearly all of these must be refused, each with a diagnostic at a real position.
A share are such blocks beside a working model instead, with only names and literals the compiler
accepts: nothing calls them, so the spec compiles, and their text must survive flattening.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from .atoms import (EXTREME_NUMBERS, HOSTILE_STRINGS, INTERNAL_OPS, INVALID_STRINGS, MATH_FUNCTIONS,
                    MISSPELLED_NAMES, OPS, RESERVED_NAMES)

NAMES = OPS + MATH_FUNCTIONS + INTERNAL_OPS + RESERVED_NAMES + MISSPELLED_NAMES + (
    "x", "h", "f", "src", "tgt", "tokens", "memory", "mask", "src_mask", "memory_mask", "d_model", "heads",
    "layers", "vocab", "encoder", "decoder", "sublayer", "train", "data", "decode", "weight", "bias", "m",
)
SECTION_KEYS = ("warmup_steps", "seed", "adam_betas", "beam", "nbest", "vocab_size", "train_src", "lr",
                "max_steps", "label_smoothing", "keep_checkpoints", "average_last", "bogus")
OPERATORS = ("+", "-", "*", "/", "//", "%", "**", "==", "!=", "<", "<=", ">", ">=", "and", "or")
# Beside a working model: names any block may bind, literals the parser accepts, and the model itself.
SAFE_NAMES = ("x", "h", "y", "z", "f", "g", "w", "relu", "linear", "attention", "d_model", "heads", "memory")
SAFE_NUMBERS = tuple(n for n in EXTREME_NUMBERS if n not in ("1e999", "9223372036854775808", "99999999999999999999"))
WORKING_DECODER = "block decoder(tokens) { return linear(embedding(tokens, 7, 4) as embed, 7) as out }"


@st.composite
def specs(draw) -> str:
    depth = draw(st.integers(1, 6))
    return _FreeForm(random.Random(draw(st.integers(0, 2**64 - 1))), depth).spec()


class _FreeForm:
    def __init__(self, rng: random.Random, depth: int) -> None:
        self.rng, self.max_depth = rng, depth
        self.names, self.numbers, self.strings = NAMES, EXTREME_NUMBERS, HOSTILE_STRINGS + INVALID_STRINGS
        self.safe = False  # only what parses: for blocks beside a working model

    def pick(self, options):
        return self.rng.choice(options)

    def some(self, make, most: int, separator: str = ", ") -> str:
        return separator.join(make() for _ in range(self.rng.randrange(most + 1)))

    def name(self) -> str:
        return self.pick(self.names)

    def expr(self, depth: int = 0) -> str:
        if depth >= self.max_depth or self.rng.random() < 0.3:
            return self.pick((
                lambda: self.pick(self.numbers),
                lambda: self.pick(self.strings),
                self.name, self.name, self.name,
                lambda: self.pick(("true", "false")),
            ))()
        inner = lambda: self.expr(depth + 1)  # noqa: E731
        return self.pick((
            lambda: f"{inner()} {self.pick(OPERATORS)} {inner()}",
            lambda: f"{self.pick(('-', 'not '))}{inner()}",
            lambda: f"({inner()})",
            lambda: f"[{self.some(inner, 3)}]",
            lambda: f"({self.name()} => {inner()})" if self.safe else f"{self.name()} => {inner()}",
            lambda: self.call(depth),
            lambda: self.call(depth),
        ))()

    def call(self, depth: int) -> str:
        arguments = [self.expr(depth + 1) for _ in range(self.rng.randrange(5))]
        arguments += [f"{self.name()} = {self.expr(depth + 1)}" for _ in range(self.rng.randrange(3))]
        trailing = "," if arguments and self.rng.random() < 0.1 else ""
        return f"{self.name()}({', '.join(arguments)}{trailing}){self.label()}"

    def label(self) -> str:
        return f" as {self.name()}" if self.rng.random() < 0.3 else ""

    def statement(self, depth: int) -> str:
        body = lambda: self.body(depth + 1)  # noqa: E731
        return self.pick((
            lambda: f"{self.name()} = {self.expr()}",
            lambda: f"{self.name()} = {self.expr()}",
            lambda: f"return {self.expr()}",
            lambda: f"repeat {self.expr(self.max_depth - 1)}{self.label()} {body()}",
            lambda: f"if {self.expr(self.max_depth - 1)} {body()}",
            lambda: f"if {self.expr(self.max_depth - 1)} {body()} else {body()}",
            lambda: f"if {self.expr(self.max_depth - 1)} {body()} else "
                    f"{self.statement(depth + 1) if not self.safe else 'if true ' + body()}",
        ))()

    def body(self, depth: int) -> str:
        if depth >= self.max_depth:
            return "{ }"
        return "{ " + self.some(lambda: self.statement(depth), 3, "\n  ") + " }"

    def path(self) -> str:
        parts = [self.name()]
        parts += [self.pick((self.name(), str(self.rng.randrange(4)))) for _ in range(self.rng.randrange(4))]
        return ".".join(parts)

    def member(self) -> str:
        return self.pick((
            lambda: f"param {self.name()} = {self.expr()}",
            lambda: f"param {self.name()} = {self.expr()}",
            lambda: f"set {self.name()} = {self.expr()}",
            lambda: f"block {self.name()}({self.some(self.name, 4)}) {self.body(0)}",
            lambda: f"block {self.name()}({self.some(self.name, 4)}) {self.body(0)}",
            lambda: f"remove {', '.join(self.name() for _ in range(1 + self.rng.randrange(3)))}",
            lambda: f"{self.pick(('train', 'data', 'decode', self.name()))} {{ "
                    f"{self.some(lambda: f'{self.pick(SECTION_KEYS)} = {self.expr()}', 3, '; ')} }}",
            lambda: f"tie {', '.join(self.path() for _ in range(2 + self.rng.randrange(2)))}",
            lambda: f"if {self.expr()} {{ tie {self.path()}, {self.path()} }}",
        ))()

    def spec(self) -> str:
        if self.rng.random() < 0.3:
            return self.beside_a_model()
        imports = "".join(f"import {self.pick(HOSTILE_STRINGS + INVALID_STRINGS)}\n"
                          for _ in range(self.rng.random() < 0.1))
        base = f" extends {self.name()}" if self.rng.random() < 0.1 else ""
        members = "\n  ".join(self.member() for _ in range(self.rng.randrange(8)))
        return f"{imports}model {self.name()}{base} {{\n  {members}\n}}\n"

    def beside_a_model(self) -> str:
        """Blocks of any shape that nothing calls, beside a decoder that works: the spec compiles, and
        their text (comments, strings, nesting, lambdas) must come through flattening intact."""
        self.names, self.numbers, self.strings, self.safe = SAFE_NAMES, SAFE_NUMBERS, HOSTILE_STRINGS, True
        blocks = [f"block unused{number}({', '.join(self.rng.sample(SAFE_NAMES, self.rng.randrange(4)))}) "
                  f"{self.body(0)}" for number in range(1, 2 + self.rng.randrange(3))]
        return "model m {\n  " + "\n  ".join([*blocks, WORKING_DECODER]) + "\n}\n"
