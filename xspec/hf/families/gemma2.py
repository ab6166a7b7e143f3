"""Gemma 2 (Gemma2ForCausalLM): a norm before and after each sublayer, sliding and global layers
alternating, soft-capped scores and logits."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_default_rope, read_gemma_common, read_layer_types
from xspec.hf.hf_config import layer_types


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
