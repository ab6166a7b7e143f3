"""Hostile `--set` overrides, as `xspec.compile_source(..., overrides=...)` receives them: text that
is parsed as an expression (or taken as a bare word), and Python values of every type."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from .atoms import CANARY_CODE
from .corpus import flattened, parameter_names

SECTION_KEYS = ("train.seed", "train.warmup_steps", "train.adam_betas", "train.label_smoothing",
                "train.average_last", "data.vocab_size", "data.train_src", "decode.nbest", "decode.beam")
ODD_KEYS = ("haeds", "train.", ".x", "a.b.c", "", " heads", "heads\n", "train.warmup", "x" * 300, "trian.seed",
            "decode.nbest.x", 1, None, ("heads",))

TEXT_VALUES = (
    '"""; import os', '"; import os; "', CANARY_CODE, "10**18", "2 ** 64", "1e999", "-1e999", "1e308", "-5", "0",
    "h => h", "sqrt(-1)", "log(8, 1)", "relu(x) as y", "d_model * 2", "d_model / 3", "heads", "learned",
    "true", "[1, [2]]", "[0.9, 0.98]", "x" * 5000, "\x00", "a\nb", "1 +", "#", " ", "é", "\u2028",
    "(" * 70 + "1" + ")" * 70,
    "round(5, -10**9)", "[1] < [\"a\"]", '"\\"', "9" * 5000, "0" * 5000 + "1", "2**63", "-2**63", "max()",
)
PYTHON_VALUES = (
    10**18, 2**63, 2**63 - 1, -2**63, 2**1000, -5, 0, 1, True, False, 1e308, -0.0, float("inf"), float("nan"),
    None, b"bytes", [1, 2], [0.9, 0.98], [1, "a"], [[1]], (), (1, 2), {"a": 1}, 1 + 2j, ["\x00"],
)
# Overrides a user means, some with hostile text where any text is a valid value (a file name).
PLAUSIBLE = (
    ("heads", "4"), ("heads", 1), ("layers", 2), ("positions", "learned"), ("norm_first", "true"),
    ("tie_embeddings", False), ("d_model", "d_ff / 4"), ("train.seed", -5), ("train.warmup_steps", "400"),
    ("train.adam_betas", [0.5, 0.5]), ("decode.beam", 8), ("data.vocab_size", "vocab"),
    ("data.train_src", '"""; import os'), ("data.train_src", CANARY_CODE), ("data.test_tgt", "é𝔁 '''.txt"),
    ("dropout", 0), ("label_smoothing", "0.0"), ("max_len", 3),
)


def _value(rng: random.Random):
    return rng.choice((
        lambda: rng.choice(TEXT_VALUES),
        lambda: rng.choice(PYTHON_VALUES),
        lambda: rng.randrange(-2**70, 2**70),
        lambda: float(f"{rng.choice('-+')}1e{rng.randrange(-330, 330)}"),  # past 1e308: infinite
        lambda: "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(8))),
    ))()


@st.composite
def overridden(draw) -> tuple[str, dict]:
    """(text of a shipped spec, up to three overrides): plausible ones, and ones of the parameters, the
    sections' keys and keys that do not exist, with hostile values."""
    _, text = draw(st.sampled_from(flattened()))
    rng = random.Random(draw(st.integers(0, 2**64 - 1)))
    keys = tuple(parameter_names(text)) + SECTION_KEYS + ODD_KEYS
    overrides = {}
    for _ in range(rng.randrange(1, 4)):
        if rng.random() < 0.4:
            key, value = rng.choice(PLAUSIBLE)
        else:
            key, value = rng.choice(keys), _value(rng)
        overrides[key] = value
    return text, overrides
