"""umT5 (UMT5ForConditionalGeneration): mT5 with a relative position bias of its own in every layer, where T5
makes one per stack and shares it."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.t5 import T5_KEYS, T5_POSITIONS, WEIGHTS, read_t5, write_scaled


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_t5(cfg, m, feed_forward="gated-gelu", scales=True)


FAMILY = Family("umt5", "umt5", "UMT5ForConditionalGeneration", read, T5_POSITIONS, write=write_scaled,
                encoder_decoder=True, common_keys=False, depth="num_decoder_layers", keys=T5_KEYS, weights=WEIGHTS)
