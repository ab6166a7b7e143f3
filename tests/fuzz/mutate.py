"""Mutations of real specs: token- and line-level edits that a typo, a bad merge or an attacker makes.

Tokens are split as compiler/grammar.lark's terminals are (strings, comments, numbers, names,
operators), so an edit lands on a whole token: deleted, duplicated, swapped, replaced by an extreme
number, a reserved or misspelled name or a hostile string, nested deeper, or separated by a quote, a
backslash, a NUL, a line break or unicode. Line edits duplicate, drop and move lines and whole blocks.
"""

from __future__ import annotations

import random
import re

from hypothesis import strategies as st

from .atoms import (EXTREME_NUMBERS, FILE_NAMES, HOSTILE_CHARACTERS, HOSTILE_STRINGS, INTERNAL_OPS, INVALID_STRINGS,
                    MISSPELLED_NAMES, OPS, RESERVED_NAMES)
from .corpus import flattened

TOKEN = re.compile(r'''
    (?P<string>"([^"\\\n]|\\.)*")
  | (?P<comment>\#[^\n]*)
  | (?P<number>[0-9][0-9_]*(\.[0-9_]+)?([eE][-+]?[0-9]+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<operator>=>|\*\*|//|==|!=|<=|>=|[-+*/%<>=(){}\[\],.;])
  | (?P<space>\s+)
  | (?P<other>.)
''', re.VERBOSE | re.DOTALL)

# Statements and pieces of them, inserted at the start of a line.
FRAGMENTS = (
    "repeat 3 as layers { x = relu(x) }", "if true {", "}", "} else {", "tie a.weight, b.weight",
    "x = h => h", "return x", "param d_model = 1", "set heads = 0", "remove encoder", "block x(y) { return y }",
    "train { seed = -5 }", "decode { nbest = 9 }", "x = attention(x, x, x, heads = 1, d_k = 1, d_v = 1)",
    "x = x + learned_positions(x, 1)", "x = linear(x, 3) as training", "import \"base.xspec\"",
    "block encoder(src, src_mask) { return embedding(src, 5, 4) }", "block decoder(tokens) { return tokens }",
    "x = embedding(x, 10**18, 10**18)", "repeat 10000 { x = relu(x) }", "x = f(x)", "model m {",
)


def tokenize(text: str) -> list[tuple[str, str]]:
    return [(match.lastgroup or "other", match.group()) for match in TOKEN.finditer(text)]


