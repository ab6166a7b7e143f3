"""Qwen3 (Qwen3ForCausalLM): Qwen2's layers with QK-norm and a head size of their own."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_bias, read_common, read_default_rope, read_head_dim, read_qwen2_windows
from xspec.hf.hf_config import qwen_windows


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_common(cfg, tie_default=False, kv_heads=32)
    read_head_dim(cfg, "head_dim", default=128)
    read_bias(cfg, "attention_bias")
    read_default_rope(cfg)
    read_qwen2_windows(cfg, m)


def write(params: dict, config: dict) -> None:
    qwen_windows(params, config)


FAMILY = Family("qwen3", "qwen3", "Qwen3ForCausalLM", read, 32768,
                keys={"head_dim": "head_dim", "attention_bias": "attention_bias",
                      "use_sliding_window": "use_sliding_window", "max_window_layers": "max_window_layers"},
                write=write)
