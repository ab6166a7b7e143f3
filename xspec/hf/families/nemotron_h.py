"""Nemotron-H (NemotronHForCausalLM): single-mixer blocks, Mamba-2, attention or a squared-ReLU
feed-forward, under NVIDIA's top-level `backbone.`."""

from __future__ import annotations

from xspec.base.errors import UserError
from xspec.compiler.limits import MAX_REPEAT
from xspec.hf.config_reader import ConfigReader, refuse, render
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import LEGACY_KINDS, ZERO, read_bias, read_kv_heads
from xspec.hf.hf_config import layer_types
from xspec.hf.weight_map import WeightRules


# Nemotron-H's block kinds as hybrid_override_pattern spells them, one character a block, and those the
# spec has (no mixture of experts yet).
PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


NEMOTRON_H_BLOCKS = ("linear_attention", "full_attention", "mlp")


# Keys of NVIDIA's own config.json that transformers reads under Nemotron-H's names (the older first).
NEMOTRON_H_SPELLINGS = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "expand": "mamba_expand",
                        "time_step_min": "mamba_dt_min", "time_step_max": "mamba_dt_max",
                        "time_step_limit": "mamba_dt_limit", "time_step_floor": "mamba_dt_init_floor",
                        "use_conv_bias": "mamba_conv_bias", "chunk_size": "mamba_chunk_size"}


def read_blocks(cfg: ConfigReader) -> list[str]:
    """The block kinds: layers_block_type (or its alias layer_types), else hybrid_override_pattern's
    characters, as transformers' config class reads them."""
    key = cfg.spelling("layer_types", "layers_block_type")
    pattern = cfg.get("hybrid_override_pattern", None)
    given = cfg.get(key, None)
    if given is None and pattern is None:
        raise UserError(f"{cfg.file}: no layers_block_type or hybrid_override_pattern, which a nemotron_h model "
                        "needs")
    if given is None:
        if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_REPEAT:
            raise UserError(f"{cfg.file}: hybrid_override_pattern {render(pattern)} is not a string of block kinds")
        for i, character in enumerate(pattern):
            if PATTERN.get(character) not in NEMOTRON_H_BLOCKS:
                refuse(f"hybrid_override_pattern[{i}] {render(character)}", ["M", "*", "-"], cfg.file,
                       " (E, a mixture-of-experts block, is not supported yet)" if character == "E" else
                       " (M: Mamba-2, *: attention, -: feed-forward)")
        given, key = [PATTERN[c] for c in pattern], "hybrid_override_pattern"
    elif pattern is not None:
        cfg.notes["hybrid_override_pattern"] = f"transformers reads {key} in its place"
    if not isinstance(given, list) or not given or len(given) > MAX_REPEAT:
        raise UserError(f"{cfg.file}: {key} is not a list of block kinds")
    kinds = [LEGACY_KINDS.get(kind, kind) if isinstance(kind, str) else kind for kind in given]
    for i, kind in enumerate(kinds):
        if kind not in NEMOTRON_H_BLOCKS:
            refuse(f"{key}[{i}] {render(given[i])}", list(NEMOTRON_H_BLOCKS), cfg.file,
                   " (mixture-of-experts blocks are not supported yet)" if kind == "moe" else "")
    cfg.put("layers_block_type", kinds, key)
    return kinds