class _Mutator:
    def __init__(self, text: str, rng: random.Random) -> None:
        self.tokens = tokenize(text)
        self.rng = rng

    def pick(self, options):
        return self.rng.choice(list(options))

    def text(self) -> str:
        return "".join(token for _, token in self.tokens)

    def position(self, *kinds: str) -> int:
        """A random token of one of `kinds` (any but space if none given); -1 if there is none."""
        chosen = [i for i, (kind, _) in enumerate(self.tokens) if (kind in kinds if kinds else kind != "space")]
        return self.pick(chosen) if chosen else -1

    def replace(self, index: int, text: str) -> None:
        if index >= 0:
            self.tokens[index] = ("other", text)

    # --- token edits ------------------------------------------------------------------------------
    def delete(self) -> None:
        index = self.position()
        if index >= 0:
            del self.tokens[index]

    def duplicate(self) -> None:
        index = self.position()
        if index >= 0:
            self.tokens.insert(index, self.tokens[index])

    def swap(self) -> None:
        first = self.position()
        second = self.position() if self.rng.random() < 0.3 else first + self.pick((-2, -1, 1, 2))
        if 0 <= first < len(self.tokens) and 0 <= second < len(self.tokens):
            self.tokens[first], self.tokens[second] = self.tokens[second], self.tokens[first]

    def extreme_number(self) -> None:
        self.replace(self.position("number"), self.pick(EXTREME_NUMBERS))

    def nudge_number(self) -> None:
        """A nearby value: often still a model, now with other sizes (and maybe indivisible ones)."""
        index = self.position("number")
        if index < 0:
            return
        text = self.tokens[index][1].replace("_", "")
        value = float(text) if any(c in text for c in ".eE") else int(text)
        nudged = self.pick((value + 1, value - 1, value * 2, value // 2 if isinstance(value, int) else value / 2,
                            0, 1, 3))
        self.replace(index, repr(nudged) if nudged >= 0 else f"({nudged!r})")

    def bad_name(self) -> None:
        names = [token for kind, token in self.tokens if kind == "name"]
        index = self.position("name")
        if index < 0:
            return
        original = self.tokens[index][1]
        self.replace(index, self.pick((
            lambda: self.pick(RESERVED_NAMES),
            lambda: self.pick(MISSPELLED_NAMES + OPS + INTERNAL_OPS),
            lambda: self.pick(names),
            lambda: original[:-1] or "_",
            lambda: original + original[-1],
            lambda: original.upper(),
            lambda: "_" + original,
        ))())

    def hostile_string(self) -> None:
        index = self.position("string")
        self.replace(index if index >= 0 else self.position(), self.pick(HOSTILE_STRINGS + INVALID_STRINGS))

    def insert_character(self) -> None:
        index = self.rng.randrange(len(self.tokens) + 1)
        self.tokens.insert(index, ("other", self.pick(HOSTILE_CHARACTERS)))

    def split_token(self) -> None:
        """A character inside a token: a quote within a string, a NUL within a name."""
        index = self.position("string", "name", "number", "comment")
        if index < 0:
            return
        token = self.tokens[index][1]
        cut = self.rng.randrange(len(token) + 1)
        self.replace(index, token[:cut] + self.pick(HOSTILE_CHARACTERS) + token[cut:])

    def nest(self) -> None:
        """An expression wrapped in parentheses or calls, to depths around the syntax limit."""
        index = self.position("name", "number")
        if index < 0:
            return
        depth = self.pick((1, 3, 30, 62, 63, 64, 65, 200))
        opening, closing = self.pick((("(", ")"), ("relu(", ")"), ("[", "]"), ("-", ""), ("not ", ""),
                                      ("h => ", "")))
        self.replace(index, opening * depth + self.tokens[index][1] + closing * depth)

    def splice(self) -> None:
        source, target = self.position(), self.position()
        if source >= 0 and target >= 0:
            self.tokens[target] = self.tokens[source]

    # --- line and block edits ---------------------------------------------------------------------
    def edit_lines(self) -> None:
        lines = self.text().split("\n")
        at, other = self.rng.randrange(len(lines)), self.rng.randrange(len(lines))
        action = self.pick(("duplicate", "delete", "swap", "fragment", "block"))
        if action == "duplicate":
            lines.insert(at, lines[at])
        elif action == "delete":
            del lines[at]
        elif action == "swap":
            lines[at], lines[other] = lines[other], lines[at]
        elif action == "fragment":
            lines.insert(at, self.pick(FRAGMENTS))
        else:
            lines = self._edit_block(lines)
        self.tokens = tokenize("\n".join(lines))

    def _edit_block(self, lines: list[str]) -> list[str]:
        """Duplicate, drop or move a whole block (its first line through its closing brace)."""
        starts = [i for i, line in enumerate(lines) if line.strip().startswith("block ")]
        if not starts:
            return lines
        start = self.pick(starts)
        depth, end = 0, start
        for end in range(start, len(lines)):
            depth += lines[end].count("{") - lines[end].count("}")
            if depth <= 0:
                break
        block = lines[start:end + 1]
        action = self.pick(("duplicate", "delete", "move"))
        if action == "duplicate":
            return lines[:end + 1] + block + lines[end + 1:]
        rest = lines[:start] + lines[end + 1:]
        if action == "delete":
            return rest
        at = self.rng.randrange(len(rest) + 1)
        return rest[:at] + block + rest[at:]


MUTATIONS = ("delete", "duplicate", "swap", "extreme_number", "nudge_number", "nudge_number", "bad_name",
             "hostile_string", "insert_character", "split_token", "nest", "splice", "edit_lines", "edit_lines")


def mutate(text: str, mutations: list[str], seed: int) -> str:
    mutator = _Mutator(text, random.Random(seed))
    for mutation in mutations:
        getattr(mutator, mutation)()
    return mutator.text()


@st.composite
def mutants(draw) -> tuple[str, str]:
    """(file name, mutated text) of a shipped spec: Hypothesis draws the spec and a seed, the seed the
    1 to 3 mutations, where they land and the file name."""
    _, text = draw(st.sampled_from(flattened()))
    rng = random.Random(draw(st.integers(0, 2**64 - 1)))
    mutations = [rng.choice(MUTATIONS) for _ in range(rng.randrange(1, 4))]
    return rng.choice(FILE_NAMES), mutate(text, mutations, rng.randrange(2**64))
