"""DeepSeek-V3 (DeepseekV3ForCausalLM): multi-head latent attention, experts chosen within groups
with a load-correction bias, multi-token prediction; the latent attention and experts DeepSeek-V2 and
GLM-4.5 share."""

from __future__ import annotations

import re

from xspec.base.errors import UserError
from xspec.hf.config_reader import ConfigReader, render
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import (read_bias, read_common, read_deepseek_experts, read_expert_groups,
                                       read_multi_token_prediction, refuse_quantized, yarn_mscale)
from xspec.hf.rope import read_rope
from xspec.hf.weight_map import Group, PLAIN, Tensors, WeightRules, mlp_experts


# Latent attention's sizes and DeepSeek's experts keep the config's names.
LATENT = {key: key for key in ("attention_bias", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                               "v_head_dim")}
EXPERTS = {key: key for key in ("first_k_dense_replace", "n_routed_experts", "num_experts_per_tok",
                                "moe_intermediate_size", "n_shared_experts", "routed_scaling_factor",
                                "norm_topk_prob")}
EXPERT_GROUPS = {"n_group": "n_group", "topk_group": "topk_group"}
PREDICTION = {"mtp_depth": "num_nextn_predict_layers"}  # multi-token prediction's depths (DeepSeek-V3 §2.2)


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_deepseek_attention(cfg, m, interleaved=cfg.flag("rope_interleave", True), kv_default=128)
    read_multi_token_prediction(cfg, 1)
    experts = read_deepseek_experts(cfg, "num_local_experts", first_dense=3, experts=256, per_token=8, width=2048,
                                shared=1, scale=2.5)
    read_expert_groups(cfg, experts, groups=8, top_groups=4)
    cfg.put("norm_topk_prob", cfg.flag("norm_topk_prob", True), "norm_topk_prob")
    # Keys DeepSeek's own config.json carries beside transformers' ones, which transformers does not read.
    cfg.ignore("topk_method", "transformers' DeepSeek-V3 always chooses within groups with the correction bias "
                              "(noaux_tc)")
    cfg.ignore("scoring_func", "transformers' DeepSeek-V3 always scores experts by sigmoid")


def read_deepseek_attention(cfg: ConfigReader, m: Mapped, interleaved: bool, kv_default: int | None = None) -> None:
    """DeepSeek's layers but their experts: multi-head latent attention, YaRN with its mscale, the norms.
    `kv_default`: num_key_value_heads where config.json has none (None: num_attention_heads)."""
    refuse_quantized(cfg)
    read_common(cfg, tie_default=False)
    heads = cfg.config["num_attention_heads"]
    kv_heads = cfg.config.get("num_key_value_heads", heads if kv_default is None else kv_default)
    if kv_heads not in (None, heads):
        given = "num_key_value_heads" if cfg.has("num_key_value_heads") else "num_key_value_heads (absent: default)"
        raise UserError(f"{cfg.file}: {given} {render(kv_heads)} is not supported: latent attention makes every "
                        f"head's keys from the latent (supported: num_attention_heads, {heads})")
    query_rank = cfg.get("q_lora_rank", 1536)      # null: the queries are made directly
    cfg.put("q_lora_rank", 0 if query_rank is None else cfg.number("q_lora_rank", 1536),
            "q_lora_rank" if cfg.has("q_lora_rank") else "q_lora_rank (default)")
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        cfg.map(key, key)
    if cfg.config["qk_rope_head_dim"] % 2:
        raise UserError(f"{cfg.file}: qk_rope_head_dim {cfg.config['qk_rope_head_dim']} is odd: rotary positions "
                        "turn pairs of features")
    for key, derived in (("head_dim", "qk_rope_head_dim"), ("qk_head_dim", "qk_nope_head_dim + qk_rope_head_dim")):
        cfg.ignore(key, f"transformers derives it ({derived}) whatever config.json says")
    read_bias(cfg, "attention_bias")
    # Interleaved rotary features ((x0, x1), (x2, x3), ...) are the plain layout's rows reordered: import
    # reorders them (weight_map.py), so the spec turns halves as every family does.
    m.weights = INTERLEAVED if interleaved else DEEPSEEK
    rope = read_rope(cfg, ("default", "yarn"), scaling_extras=("mscale", "mscale_all_dim", "attention_factor"))
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))
    if rope["rope_type"] == "default":
        cfg.ignore("original_max_position_embeddings", "the context before a rotary scaling; none is declared")
        return
    factor = float(rope["factor"])
    if factor < 1:
        raise UserError(f"{cfg.file}: {rope.where}.factor {render(rope['factor'])} is not supported (supported: "
                        "a YaRN factor of at least 1)")
    cfg.put("rope_type", "yarn", f"{rope.where}.rope_type")
    cfg.put("rope_factor", factor, f"{rope.where}.factor")
    cfg.put("original_max_position_embeddings", rope["original_max_position_embeddings"],
            rope.source("original_max_position_embeddings"))
    m.scaled_from = rope["original_max_position_embeddings"]
    for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        cfg.put(name, float(rope.get(name, default)), rope.source(name) if name in rope else f"{name} (default)")
    if rope.get("truncate", True) is not True:
        raise UserError(f"{cfg.file}: {rope.where}.truncate {render(rope['truncate'])} is not supported "
                        "(supported: true)")
    mscale, mscale_all_dim = float(rope.get("mscale") or 0), float(rope.get("mscale_all_dim") or 0)
    if "attention_factor" in rope:
        attention_factor, source = float(rope["attention_factor"]), f"{rope.where}.attention_factor"
    elif mscale and mscale_all_dim:
        attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        source = f"{rope.where}.mscale / mscale_all_dim"
    else:
        attention_factor, source = yarn_mscale(factor, 1.0), f"{rope.where}.factor (0.1 ln(factor) + 1)"
    cfg.put("rope_attention_factor", attention_factor, source)
    cfg.put("mscale_all_dim", mscale_all_dim, f"{rope.where}.mscale_all_dim" if mscale_all_dim else
            f"{rope.where}: no mscale_all_dim")


