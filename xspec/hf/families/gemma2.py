"""Gemma 2 (Gemma2ForCausalLM): a norm before and after each sublayer, sliding and global layers
alternating, soft-capped scores and logits."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import (read_bias, read_common, read_default_rope, read_head_dim, read_layer_types,
                                       read_window)
from xspec.hf.hf_config import layer_types


def read_gemma_common(cfg: ConfigReader, m: Mapped, *, final_softcap: float | None) -> None:
    """Gemma's layers; `final_softcap`: final_logit_softcapping where config.json has none (null: none)."""
    read_common(cfg, tie_default=True, activation="gelu_pytorch_tanh", kv_heads=4)
    read_head_dim(cfg, "head_dim", default=256)
    read_bias(cfg, "attention_bias")
    cfg.map("query_pre_attn_scalar", "query_pre_attn_scalar", 256, integer=False)
    m.window = read_window(cfg, 4096)
    cfg.expect("use_bidirectional_attention", [None, False], None, " (the spec's attention is causal)")
    final = cfg.get("final_logit_softcapping", final_softcap)
    cfg.put("final_logit_softcapping",
            0.0 if final is None else cfg.number("final_logit_softcapping", final_softcap, integer=False, least=1e-9),
            "final_logit_softcapping" if cfg.has("final_logit_softcapping") else "final_logit_softcapping (default)")


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_gemma_common(cfg, m, final_softcap=30.0)
    cfg.map("attn_logit_softcapping", "attn_logit_softcapping", 50.0, integer=False, least=1e-9)
    read_default_rope(cfg)
    read_layer_types(cfg)
    cfg.ignore("sliding_window_pattern", "transformers' Gemma 2 alternates sliding and full layers whatever it says")


def write(params: dict, config: dict) -> None:
    """Gemma's own spelling of the activation, its final soft-capping (null: none), each layer's kind."""
    del config["hidden_act"]
    config["hidden_activation"] = "gelu_pytorch_tanh"
    softcap = params["final_logit_softcapping"]
    config["final_logit_softcapping"] = softcap if softcap > 0 else None
    config["layer_types"] = layer_types(params)


FAMILY = Family("gemma2", "gemma2", "Gemma2ForCausalLM", read, 8192,
                keys={"head_dim": "head_dim", "attention_bias": "attention_bias", "sliding_window": "sliding_window",
                      "query_pre_attn_scalar": "query_pre_attn_scalar",
                      "attn_logit_softcapping": "attn_logit_softcapping"},
                write=write)
