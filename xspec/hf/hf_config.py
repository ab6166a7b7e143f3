"""A spec's parameters as the config.json of its family's transformers class: the inverse of families.py,
in the rope_theta + rope_scaling spelling that every transformers version reads."""

from __future__ import annotations

from typing import Any

COMMON = {"vocab": "vocab_size", "d_model": "hidden_size", "layers": "num_hidden_layers",
          "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "d_ff": "intermediate_size",
          "rms_norm_eps": "rms_norm_eps", "tie_word_embeddings": "tie_word_embeddings", "rope_theta": "rope_theta"}
# DeepSeek's latent attention, its experts and their groups (GLM-4.5 has the experts and groups too): the
# parameters keep the config's names.
_LATENT = {key: key for key in ("attention_bias", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                "v_head_dim")}
_EXPERTS = {key: key for key in ("first_k_dense_replace", "n_routed_experts", "num_experts_per_tok",
                                 "moe_intermediate_size", "n_shared_experts", "routed_scaling_factor",
                                 "norm_topk_prob")}
_EXPERT_GROUPS = {"n_group": "n_group", "topk_group": "topk_group"}
_PREDICTION = {"mtp_depth": "num_nextn_predict_layers"}  # multi-token prediction's depths (DeepSeek-V3 §2.2)
# Each model_type's parameters beyond COMMON, by the config key they become.
OWN: dict[str, dict[str, str]] = {
    "llama": {"attention_bias": "attention_bias", "mlp_bias": "mlp_bias"},
    "mistral": {"head_dim": "head_dim", "sliding_window": "sliding_window"},
    "mixtral": {"head_dim": "head_dim", "sliding_window": "sliding_window", "num_local_experts": "num_local_experts",
                "num_experts_per_tok": "num_experts_per_tok", "router_aux_loss_coef": "router_aux_loss_coef"},
    "qwen2": {"use_sliding_window": "use_sliding_window", "max_window_layers": "max_window_layers"},
    "qwen3": {"head_dim": "head_dim", "attention_bias": "attention_bias", "use_sliding_window": "use_sliding_window",
              "max_window_layers": "max_window_layers"},
    "qwen3_moe": {"head_dim": "head_dim", "attention_bias": "attention_bias",
                  "use_sliding_window": "use_sliding_window", "max_window_layers": "max_window_layers",
                  "num_experts": "num_experts", "num_experts_per_tok": "num_experts_per_tok",
                  "moe_intermediate_size": "moe_intermediate_size", "decoder_sparse_step": "decoder_sparse_step",
                  "norm_topk_prob": "norm_topk_prob", "router_aux_loss_coef": "router_aux_loss_coef"},
    "gemma2": {"head_dim": "head_dim", "attention_bias": "attention_bias", "sliding_window": "sliding_window",
               "query_pre_attn_scalar": "query_pre_attn_scalar",
               "attn_logit_softcapping": "attn_logit_softcapping"},
    "gemma3_text": {"head_dim": "head_dim", "attention_bias": "attention_bias", "sliding_window": "sliding_window",
                    "query_pre_attn_scalar": "query_pre_attn_scalar",
                    "sliding_window_pattern": "sliding_window_pattern",
                    "rope_local_base_freq": "rope_local_base_freq"},
    "olmo2": {"attention_bias": "attention_bias"},
    "phi3": {"partial_rotary_factor": "partial_rotary_factor"},
    "gpt_oss": {"head_dim": "head_dim", "sliding_window": "sliding_window", "num_local_experts": "num_local_experts",
                "num_experts_per_tok": "num_experts_per_tok", "swiglu_limit": "swiglu_limit",
                "router_aux_loss_coef": "router_aux_loss_coef"},
    "deepseek_v2": {**_LATENT, **_EXPERTS},
    "deepseek_v3": {**_LATENT, **_EXPERTS, **_EXPERT_GROUPS, **_PREDICTION},
    "bamba": {"attention_bias": "attention_bias", "mlp_bias": "mlp_bias",
              **{key: key for key in ("mamba_n_heads", "mamba_expand", "mamba_d_head", "mamba_n_groups",
                                      "mamba_d_state", "mamba_d_conv", "mamba_chunk_size", "mamba_conv_bias",
                                      "mamba_proj_bias")}},
    "qwen3_next": {key: key for key in (
        "head_dim", "attention_bias", "partial_rotary_factor", "linear_num_key_heads", "linear_num_value_heads",
        "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts",
        "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step",
        "norm_topk_prob", "router_aux_loss_coef")},
    "nemotron_h": {key: key for key in (
        "head_dim", "attention_bias", "mlp_bias", "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size",
        "conv_kernel", "chunk_size", "use_conv_bias", "mamba_proj_bias", "time_step_min", "layers_block_type")},
    "glm4_moe": {"head_dim": "head_dim", "attention_bias": "attention_bias", "use_qk_norm": "use_qk_norm",
                 "partial_rotary_factor": "partial_rotary_factor", **_EXPERTS, **_EXPERT_GROUPS, **_PREDICTION},
}


