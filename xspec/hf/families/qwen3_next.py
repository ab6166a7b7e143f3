"""Qwen3-Next (Qwen3NextForCausalLM): Gated DeltaNet or gated full attention by layer_types, Qwen3-MoE's
experts with a gated shared expert."""

from __future__ import annotations


from xspec.base.errors import UserError
from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import (read_bias, read_common, read_head_dim, read_kinds, read_partial_rotary,
                                       read_qwen_experts)
from xspec.hf.hf_config import layer_types, sparse_layers
from xspec.hf.weight_map import WeightRules, mlp_experts


def read(cfg: ConfigReader, m: Mapped) -> None:
    """Qwen3-Next: by layer_types, Gated DeltaNet (the linear_* sizes) or gated full attention with
    QK-norm and partial rotary positions; Qwen3-MoE's experts with a gated shared expert."""
    read_common(cfg, tie_default=False, kv_heads=2)
    read_head_dim(cfg, "head_dim", default=256)
    read_bias(cfg, "attention_bias")
    read_partial_rotary(cfg, default=0.25)
    layers = cfg.config["num_hidden_layers"]
    interval = cfg.number("full_attention_interval", 4)
    kinds = read_kinds(cfg, "layer_types", ("linear_attention", "full_attention"), layers)
    if kinds is None:
        kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    elif cfg.has("full_attention_interval"):
        cfg.notes["full_attention_interval"] = "transformers reads layer_types in its place"
    cfg.put("layer_types", kinds, "layer_types" if cfg.has("layer_types") else "full_attention_interval")
    key_heads = cfg.map("linear_num_key_heads", "linear_num_key_heads", 16)
    value_heads = cfg.map("linear_num_value_heads", "linear_num_value_heads", 32)
    if value_heads % key_heads:
        raise UserError(f"{cfg.file}: linear_num_value_heads {value_heads} is not a multiple of "
                        f"linear_num_key_heads {key_heads}")
    for key, default in (("linear_key_head_dim", 128), ("linear_value_head_dim", 128), ("linear_conv_kernel_dim", 4)):
        cfg.map(key, key, default)
    cfg.map("num_experts", "num_experts", 512)
    cfg.ignore("num_local_experts", "not read by transformers' Qwen3-Next, which reads num_experts")
    cfg.map("shared_expert_intermediate_size", "shared_expert_intermediate_size", 512)
    read_qwen_experts(cfg, normalized=True, per_token=10, width=512)


def write(params: dict, config: dict) -> None:
    sparse_layers(params, config)
    config["layer_types"] = layer_types(params)


FAMILY = Family("qwen3_next", "qwen3_next", "Qwen3NextForCausalLM", read, 32768,
                keys={key: key for key in (
                    "head_dim", "attention_bias", "partial_rotary_factor", "linear_num_key_heads",
                    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
                    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                    "decoder_sparse_step", "norm_topk_prob", "router_aux_loss_coef")},
                write=write, weights=WeightRules("qwen3_next", mlp_experts))
