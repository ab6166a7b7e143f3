"""The rotary embedding op's entry in the op table, and the rotary settings it shares with attention's own
(`rotary = true`, `rotary_*`) and latent attention's: rotary position embeddings (Su et al., 2021).

    rope = rotary_embedding(x, d_k, base = rope_theta) as rotary_emb
    repeat layers { x = lm_layer(x, rope) }               # ... attention(..., position_embeddings = rope)

A stack makes the angles of its forward's positions once and passes them to every layer, as transformers'
models make `position_embeddings`: [batch, positions, 2 x features], their cos, then their sin. The settings,
each named after the checkpoint configuration's quantity: the features turned of each head (`dim`, a
`fraction` of them: partial_rotary_factor), the `base` (rope_theta) and the frequency scaling checkpoints
declare (rope_type linear, llama3, yarn, with their parameters). An attention that states them itself (the
form older specs have) holds an embedding of its own, made of the same settings under `rotary_` names.

Everything about the op is here: schema, rules, shape rule, buffers, lowering (xspec/nn/rotary.py has the
modules) and what diagrams say.
"""

from __future__ import annotations

import ast as pyast
from dataclasses import dataclass
from typing import Literal, Optional

from pydantic import Field

from .opdef import Attrs, Family, Inferred, Input, OpDef, Shapes, Written
from .python_code import binary, call, constant, product, variable
from .shapes import ShapeError, TensorType, concrete_last, require

# "default": none, the name checkpoints give it (rope_type).
RotaryScaling = Literal["default", "linear", "llama3", "yarn"]
# The settings, by their names here; an attention's carry the prefix `rotary_`.
SETTINGS = ("base", "fraction", "scaling", "factor", "original_max_len", "low_freq_factor", "high_freq_factor",
            "beta_fast", "beta_slow", "attention_factor", "truncate")


class RotaryAttrs(Attrs):
    dim: int = Field(gt=0)  # each head's features, of which `fraction` turn
    base: float = Field(10000.0, gt=1)
    fraction: float = 1.0
    scaling: RotaryScaling = "default"
    factor: float = 1.0
    original_max_len: Optional[int] = None  # the context length the checkpoint was trained at
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: Optional[float] = None  # yarn: cos and sin scaled by it; None: 0.1 ln(factor) + 1
    truncate: bool = True  # yarn: the correction range rounded to whole features


@dataclass(frozen=True)
class Settings:
    """One rotary embedding's settings, read from an op's attributes (`of`): its own or an attention's."""

    prefix: str  # the attributes' prefix: "" (rotary_embedding's) or "rotary_" (an attention's)
    dim_name: str  # the attribute of each head's features: dim, d_k, qk_rope_head_dim
    values: RotaryAttrs  # under rotary_embedding's names, `dim` the head's features

    @staticmethod
    def of(attrs: Attrs, prefix: str, dim_name: str) -> "Settings":
        """The settings `attrs` hold under `prefix`; those it lacks (latent attention turns every feature and
        has no Llama 3 scaling) at rotary_embedding's defaults. Checked already, as the op's attributes."""
        given = {name: getattr(attrs, prefix + name) for name in SETTINGS if hasattr(attrs, prefix + name)}
        return Settings(prefix, dim_name, RotaryAttrs.model_construct(dim=getattr(attrs, dim_name), **given))

    def name(self, setting: str) -> str:
        return self.prefix + setting

    @property
    def features(self) -> float:
        """The features of each head the rotation turns: dim, or its `fraction`."""
        return self.values.dim * self.values.fraction


def problems(s: Settings) -> list[tuple[str, str]]:
    """Rotary positions rotate pairs of features: a whole, even number of them, with a scaling that is
    complete (its parameters given and sensible)."""
    v, name = s.values, s.name
    fraction = v.fraction
    if not 0 < fraction <= 1:
        return [(name("fraction"), f"{name('fraction')} = {fraction} is the share of each head's features "
                                   "rotated: more than 0, at most 1")]
    found = []
    if fraction == 1 and v.dim % 2:
        found.append((s.dim_name, f"rotary positions rotate pairs of features, so {s.dim_name} must be even, "
                                  f"got {v.dim}"))
    elif s.features != int(s.features) or int(s.features) % 2:
        found.append((name("fraction"), f"{name('fraction')} = {fraction} of {s.dim_name} = {v.dim} is "
                                        f"{s.features:g} features, but rotary positions rotate pairs of "
                                        "features: it must be a whole, even number"))
    if fraction != 1 and v.scaling != "default":
        found.append((name("scaling"), f"{name('scaling')} = \"{v.scaling}\" with {name('fraction')} = {fraction}: "
                                       "a scaling of partial rotary positions is not supported (no family has one)"))
    return found + scaling_problems(s)


def scaling_problems(s: Settings) -> list[tuple[str, str]]:
    """A frequency scaling's parameters, given and sensible."""
    found, name, v = [], s.name, s.values
    if v.scaling != "default" and v.factor <= 0:
        found.append((name("factor"), f"{name('factor')} = {v.factor} divides the frequencies: it must be positive"))
    if v.scaling in ("llama3", "yarn") and v.original_max_len is None:
        found.append((name("scaling"), f"{name('scaling')} = \"{v.scaling}\" needs {name('original_max_len')}, "
                                       "the context length the checkpoint was trained at"))
    if v.original_max_len is not None and v.original_max_len < 1:
        found.append((name("original_max_len"), f"{name('original_max_len')} must be a length of at least 1"))
    if v.scaling == "llama3" and v.high_freq_factor <= v.low_freq_factor:
        found.append((name("high_freq_factor"), f"{name('high_freq_factor')} = {v.high_freq_factor} must exceed "
                                                f"{name('low_freq_factor')} = {v.low_freq_factor}: the frequencies "
                                                "between them are interpolated"))
    if v.scaling == "yarn" and v.beta_fast <= v.beta_slow:
        found.append((name("beta_fast"), f"{name('beta_fast')} = {v.beta_fast} must exceed {name('beta_slow')} = "
                                         f"{v.beta_slow}: they bound the features YaRN blends"))
    return found