def config_for(model_type: str, hf_class: str, params: dict[str, Any], max_positions: int,
               bos_id: int | None, eos_ids: list[int]) -> dict[str, Any]:
    config: dict[str, Any] = {"architectures": [hf_class], "model_type": model_type,
                              "max_position_embeddings": max_positions,
                              "bos_token_id": bos_id,
                              "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids or None,
                              # padding is never attended to; null keeps a class default (Phi-3's 32000) from
                              # naming a row past a small vocabulary
                              "pad_token_id": None}
    for param, key in {**COMMON, **OWN[model_type]}.items():
        config[key] = params[param]
    if model_type == "llama" and params["d_k"] != params["d_model"] // params["heads"]:
        config["head_dim"] = params["d_k"]
    if model_type in ("gemma2", "gemma3_text"):
        config["hidden_activation"] = "gelu_pytorch_tanh"
        softcap = params["final_logit_softcapping"]
        config["final_logit_softcapping"] = softcap if softcap > 0 else None
    else:
        config["hidden_act"] = "silu"
    if model_type in ("qwen2", "qwen3", "qwen3_moe"):
        config["sliding_window"] = params["sliding_window"] if params["use_sliding_window"] else None
    if model_type in ("qwen3_moe", "qwen3_next"):  # the layers without experts beyond decoder_sparse_step's
        sparse, step = params["sparse_layers"], params["decoder_sparse_step"]
        if any(sparse[i] != ((i + 1) % step == 0) for i in range(params["layers"])):
            config["decoder_sparse_step"] = 1
        config["mlp_only_layers"] = [i for i in range(params["layers"])
                                     if not sparse[i] and (i + 1) % config["decoder_sparse_step"] == 0]
    if model_type in ("gemma2", "gemma3_text", "gpt_oss", "qwen3_next", "qwen2", "qwen3"):  # each layer's kind
        config["layer_types"] = list(params["layer_types"][:params["layers"]])
    if model_type in ("qwen2", "qwen3"):  # a layer slides with use_sliding_window alone, in transformers as here
        config["layer_types"] = [kind if params["use_sliding_window"] else "full_attention"
                                 for kind in config["layer_types"]]
    if model_type == "gemma3_text":
        factor = params["rope_scaling_factor"]
        config["rope_scaling"] = {"rope_type": "linear", "factor": factor} if factor != 1.0 else None
    if model_type == "gpt_oss":
        config["attention_bias"] = True
        config["rope_scaling"] = {"rope_type": "yarn", "factor": params["rope_scaling_factor"],
                                  "beta_fast": params["beta_fast"], "beta_slow": params["beta_slow"],
                                  "original_max_position_embeddings": params["original_max_position_embeddings"],
                                  "truncate": False}
    if model_type == "llama" and "rope_type" in params:
        config["rope_scaling"] = _llama_scaling(params)
    if model_type.startswith("deepseek"):
        config |= _deepseek(params, model_type)
    if model_type == "nemotron_h":  # its own spellings: blocks count the layers; the norms' epsilon; relu^2
        del config["num_hidden_layers"], config["rope_theta"]
        config["layers_block_type"] = list(params["layers_block_type"][:params["layers"]])
        config["layer_norm_epsilon"] = config.pop("rms_norm_eps")
        config |= {"mlp_hidden_act": "relu2", "num_nextn_predict_layers": 0}
        config.pop("hidden_act", None)
    if model_type == "bamba":  # the attention layers by number; dt bounded below only (transformers 5's spelling)
        config["attn_layer_indices"] = [i for i, kind in enumerate(params["layer_types"][:params["layers"]])
                                        if kind == "full_attention"]
        config["time_step_limit"] = [params["time_step_min"], {"__float__": "Infinity"}]
        if params["d_k"] != params["d_model"] // params["heads"]:
            config["head_dim"] = params["d_k"]
    return config


def _deepseek(params: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Queries' latent (null: none), YaRN with its attention factor as the spec holds it, and the rotary
    layout: DeepSeek-V3's in halves (export writes them so); DeepSeek-V2 always turns pairs, its weights
    written so, and routes greedily."""
    config: dict[str, Any] = {"q_lora_rank": params["q_lora_rank"] or None}
    if model_type == "deepseek_v3":
        config["rope_interleave"] = False
    else:
        config |= {"topk_method": "greedy", "n_group": None, "topk_group": None, "num_nextn_predict_layers": 0}
    if params["rope_type"] == "yarn":
        config["rope_scaling"] = {"rope_type": "yarn", "factor": params["rope_factor"],
                                  "original_max_position_embeddings": params["original_max_position_embeddings"],
                                  "beta_fast": params["beta_fast"], "beta_slow": params["beta_slow"],
                                  "mscale_all_dim": params["mscale_all_dim"],
                                  "attention_factor": params["rope_attention_factor"]}
    return config


def _llama_scaling(params: dict[str, Any]) -> dict[str, Any]:
    kind = params["rope_type"]
    scaling: dict[str, Any] = {"rope_type": kind, "factor": params["rope_factor"]}
    if kind in ("llama3", "yarn"):
        scaling["original_max_position_embeddings"] = params["original_max_position_embeddings"]
    if kind == "llama3":
        scaling |= {"low_freq_factor": params["low_freq_factor"], "high_freq_factor": params["high_freq_factor"]}
    if kind == "yarn":
        scaling |= {"beta_fast": params["beta_fast"], "beta_slow": params["beta_slow"],
                    "truncate": params["rope_truncate"]}
    return scaling
