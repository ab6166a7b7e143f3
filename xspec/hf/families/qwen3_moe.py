"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's layers with routed experts in those decoder_sparse_step
picks."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import (read_bias, read_common, read_default_rope, read_head_dim, read_qwen2_windows,
                                       read_qwen_experts)
from xspec.hf.hf_config import qwen_windows, sparse_layers
from xspec.hf.weight_map import WeightRules, mlp_experts


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_common(cfg, tie_default=False, kv_heads=4)
    read_head_dim(cfg, "head_dim")            # not a field of Qwen3MoeConfig: hidden_size / heads unless given
    read_bias(cfg, "attention_bias")
    read_default_rope(cfg)
    read_qwen2_windows(cfg, m, every_layer=True)
    cfg.map(cfg.spelling("num_local_experts", "num_experts"), "num_experts", 128)
    read_qwen_experts(cfg, normalized=False, per_token=8, width=768)


def write(params: dict, config: dict) -> None:
    qwen_windows(params, config, kinds=False)
    sparse_layers(params, config)


FAMILY = Family("qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM", read, 32768,
                keys={"head_dim": "head_dim", "attention_bias": "attention_bias",
                      "use_sliding_window": "use_sliding_window", "max_window_layers": "max_window_layers",
                      "num_experts": "num_experts", "num_experts_per_tok": "num_experts_per_tok",
                      "moe_intermediate_size": "moe_intermediate_size", "decoder_sparse_step": "decoder_sparse_step",
                      "norm_topk_prob": "norm_topk_prob", "router_aux_loss_coef": "router_aux_loss_coef"},
                write=write, weights=WeightRules("qwen3_moe", mlp_experts))