def read(cfg: ConfigReader, m: Mapped) -> None:
    """Nemotron-H: single-mixer blocks, by layers_block_type Mamba-2, attention without positions or a
    squared-ReLU feed-forward (mixture-of-experts blocks are refused)."""
    kinds = read_blocks(cfg)
    cfg.put("layers", len(kinds), "layers_block_type")
    layers = cfg.get("num_hidden_layers", None)
    if layers is not None and layers != len(kinds):
        cfg.notes["num_hidden_layers"] = f"transformers counts the blocks ({len(kinds)}) in its place"
    cfg.map("vocab_size", "vocab")
    cfg.map("hidden_size", "d_model")
    read_kv_heads(cfg, cfg.map("num_attention_heads", "heads"), 8)
    cfg.map("head_dim", "head_dim", 128)
    cfg.map("intermediate_size", "d_ff")
    cfg.map("layer_norm_epsilon", "rms_norm_eps", 1e-5, integer=False, least=0)
    cfg.put("tie_word_embeddings", cfg.flag("tie_word_embeddings", False), "tie_word_embeddings")
    for key in ("attention_bias", "mlp_bias", "mamba_proj_bias"):
        read_bias(cfg, key)
    spelled = {key: cfg.spelling(older, key) for key, older in NEMOTRON_H_SPELLINGS.items()}
    cfg.put("use_conv_bias", cfg.flag(spelled["use_conv_bias"], True), spelled["use_conv_bias"])
    cfg.expect("mlp_hidden_act", ["relu2"], "relu2")
    cfg.expect("mamba_hidden_act", ["silu"], "silu")
    cfg.expect("sliding_window", [None], None)
    cfg.expect("use_bias", [False], False)
    for key in ("attention_dropout", "hidden_dropout"):
        cfg.expect(key, ZERO, 0.0, " (dropout is left out of imported models)")
    mamba_heads = cfg.map("mamba_num_heads", "mamba_num_heads", 128)
    cfg.map("mamba_head_dim", "mamba_head_dim", 64)
    groups = cfg.map(spelled["n_groups"], "n_groups", 8)
    if mamba_heads % groups:
        raise UserError(f"{cfg.file}: {spelled['n_groups']} {groups} does not divide mamba_num_heads {mamba_heads}")
    cfg.map("ssm_state_size", "ssm_state_size", 128)
    for key, default in (("conv_kernel", 4), ("chunk_size", 128)):
        cfg.map(spelled[key], key, default)
    # transformers clamps dt at time_step_min from below, whatever time_step_limit says
    cfg.map(spelled["time_step_min"], "time_step_min", 0.001, integer=False, least=0)
    for key, why in ((spelled["time_step_limit"], "transformers' Nemotron-H bounds dt by time_step_min instead"),
                     (spelled["time_step_max"], "how dt_bias is initialised; an import starts from the weights"),
                     (spelled["time_step_floor"], "how dt_bias is initialised; an import starts from the weights"),
                     (spelled["expand"], "the mixer's width is mamba_num_heads x mamba_head_dim in transformers' "
                                         "Nemotron-H"),
                     ("residual_in_fp32", "a precision of the residual stream: float32 models keep it anyway"),
                     ("rescale_prenorm_residual", "how a new model is initialised"),
                     ("use_mamba_kernels", "whether transformers uses fused kernels; the pure form is the same"),
                     ("mamba_ssm_cache_dtype", "the precision of transformers' cache"),
                     ("num_logits_to_keep", "how many positions' logits transformers' forward returns"),
                     ("attention_head_dim", "NVIDIA's code's name for it; transformers reads head_dim"),
                     ("rms_norm_eps", "NVIDIA's code's name for it; transformers reads layer_norm_epsilon"),
                     ("time_step_rank", "read by NVIDIA's code only; transformers' Nemotron-H has no such rank")):
        cfg.ignore(key, why)
    for key in ("n_routed_experts", "num_local_experts", "n_shared_experts", "moe_intermediate_size",
                "moe_shared_expert_intermediate_size", "moe_latent_size", "moe_shared_expert_overlap",
                "num_experts_per_tok", "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob",
                "mtp_layers_block_type", "mtp_hybrid_override_pattern"):
        cfg.ignore(key, "the mixture of experts' settings; the model has no moe block")
    cfg.expect("num_nextn_predict_layers", [0], 0, " (Nemotron-H's multi-token prediction is not supported yet)")


def write(params: dict, config: dict) -> None:
    """Its own spellings: blocks count the layers; the norms' epsilon; relu^2."""
    del config["num_hidden_layers"], config["rope_theta"], config["hidden_act"]
    config["layers_block_type"] = layer_types(params, "layers_block_type")
    config["layer_norm_epsilon"] = config.pop("rms_norm_eps")
    config |= {"mlp_hidden_act": "relu2", "num_nextn_predict_layers": 0}


FAMILY = Family("nemotron_h", "nemotron_h", "NemotronHForCausalLM", read, 4096,
                keys={key: key for key in (
                    "head_dim", "attention_bias", "mlp_bias", "mamba_num_heads", "mamba_head_dim", "n_groups",
                    "ssm_state_size", "conv_kernel", "chunk_size", "use_conv_bias", "mamba_proj_bias", "time_step_min",
                    "layers_block_type")},
                write=write, weights=WeightRules("nemotron_h", prefix="backbone."))
