"""Phi-3 (Phi3ForCausalLM): LLaMA's layers with rotary positions on a share of each head, Q, K and V as
rows of one matrix and the feed-forward's gate and up as one projection, as the spec holds them."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_bias, read_common, read_head_dim, read_partial_rotary, refuse_window


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_common(cfg, tie_default=False, eps=1e-5)
    read_head_dim(cfg, None)
    read_bias(cfg, "attention_bias")
    refuse_window(cfg)
    read_partial_rotary(cfg, default=1.0)
    cfg.ignore("original_max_position_embeddings", "the context before long-rope scaling; rope_type default has none")


FAMILY = Family("phi3", "phi3", "Phi3ForCausalLM", read, 4096, keys={"partial_rotary_factor": "partial_rotary_factor"})
