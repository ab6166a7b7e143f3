"""The shipped specs of the 2024-25 Transformer family beside Hugging Face's classes (a test-only oracle):
for each, the spec, the class, the configuration a size combination gives, and the weight mapping from
the class's state dict to the spec's modules. Sizes are given in the spec's parameters; the configuration
names them as checkpoints do (vocab -> vocab_size, d_model -> hidden_size, d_ff -> intermediate_size,
heads -> num_attention_heads, kv_heads -> num_key_value_heads, layers -> num_hidden_layers; the other
parameters carry the configuration's names)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import torch

RENAMED = {"vocab": "vocab_size", "d_model": "hidden_size", "d_ff": "intermediate_size",
           "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "layers": "num_hidden_layers"}

# transformers' names -> the spec's: the same after the top-level module, whose output head the spec's
# decoder holds. Only packing differs (stacked experts, Phi-3's fused matrices, interleaved rotary rows).
COMMON = [(r"lm_head\.weight", "decoder.lm_head.weight"), (r"model\.(.+)", r"decoder.\1")]


def renamed(state: dict[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    ours = {}
    for name, tensor in state.items():
        for pattern, target in rules:
            if re.fullmatch(pattern, name):
                ours[re.sub(pattern, target, name)] = tensor
                break
        else:
            raise AssertionError(f"no rule maps {name}")
    return ours


def gpt_oss_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt-oss's experts: gate_up_proj [E, d, 2 d_ff] with gate and up interleaved (even, odd columns) and
    its bias, down_proj [E, d_ff, d], multiplied from the left; the spec's gate's rows, then up's."""
    ours = {}
    for name, tensor in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            tensor = torch.cat([tensor[..., ::2], tensor[..., 1::2]], dim=-1).transpose(1, 2)
        elif name.endswith("mlp.experts.gate_up_proj_bias"):
            tensor = torch.cat([tensor[..., ::2], tensor[..., 1::2]], dim=-1)
        elif name.endswith("mlp.experts.down_proj"):
            tensor = tensor.transpose(1, 2)
        ours[name] = tensor
    return ours


@dataclass
class Family:
    spec: str
    hf_class: str
    config_class: str
    sizes: list[dict]                    # the spec's parameters: the first also drives logits and generation
    config: Callable[[dict], dict]       # extra configuration keys for a size combination
    weights: Callable[[dict, dict], dict]  # Hugging Face state dict, sizes -> the spec's state dict
    window: int = 0                      # the sliding window the first size combination has (sequences exceed it)
    chunk: int = 0                       # its recurrent layers' longest chunk (sequences exceed it too)
    experts: bool = False
    overrides: dict = field(default_factory=dict)  # parameters the spec is compiled with beside the sizes

    @property
    def name(self) -> str:
        return self.spec.rsplit("/", 1)[-1].removesuffix(".xspec")

    def hf_config(self, sizes: dict):
        import transformers

        values = {RENAMED.get(k, k): v for k, v in sizes.items()}
        values |= {"max_position_embeddings": 256, "attn_implementation": "eager", "pad_token_id": 0,
                   "eos_token_id": None, "bos_token_id": None, **self.config(sizes)}
        return getattr(transformers, self.config_class)(**values)

    def hf_model(self, sizes: dict, device: str = "cpu"):
        import transformers

        torch.manual_seed(1)
        with torch.device(device):
            model = getattr(transformers, self.hf_class)(self.hf_config(sizes))
        if device != "meta":
            with torch.no_grad():  # Hugging Face starts some tensors at zero (norm offsets, sinks, biases)
                for parameter in model.parameters():
                    parameter.add_(torch.randn_like(parameter) * 0.1)
                for name, buffer in model.named_buffers():  # DeepSeek's router correction: enough to move choices
                    if name.endswith("e_score_correction_bias"):
                        buffer.add_(torch.randn_like(buffer) * 0.5)
        return model.eval()


def plain_weights(state, sizes):
    return renamed(state, COMMON)


def tied_weights(state, sizes):
    ours = renamed({k: v for k, v in state.items() if k != "lm_head.weight"}, COMMON)
    return ours | {"decoder.lm_head.weight": ours["decoder.embed_tokens.weight"]}


def gpt_oss_weights(state, sizes):
    return renamed(gpt_oss_experts(state), COMMON)


