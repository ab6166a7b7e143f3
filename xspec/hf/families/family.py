"""What a family is, and what one config.json maps to.

A `Family` is one transformers model_type: its shipped spec (specs/modern/), its class, how its
config.json reads as the spec's parameters (`read`), how the parameters are written back (`keys`, then
`write`), and how its checkpoints store the spec's tensors (`weights`). Each lives in a module of its own in
this package, listed in its __init__.py; adding a family is one spec, one module and one row of the test
oracle (tests/hf_families.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from xspec.hf.config_reader import ConfigReader, Setting
from xspec.hf.weight_map import PLAIN, WeightRules


@dataclass
class Mapped:
    spec: str                       # the shipped spec extended, e.g. "llama3" (specs/modern/llama3.xspec)
    model_type: str
    hf_class: str                   # transformers' class for this model_type (verification and export)
    weights: WeightRules            # how its checkpoint stores the spec's tensors (weight_map.py)
    settings: list[Setting]
    notes: dict[str, str]           # attributes that change nothing, and why
    max_positions: int
    window: int | None = None       # the smallest sliding window, if any
    scaled_from: int | None = None  # original_max_position_embeddings of a rotary scaling
    config: dict = field(default_factory=dict)

    @property
    def params(self) -> dict:
        return {s.param: s.value for s in self.settings}


def _nothing(params: dict[str, Any], config: dict[str, Any]) -> None:
    """A family whose config.json takes its keys table alone."""


@dataclass(frozen=True)
class Kin:
    """A spec of xspec's own that computes a family's model in another form (the paper's Transformer as
    Marian): its parameters under the family spec's names (None: a spec not of that form), the layouts of
    sinusoidal positions (theirs by ours) that a permutation of the model's features turns one into the
    other, and the axes of each of the family's tensors (by name) that hold those features."""

    params: Callable[[dict[str, Any]], dict[str, Any] | None]
    layouts: dict[str, str]
    feature_axes: Callable[[str], tuple[int, ...]]


@dataclass(frozen=True)
class Family:
    model_type: str
    spec: str                       # the shipped spec its imports extend (specs/modern/SPEC.xspec)
    hf_class: str
    read: Callable[[ConfigReader, Mapped], None]   # config.json -> the spec's parameters, every key accounted for
    positions: int                  # max_position_embeddings where config.json has none (the config class's)
    # Spec parameter -> config.json key, for those written back as they are (beyond every family's own).
    keys: dict[str, str] = field(default_factory=dict)
    # The family's other keys, written from the parameters into the config export writes.
    write: Callable[[dict[str, Any], dict[str, Any]], None] = _nothing
    weights: WeightRules = PLAIN
    # An encoder and a decoder (Marian), which config.json sizes apart: the keys every decoder family shares
    # (hidden_size, num_hidden_layers, ...) are not written for it.
    encoder_decoder: bool = False
    depth: str = "layers"           # the parameter counting the decoder's (an encoder alone: the encoder's) layers
    # The keys every decoder family shares (hidden_size, num_hidden_layers, ... from hf_config.COMMON), written
    # from the spec's parameters of those names; a family naming them otherwise writes its own (`keys`).
    common_keys: bool = True
    encoder_only: bool = False      # an encoder alone, with the masked-LM head (BERT's)
    kin: Kin | None = None          # a spec of xspec's own that is this family in another form