def embedding(s: Settings, w: Written) -> pyast.expr:
    """The embedding xspec/nn/rotary.py makes the angles with: the class of its scaling, its features (dim,
    or int(dim * fraction), as transformers computes them) and base, and the parameters that scaling reads."""
    cls, names = CLASSES[s.values.scaling]
    keywords = {setting: _yarn_attention_factor(s, w) if _derived(s, w, setting) else w.attr(s.name(setting))
                for setting in names}
    return call(cls, features(s, w), w.attr(s.name("base")), **keywords)


def features(s: Settings, w: Written) -> pyast.expr:
    """The features turned, as code: dim, or int(dim * fraction), as transformers computes them."""
    if s.values.fraction == 1:
        return w.attr(s.dim_name)
    if w.from_config(s.dim_name) or w.from_config(s.name("fraction")):
        return call("int", product(w.attr(s.dim_name), w.attr(s.name("fraction"))))
    return constant(int(s.features))


def _derived(s: Settings, w: Written, setting: str) -> bool:
    return setting == "attention_factor" and s.values.attention_factor is None and not w.from_config(s.name(setting))


def _yarn_attention_factor(s: Settings, w: Written) -> pyast.expr:
    """YaRN's attention factor where the spec gives none: 0.1 ln(factor) + 1 (1 for no scaling)."""
    if s.values.factor <= 1:
        return constant(1.0)
    return binary(binary(constant(0.1), pyast.Mult(), call("math.log", w.attr(s.name("factor")))), pyast.Add(),
                  constant(1.0))


# Each scaling's class (xspec/nn/rotary.py) and the settings it takes after the features and the base, by
# their names here.
CLASSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "default": ("RotaryEmbedding", ()),
    "linear": ("LinearRotaryEmbedding", ("factor",)),
    "llama3": ("Llama3RotaryEmbedding", ("factor", "low_freq_factor", "high_freq_factor", "original_max_len")),
    "yarn": ("YarnRotaryEmbedding", ("factor", "original_max_len", "beta_fast", "beta_slow", "attention_factor",
                                     "truncate")),
}
_SCALING_NAMES = {"linear": "linear", "llama3": "Llama 3", "yarn": "YaRN"}


def describe(s: Settings) -> str:
    """What diagrams say of the settings: "rotary positions, base 500000, 32 of 128 features"."""
    v = s.values
    text = "rotary positions" + (f", base {v.base:g}" if v.base != 10000 else "")
    if v.fraction != 1:
        text += f", {int(s.features)} of {v.dim} features"
    if v.scaling != "default":
        text += f", {_SCALING_NAMES[v.scaling]} ×{v.factor:g}"
    return text


def angles_type(query: TensorType, features: int) -> TensorType:
    """The angles of a sequence's positions, as the op makes them and attention reads them: each position's
    cos, then its sin."""
    return TensorType((query.dims[0], query.dims[-2], 2 * features))


def check_angles(angles: TensorType, query: TensorType, most: int, what: str) -> int:
    """The features that `angles` turn, checked against the queries they turn (at most `most`, the head's)."""
    angles = require(angles, "the position embeddings", min_rank=3)
    features = concrete_last(angles, "the position embeddings") // 2
    expected = angles_type(query, features)
    if angles.dims != expected.dims:
        raise ShapeError(f"the position embeddings {angles} must be the rotary angles of the queries' positions, "
                         f"{expected}: a stack's rotary_embedding of the same sequence")
    if features > most:
        raise ShapeError(f"the position embeddings turn {features} features, more than {what} = {most}")
    return features


def _shape(shapes: Shapes, a: RotaryAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input", min_rank=3)
    return angles_type(x, int(Settings.of(a, "", "dim").features)), {}


def _call(target: str, inputs: dict[str, pyast.expr], attrs: Attrs, cache: bool) -> pyast.expr:
    return call(f"self.{target}", inputs["x"], **({"cache": variable("cache")} if cache else {}))


def _own(a: RotaryAttrs) -> Settings:
    return Settings.of(a, "", "dim")


ROTARY_EMBEDDING = OpDef(
    name="rotary_embedding",
    doc="the rotary angles (cos and sin) of a sequence's positions, made once for the attentions that turn their "
        "queries and keys by them (Su et al., 2021)",
    family=Family.POSITION, inputs=(Input("x"),), attrs=RotaryAttrs, infer=_shape, params=lambda a, i: {},
    check=lambda a: problems(_own(a)), module=lambda a, i, w: embedding(_own(a), w), call=_call, uses_cache=True,
    buffers=lambda a, i: {"inverse_frequency": (int(_own(a).features) // 2,)},
    width_of=lambda a, w: binary(constant(2), pyast.Mult(), features(_own(a), w)), title="Rotary Position Embedding",
    details=lambda a, i: [describe(_own(a))],
    facts=lambda a, i: {"positions": "rotary"},
)
