"""OLMo 2 (Olmo2ForCausalLM): each sublayer's norm after it, QK-norm over whole projections."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_bias, read_common, read_default_rope, read_head_dim


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_common(cfg, tie_default=False, eps=1e-5)
    read_head_dim(cfg, None)
    read_bias(cfg, "attention_bias")
    read_default_rope(cfg)
    cfg.ignore("clip_qkv", "OLMo 1 clipped q, k and v; transformers' OLMo 2 does not read it")


FAMILY = Family("olmo2", "olmo2", "Olmo2ForCausalLM", read, 2048, keys={"attention_bias": "attention_bias"})
