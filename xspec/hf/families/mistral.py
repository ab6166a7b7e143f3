"""Mistral (MistralForCausalLM): LLaMA's layers with a sliding window in each."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import (note_unread_layer_types, read_common, read_default_rope, read_head_dim,
                                       read_window)


def read_mistral(cfg: ConfigReader, m: Mapped, *, window: int | None = 4096, theta: float = 10000.0,
                 eps: float = 1e-6) -> None:
    """Mistral's layers, each attending within sliding_window (`window` where config.json has none; null:
    no window). Its config class keeps a layer_types list it is given, but its attention does not read it."""
    read_common(cfg, tie_default=False, eps=eps, kv_heads=8)
    read_head_dim(cfg, "head_dim")
    read_default_rope(cfg, theta)
    if cfg.get("sliding_window", window) is None:   # no window: one as long as the positions the model takes
        cfg.put("sliding_window", m.max_positions, "sliding_window null: max_position_embeddings")
    else:
        m.window = read_window(cfg, window or 0)
    note_unread_layer_types(cfg, "transformers applies sliding_window to every layer; layer_types shapes only its "
                                 "cache")


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_mistral(cfg, m)


FAMILY = Family("mistral", "mistral", "MistralForCausalLM", read, 131072,
                keys={"head_dim": "head_dim", "sliding_window": "sliding_window"})