def write(params: dict, config: dict) -> None:
    write_latent(params, config)
    config["rope_interleave"] = False   # the rotary features in halves, as export writes the weights


def write_latent(params: dict, config: dict) -> None:
    """Queries' latent (null: none), and YaRN with its attention factor as the spec holds it."""
    config["q_lora_rank"] = params["q_lora_rank"] or None
    if params["rope_type"] == "yarn":
        config["rope_scaling"] = {"rope_type": "yarn", "factor": params["rope_factor"],
                                  "original_max_position_embeddings": params["original_max_position_embeddings"],
                                  "beta_fast": params["beta_fast"], "beta_slow": params["beta_slow"],
                                  "mscale_all_dim": params["mscale_all_dim"],
                                  "attention_factor": params["rope_attention_factor"]}


def interleaved_rotary(name: str, shapes: dict, params: dict) -> Group | None:
    """DeepSeek's rotary features as pairs (x0, x1), (x2, x3), ... (rope_interleave): the rows of the
    projections that make them, reordered to halves (x0, x2, ..., x1, x3, ...), which the spec turns."""
    import torch  # here, not at the top: `xspec --help` lists the families without torch

    found = re.fullmatch(r"decoder\.layers\.\d+\.self_attn\.(q_proj\.weight|q_b_proj\.weight|kv_a_proj_with_mqa\.\w+)",
                         name)
    if found is None:
        return mlp_experts(name, shapes, params)
    rope = params["qk_rope_head_dim"]
    halves = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])
    pairs = halves.argsort()
    if found[1].startswith("kv_a_proj"):  # [kv_lora_rank + rope, ...]: the shared rotary key last
        latent = params["kv_lora_rank"]

        def reorder(order):
            return lambda t: [torch.cat([t[0][:latent], t[0][latent:][order]])]
    else:  # [heads * (nope + rope), ...]: each head's rotary features after its others
        nope = params["qk_nope_head_dim"]

        def reorder(order):
            def apply(t: Tensors) -> Tensors:
                heads = t[0].view(-1, nope + rope, t[0].size(-1))
                return [torch.cat([heads[:, :nope], heads[:, nope:][:, order]], dim=1).flatten(0, 1)]
            return apply
    return Group((PLAIN.checkpoint_name(name),), (name,), reorder(halves), reorder(pairs))


# Experts stored one matrix per expert; the rotary features in halves, or (rope_interleave) in pairs.
DEEPSEEK = WeightRules("deepseek", mlp_experts)
INTERLEAVED = WeightRules("deepseek_interleaved", interleaved_rotary)
FAMILY = Family("deepseek_v3", "deepseek_v3", "DeepseekV3ForCausalLM", read, 4096,
                keys={**LATENT, **EXPERTS, **EXPERT_GROUPS, **PREDICTION}, write=write, weights=DEEPSEEK)