def deepseek_interleaved(sizes: dict) -> bool:
    """Where the test's DeepSeek checkpoints lay rotary features in pairs (x0, x1), (x2, x3), ... (as
    DeepSeek-V3's do): with a queries' latent; in halves without one."""
    return sizes["q_lora_rank"] > 0


def deepseek_weights(state, sizes):
    """The latent attention's names; interleaved rotary rows (of q_proj or q_b_proj per head, and the shared
    rotary key's at the end of kv_a_proj_with_mqa) put in halves: evens, then odds."""
    ours = renamed(state, COMMON)
    if not deepseek_interleaved(sizes):
        return ours
    nope, rope_dim, latent = sizes["qk_nope_head_dim"], sizes["qk_rope_head_dim"], sizes["kv_lora_rank"]
    halves = list(range(0, rope_dim, 2)) + list(range(1, rope_dim, 2))
    for name, tensor in ours.items():
        if name.endswith(("self_attn.q_proj.weight", "self_attn.q_b_proj.weight")):
            heads = tensor.view(-1, nope + rope_dim, tensor.size(-1))
            ours[name] = torch.cat([heads[:, :nope], heads[:, nope:][:, halves]], dim=1).flatten(0, 1)
        elif ".self_attn.kv_a_proj_with_mqa." in name:
            ours[name] = torch.cat([tensor[:latent], tensor[latent:][halves]])
    return ours


def qwen3_next_config(sizes: dict) -> dict:
    """Full attention every fourth layer, from the fourth (the spec's default schedule)."""
    return {"layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(sizes["layers"])],
            "rms_norm_eps": 1e-6, **rope(1000000.0, partial_rotary_factor=0.25)}


