"""mT5 (MT5ForConditionalGeneration): T5 v1.1's layers (gated GELU) over a multilingual vocabulary; its logits
read the decoder's output unscaled, whatever tie_word_embeddings says."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.t5 import T5_KEYS, T5_POSITIONS, WEIGHTS, read_t5, write_t5


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_t5(cfg, m, feed_forward="gated-gelu", scales=False)


FAMILY = Family("mt5", "t5", "MT5ForConditionalGeneration", read, T5_POSITIONS, write=write_t5,
                encoder_decoder=True, common_keys=False, depth="num_decoder_layers", keys=T5_KEYS, weights=WEIGHTS)
