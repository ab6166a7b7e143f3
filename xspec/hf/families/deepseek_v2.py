"""DeepSeek-V2 (DeepseekV2ForCausalLM): DeepSeek-V3's latent attention with pairs of rotary features,
softmax-scored experts chosen greedily, no multi-token prediction."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.deepseek_v3 import DEEPSEEK, EXPERTS, LATENT, read_deepseek_attention, write_latent
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_deepseek_experts


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_deepseek_attention(cfg, m, interleaved=True)   # DeepSeek-V2 turns pairs (x0, x1) as complex numbers
    cfg.ignore("num_nextn_predict_layers", "multi-token prediction modules, which DeepSeek-V2 does not have and "
                                           "transformers does not run either; xspec imports the model without them")
    read_deepseek_experts(cfg, "num_experts", first_dense=0, experts=64, per_token=None, width=1407, shared=2,
                          scale=1.0)
    cfg.expect("topk_method", ["greedy"], "greedy", " (group_limited_greedy is not supported yet)")
    for key in ("n_group", "topk_group"):
        cfg.ignore(key, "the groups of group_limited_greedy; greedy routing has none")
    cfg.expect("norm_topk_prob", [False], False, " (transformers' DeepseekV2 weighs the chosen experts by their "
                                                 "softmax scores without renormalizing them)")
    cfg.ignore("scoring_func", "transformers' DeepSeek-V2 always scores experts by softmax")
    cfg.expect("mlp_bias", [False], False, " (DeepSeek's checkpoints have no feed-forward biases)")


def write(params: dict, config: dict) -> None:
    """DeepSeek-V2 always turns pairs (its weights are written so) and routes greedily."""
    write_latent(params, config)
    config |= {"topk_method": "greedy", "n_group": None, "topk_group": None, "num_nextn_predict_layers": 0}


FAMILY = Family("deepseek_v2", "deepseek_v2", "DeepseekV2ForCausalLM", read, 2048, keys={**LATENT, **EXPERTS},
                write=write, weights=DEEPSEEK)
