"""GLM-4.5 (Glm4MoeForCausalLM): grouped-query attention with partial rotary positions and optional
QK-norm, DeepSeek-V3's experts and multi-token prediction."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.deepseek_v3 import DEEPSEEK, EXPERT_GROUPS, EXPERTS, PREDICTION
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import (read_bias, read_common, read_deepseek_experts, read_expert_groups, read_head_dim,
                                       read_multi_token_prediction, read_partial_rotary, refuse_quantized)


def read(cfg: ConfigReader, m: Mapped) -> None:
    """GLM-4.5: grouped-query attention with partial rotary positions and optional QK-norm, DeepSeek-V3's
    experts."""
    refuse_quantized(cfg)
    read_common(cfg, tie_default=False, eps=1e-5, kv_heads=8)
    read_head_dim(cfg, "head_dim")
    read_bias(cfg, "attention_bias")
    cfg.put("use_qk_norm", cfg.flag("use_qk_norm", False), "use_qk_norm")
    read_partial_rotary(cfg, default=0.5)
    read_multi_token_prediction(cfg, 1)
    experts = read_deepseek_experts(cfg, "num_local_experts", first_dense=1, experts=128, per_token=8, width=1408,
                                shared=1, scale=1.0)
    read_expert_groups(cfg, experts, groups=1, top_groups=1)
    cfg.put("norm_topk_prob", cfg.flag("norm_topk_prob", True), "norm_topk_prob")


FAMILY = Family("glm4_moe", "glm4_moe", "Glm4MoeForCausalLM", read, 131072,
                keys={"head_dim": "head_dim", "attention_bias": "attention_bias", "use_qk_norm": "use_qk_norm",
                      "partial_rotary_factor": "partial_rotary_factor", **EXPERTS, **EXPERT_GROUPS, **PREDICTION},
                weights=DEEPSEEK)
