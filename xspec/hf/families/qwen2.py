"""Qwen2 (Qwen2ForCausalLM): LLaMA's layers with q, k, v biases and optional sliding windows."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_common, read_default_rope, read_head_dim, read_qwen2_windows
from xspec.hf.hf_config import qwen_windows


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_common(cfg, tie_default=False, kv_heads=32)
    read_head_dim(cfg, None)                  # not a field of Qwen2Config, but its attention reads one given
    read_default_rope(cfg)
    read_qwen2_windows(cfg, m)
    # The q, k, v biases are part of Qwen2 (transformers has no attribute for them).
    cfg.expect("attention_bias", [True], True, " (Qwen2 has q, k, v biases)")


def write(params: dict, config: dict) -> None:
    qwen_windows(params, config)


FAMILY = Family("qwen2", "qwen2", "Qwen2ForCausalLM", read, 32768,
                keys={"use_sliding_window": "use_sliding_window", "max_window_layers": "max_window_layers"},
                write=write)