def nemotron_h_config(sizes: dict) -> dict:
    """The spec's default blocks: Mamba-2, feed-forward, attention, feed-forward, again."""
    kinds = ["linear_attention", "mlp", "full_attention", "mlp"] * (sizes["layers"] // 4 + 1)
    return {"layers_block_type": kinds[:sizes["layers"]], "layer_norm_epsilon": 1e-5, "time_step_min": 0.001}


def bamba_config(sizes: dict) -> dict:
    """The spec's default schedule (attention every fourth layer, from the fourth) as attn_layer_indices."""
    return {"mamba_d_head": sizes["mamba_expand"] * sizes["d_model"] // sizes["mamba_n_heads"],
            "attn_layer_indices": [i for i in range(sizes["layers"]) if i % 4 == 3], "rms_norm_eps": 1e-5,
            **rope(10000.0, partial_rotary_factor=0.5)}


def rope(theta: float, **scaling) -> dict:
    return {"rope_parameters": {"rope_type": "default", "rope_theta": theta, **scaling}}


# DeepSeek's experts: a dense first layer, 8 experts in 4 groups of which a token's 2 best are searched.
DEEPSEEK_EXPERTS = {"first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 3,
                    "moe_intermediate_size": 12, "n_shared_experts": 1, "n_group": 4, "topk_group": 2,
                    "norm_topk_prob": True, "routed_scaling_factor": 2.5}
# DeepSeek-V2's: greedy softmax choices, weighted without renormalizing, scaled.
DEEPSEEK_V2_EXPERTS = {"first_k_dense_replace": 1, "n_routed_experts": 6, "num_experts_per_tok": 2,
                       "moe_intermediate_size": 12, "n_shared_experts": 2, "norm_topk_prob": False,
                       "routed_scaling_factor": 1.5}
BASE = {"vocab": 300, "d_model": 64, "layers": 3, "heads": 4, "kv_heads": 2, "d_ff": 96}
ODD = {"vocab": 200, "d_model": 48, "layers": 2, "heads": 6, "kv_heads": 3, "d_ff": 80}
WIDE = {"vocab": 500, "d_model": 96, "layers": 1, "heads": 2, "kv_heads": 1, "d_ff": 128}

FAMILIES = [
    Family("specs/modern/mistral.xspec", "MistralForCausalLM", "MistralConfig",
           [{**BASE, "sliding_window": 6, "head_dim": 24}, {**ODD, "sliding_window": 4},
            {**WIDE, "sliding_window": 9, "head_dim": 16}],
           lambda s: {"sliding_window": s["sliding_window"], "rms_norm_eps": 1e-6, **rope(10000.0)},
           plain_weights, window=6),
    Family("specs/modern/qwen2.xspec", "Qwen2ForCausalLM", "Qwen2Config",
           [{**BASE, "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},
            {**ODD, "use_sliding_window": False}, {**WIDE, "tie_word_embeddings": True}],
           lambda s: {"use_sliding_window": s.get("use_sliding_window", False),
                      "sliding_window": s.get("sliding_window", 8),
                      "max_window_layers": s.get("max_window_layers", 1), "rms_norm_eps": 1e-6,
                      "tie_word_embeddings": s.get("tie_word_embeddings", False), **rope(10000.0)},
           lambda state, s: (tied_weights if s.get("tie_word_embeddings") else plain_weights)(state, s),
           window=6),
    Family("specs/modern/qwen3.xspec", "Qwen3ForCausalLM", "Qwen3Config",
           [{**BASE, "head_dim": 24, "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},
            {**ODD, "head_dim": 16}, {**WIDE, "head_dim": 64}],
           lambda s: {"head_dim": s["head_dim"], "use_sliding_window": s.get("use_sliding_window", False),
                      "sliding_window": s.get("sliding_window", 8), "max_window_layers": s.get("max_window_layers", 1),
                      "rms_norm_eps": 1e-6, "attention_bias": False, **rope(1000000.0)},
           plain_weights, window=6),
    Family("specs/modern/gemma2.xspec", "Gemma2ForCausalLM", "Gemma2Config",
           [{**BASE, "head_dim": 24, "sliding_window": 6, "query_pre_attn_scalar": 20},
            {**ODD, "head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 8},
            {**WIDE, "head_dim": 48, "sliding_window": 5, "query_pre_attn_scalar": 48}],
           lambda s: {"head_dim": s["head_dim"], "sliding_window": s["sliding_window"],
                      "query_pre_attn_scalar": s["query_pre_attn_scalar"], "attn_logit_softcapping": 2.0,
                      "final_logit_softcapping": 3.0, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
                      **rope(10000.0)},
           tied_weights, window=6, overrides={"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0}),
    Family("specs/modern/gemma3.xspec", "Gemma3ForCausalLM", "Gemma3TextConfig",
           [{**BASE, "head_dim": 24, "sliding_window": 6, "query_pre_attn_scalar": 20, "sliding_window_pattern": 2},
            {**ODD, "heads": 4, "kv_heads": 2, "head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 8,
             "sliding_window_pattern": 6},
            {**WIDE, "head_dim": 48, "sliding_window": 5, "query_pre_attn_scalar": 48, "sliding_window_pattern": 3}],
           lambda s: {"head_dim": s["head_dim"], "sliding_window": s["sliding_window"],
                      "query_pre_attn_scalar": s["query_pre_attn_scalar"], "rms_norm_eps": 1e-6,
                      "sliding_window_pattern": s["sliding_window_pattern"], "hidden_activation": "gelu_pytorch_tanh",
                      "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
           tied_weights, window=6),
    Family("specs/modern/olmo2.xspec", "Olmo2ForCausalLM", "Olmo2Config", [BASE, ODD, WIDE],
           lambda s: {"rms_norm_eps": 1e-5, **rope(500000.0)},
           lambda state, s: renamed(state, COMMON)),
    Family("specs/modern/phi3.xspec", "Phi3ForCausalLM", "Phi3Config",
           [{**BASE, "partial_rotary_factor": 0.75}, {**ODD, "partial_rotary_factor": 0.5},
            {**WIDE, "partial_rotary_factor": 0.25}],
           lambda s: {"partial_rotary_factor": s["partial_rotary_factor"], "rms_norm_eps": 1e-5,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                          "partial_rotary_factor": s["partial_rotary_factor"]}},
           lambda state, s: renamed(state, COMMON)),
    Family("specs/modern/mixtral.xspec", "MixtralForCausalLM", "MixtralConfig",
           [{**BASE, "sliding_window": 6, "num_local_experts": 4, "num_experts_per_tok": 2},
            {**ODD, "sliding_window": 5, "num_local_experts": 3, "num_experts_per_tok": 1},
            {**WIDE, "sliding_window": 9, "num_local_experts": 8, "num_experts_per_tok": 3}],
           lambda s: {"sliding_window": s["sliding_window"], "num_local_experts": s["num_local_experts"],
                      "num_experts_per_tok": s["num_experts_per_tok"], "rms_norm_eps": 1e-6, **rope(10000.0)},
           plain_weights, window=6, experts=True),
    Family("specs/modern/qwen3_moe.xspec", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
           [{**BASE, "head_dim": 24, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 40,
             "decoder_sparse_step": 2, "norm_topk_prob": True},
            {**ODD, "head_dim": 16, "num_experts": 5, "num_experts_per_tok": 3, "moe_intermediate_size": 24,
             "decoder_sparse_step": 1, "norm_topk_prob": False},
            {**WIDE, "head_dim": 32, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 64,
             "decoder_sparse_step": 1, "norm_topk_prob": True}],
           lambda s: {"head_dim": s["head_dim"], "num_experts": s["num_experts"],
                      "num_experts_per_tok": s["num_experts_per_tok"],
                      "moe_intermediate_size": s["moe_intermediate_size"],
                      "decoder_sparse_step": s["decoder_sparse_step"], "norm_topk_prob": s["norm_topk_prob"],
                      "mlp_only_layers": [], "rms_norm_eps": 1e-6, "attention_bias": False, **rope(1000000.0)},
           plain_weights, experts=True),
    Family("specs/modern/gpt_oss.xspec", "GptOssForCausalLM", "GptOssConfig",
           [{**BASE, "head_dim": 16, "sliding_window": 6, "num_local_experts": 4, "num_experts_per_tok": 2,
             "original_max_position_embeddings": 8},
            {**ODD, "head_dim": 24, "sliding_window": 4, "num_local_experts": 3, "num_experts_per_tok": 2,
             "original_max_position_embeddings": 16},
            {**WIDE, "head_dim": 32, "sliding_window": 7, "num_local_experts": 6, "num_experts_per_tok": 4,
             "original_max_position_embeddings": 32}],
           lambda s: {"head_dim": s["head_dim"], "sliding_window": s["sliding_window"],
                      "num_local_experts": s["num_local_experts"], "num_experts_per_tok": s["num_experts_per_tok"],
                      "rms_norm_eps": 1e-5, "attention_bias": True,
                      "max_position_embeddings": 32 * s["original_max_position_embeddings"],
                      "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                          "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                          "original_max_position_embeddings": s["original_max_position_embeddings"]}},
           gpt_oss_weights, window=6, experts=True),
    Family("specs/modern/deepseek_v3.xspec", "DeepseekV3ForCausalLM", "DeepseekV3Config",
           [{**BASE, "kv_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 12,
             "qk_rope_head_dim": 8, "v_head_dim": 10, **DEEPSEEK_EXPERTS},
            {**ODD, "kv_heads": 6, "q_lora_rank": 0, "kv_lora_rank": 20, "qk_nope_head_dim": 8,
             "qk_rope_head_dim": 4, "v_head_dim": 12, **DEEPSEEK_EXPERTS, "n_routed_experts": 6, "n_group": 3,
             "topk_group": 2, "n_shared_experts": 2, "norm_topk_prob": False, "first_k_dense_replace": 0},
            {**WIDE, "kv_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 24, "qk_nope_head_dim": 16,
             "qk_rope_head_dim": 16, "v_head_dim": 16, **DEEPSEEK_EXPERTS, "n_group": 1, "topk_group": 1}],
           lambda s: {"q_lora_rank": s["q_lora_rank"] or None, "rope_interleave": deepseek_interleaved(s),
                      "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-6, **rope(10000.0)},
           deepseek_weights, experts=True, overrides={"mtp_depth": 0}),  # transformers runs no multi-token prediction
    Family("specs/modern/deepseek_v2.xspec", "DeepseekV2ForCausalLM", "DeepseekV2Config",
           [{**BASE, "kv_heads": 4, "q_lora_rank": 0, "kv_lora_rank": 16, "qk_nope_head_dim": 12,
             "qk_rope_head_dim": 8, "v_head_dim": 10, **DEEPSEEK_V2_EXPERTS},
            {**ODD, "kv_heads": 6, "q_lora_rank": 20, "kv_lora_rank": 20, "qk_nope_head_dim": 8,
             "qk_rope_head_dim": 4, "v_head_dim": 12, **DEEPSEEK_V2_EXPERTS, "first_k_dense_replace": 0},
            {**WIDE, "kv_heads": 2, "q_lora_rank": 0, "kv_lora_rank": 24, "qk_nope_head_dim": 16,
             "qk_rope_head_dim": 16, "v_head_dim": 16, **DEEPSEEK_V2_EXPERTS, "n_shared_experts": 1}],
           lambda s: {"q_lora_rank": s["q_lora_rank"] or None, "topk_method": "greedy", "rms_norm_eps": 1e-6,
                      **rope(10000.0)},
           lambda state, s: deepseek_weights(state, {**s, "q_lora_rank": 1}), experts=True),  # pairs, always
    Family("specs/modern/glm4_moe.xspec", "Glm4MoeForCausalLM", "Glm4MoeConfig",
           [{**BASE, "head_dim": 24, "partial_rotary_factor": 0.5, "use_qk_norm": True, **DEEPSEEK_EXPERTS,
             "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.0},
            {**ODD, "head_dim": 16, "partial_rotary_factor": 0.25, "use_qk_norm": False, **DEEPSEEK_EXPERTS,
             "n_group": 1, "topk_group": 1},
            {**WIDE, "head_dim": 32, "partial_rotary_factor": 1.0, "use_qk_norm": False, **DEEPSEEK_EXPERTS,
             "n_group": 1, "topk_group": 1, "first_k_dense_replace": 0}],
           lambda s: {"attention_bias": True, "rms_norm_eps": 1e-5,
                      **rope(10000.0, partial_rotary_factor=s["partial_rotary_factor"])},
           plain_weights, experts=True, overrides={"attention_bias": True, "mtp_depth": 0}),
    Family("specs/modern/bamba.xspec", "BambaForCausalLM", "BambaConfig",
           [{**BASE, "layers": 5, "mamba_n_heads": 4, "mamba_expand": 2, "mamba_n_groups": 2, "mamba_d_state": 12,
             "mamba_d_conv": 3, "mamba_chunk_size": 8},
            {**ODD, "mamba_n_heads": 6, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_d_state": 8,
             "mamba_d_conv": 4, "mamba_chunk_size": 16},
            {**WIDE, "mamba_n_heads": 3, "mamba_expand": 1, "mamba_n_groups": 3, "mamba_d_state": 16,
             "mamba_d_conv": 2, "mamba_chunk_size": 32}],
           bamba_config, lambda state, s: renamed(state, COMMON)),
    Family("specs/modern/qwen3_next.xspec", "Qwen3NextForCausalLM", "Qwen3NextConfig",
           [{**BASE, "layers": 4, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
             "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40, "linear_num_key_heads": 2,
             "linear_num_value_heads": 6, "linear_key_head_dim": 12, "linear_value_head_dim": 10,
             "linear_conv_kernel_dim": 3},
            {**ODD, "head_dim": 8, "num_experts": 3, "num_experts_per_tok": 1, "moe_intermediate_size": 16,
             "shared_expert_intermediate_size": 24, "linear_num_key_heads": 3, "linear_num_value_heads": 3,
             "linear_key_head_dim": 8, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4},
            {**WIDE, "head_dim": 32, "num_experts": 2, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
             "shared_expert_intermediate_size": 32, "linear_num_key_heads": 1, "linear_num_value_heads": 2,
             "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 2}],
           qwen3_next_config, plain_weights, experts=True, chunk=64),  # Gated DeltaNet's chunks
    Family("specs/modern/nemotron_h.xspec", "NemotronHForCausalLM", "NemotronHConfig",
           [{**BASE, "layers": 5, "head_dim": 24, "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 2,
             "ssm_state_size": 12, "conv_kernel": 3, "chunk_size": 8},
            {**ODD, "layers": 4, "head_dim": 8, "mamba_num_heads": 6, "mamba_head_dim": 8, "n_groups": 3,
             "ssm_state_size": 8, "conv_kernel": 4, "chunk_size": 16},
            {**WIDE, "head_dim": 48, "mamba_num_heads": 2, "mamba_head_dim": 32, "n_groups": 1,
             "ssm_state_size": 16, "conv_kernel": 2, "chunk_size": 32}],
           nemotron_h_config, lambda state, s: renamed(state, COMMON)),
    Family("specs/modern/llama3.xspec", "LlamaForCausalLM", "LlamaConfig",
           [{**BASE, "original_max_position_embeddings": 8, "attention_bias": True, "mlp_bias": True},
            {**ODD, "original_max_position_embeddings": 16},
            {**WIDE, "original_max_position_embeddings": 4}],
           lambda s: {"rms_norm_eps": 1e-6, "rope_parameters": {
               "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": s["original_max_position_embeddings"]}},
           plain_weights),
]
BY_NAME = {family.name: family for family in FAMILIES}
