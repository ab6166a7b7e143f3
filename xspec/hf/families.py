"""Each family's config.json, attribute by attribute, as the shipped spec's parameters (specs/modern/).

`map_config(config)` picks the family by model_type alone and returns the spec to extend, the `set`
lines (each with the config key it came from), what the weights look like, and what verification must
cover (the window, the positions past which rotary scaling acts). Every attribute of config.json is
taken here, set aside in `NOT_ARCHITECTURAL` or below with its reason, or refused by name."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from xspec.base.errors import UserError
from xspec.compiler.limits import MAX_REPEAT
from xspec.hf.config_reader import ConfigReader, Setting, refuse, render
from xspec.hf.rope import read_gemma3_rope, read_rope

ZERO = [0, 0.0]


@dataclass
class Mapped:
    spec: str                       # the shipped spec extended, e.g. "llama3" (specs/modern/llama3.xspec)
    model_type: str
    hf_class: str                   # transformers' class for this model_type (verification and export)
    layout: str                     # the weight rules that pack its tensors ("plain": none; weight_map.py)
    settings: list[Setting]
    notes: dict[str, str]           # attributes that change nothing, and why
    max_positions: int
    window: int | None = None       # the smallest sliding window, if any
    scaled_from: int | None = None  # original_max_position_embeddings of a rotary scaling
    tied: bool = False
    config: dict = field(default_factory=dict)

    @property
    def params(self) -> dict:
        return {s.param: s.value for s in self.settings}


def _common(cfg: ConfigReader, *, tie_default: bool, activation: str = "silu", eps: float = 1e-6,
            kv_heads: int | None = None) -> None:
    """What every family's config class reads alike; where config.json lacks them, `eps` is its
    rms_norm_eps and `kv_heads` its num_key_value_heads (None: one per attention head, as for null)."""
    cfg.map("vocab_size", "vocab")
    cfg.map("hidden_size", "d_model")
    cfg.map("num_hidden_layers", "layers", most=MAX_REPEAT)     # the layer-kind lists below have one per layer
    _kv_heads(cfg, cfg.map("num_attention_heads", "heads"), kv_heads)
    cfg.map("intermediate_size", "d_ff")
    cfg.map("rms_norm_eps", "rms_norm_eps", eps, integer=False, least=0)
    cfg.put("tie_word_embeddings", cfg.flag("tie_word_embeddings", tie_default), "tie_word_embeddings")
    for key in ("attention_dropout", "resid_pdrop", "embd_pdrop", "hidden_dropout"):
        cfg.expect(key, ZERO, 0.0, " (dropout is left out of imported models)")
    act_keys = [k for k in ("hidden_act", "hidden_activation") if cfg.has(k)] or ["hidden_act"]
    for key in act_keys:
        cfg.expect(key, [activation], activation)


def _kv_heads(cfg: ConfigReader, heads: int, default: int | None) -> None:
    """num_key_value_heads: absent, the config class's `default` (None: one per attention head); null, one
    per attention head."""
    if cfg.get("num_key_value_heads", None) is not None:
        cfg.map("num_key_value_heads", "kv_heads")
    elif cfg.has("num_key_value_heads") or default is None:
        cfg.put("kv_heads", heads, "num_key_value_heads" if cfg.has("num_key_value_heads") else
                "num_key_value_heads (default: num_attention_heads)")
    else:
        cfg.put("kv_heads", default, "num_key_value_heads (default)")


def _head_dim(cfg: ConfigReader, param: str | None, default: int | None = None) -> int:
    """head_dim given separately: absent, the config class's `default` (hidden_size / num_attention_heads
    where it has none); null, hidden_size / num_attention_heads. `param`: the spec's own head_dim parameter,
    or None where the spec has d_k and d_v."""
    derived = cfg.config["hidden_size"] // cfg.config["num_attention_heads"]
    value = cfg.get("head_dim", None)
    value = (default or derived) if not cfg.has("head_dim") else derived if value is None else cfg.number("head_dim")
    source = "head_dim" if cfg.has("head_dim") else "head_dim (default)"
    if param is not None:
        cfg.put(param, value, source)
    elif value != cfg.config["hidden_size"] // cfg.config["num_attention_heads"]:
        cfg.put("d_k", value, source)
        cfg.put("d_v", value, source)
    return value


def _bias(cfg: ConfigReader, key: str) -> None:
    cfg.put(key, cfg.flag(key, False), key)


LAYER_KINDS = ("sliding_attention", "full_attention")
# Layer kinds under their older names, which transformers reads as today's (remap_legacy_layer_types).
LEGACY_KINDS = {"mamba": "linear_attention", "attention": "full_attention"}


def _kinds(cfg: ConfigReader, key: str, allowed: tuple[str, ...], count: int) -> list[str] | None:
    """A list of one kind per layer (layer_types, layers_block_type), when given: `count` kinds, each one of
    `allowed` once older names are read as transformers reads them."""
    given = cfg.get(key, None)
    if given is None:
        return None
    if not isinstance(given, list) or len(given) != count:
        raise UserError(f"{cfg.file}: {key} is not a list of {count} layer kinds (num_hidden_layers)")
    kinds = [LEGACY_KINDS.get(kind, kind) if isinstance(kind, str) else kind for kind in given]
    for i, kind in enumerate(kinds):
        if kind not in allowed:
            refuse(f"{key}[{i}] {render(given[i])}", list(allowed), cfg.file)
    return kinds


def _layer_types(cfg: ConfigReader) -> None:
    """layer_types, when given: each layer's kind, which the spec's layers read by their index."""
    kinds = _kinds(cfg, "layer_types", LAYER_KINDS, cfg.config["num_hidden_layers"])
    if kinds is not None:
        cfg.put("layer_types", kinds, "layer_types")


def _unread_layer_types(cfg: ConfigReader, why: str) -> None:
    """layer_types where the family's attention does not read it (transformers checks it all the same)."""
    if _kinds(cfg, "layer_types", LAYER_KINDS, cfg.config["num_hidden_layers"]) is not None:
        cfg.notes["layer_types"] = why


def _window(cfg: ConfigReader, default: int) -> int:
    return cfg.map("sliding_window", "sliding_window", default)


def _no_window(cfg: ConfigReader) -> None:
    value = cfg.get("sliding_window", None)
    if value is not None:
        raise UserError(f"{cfg.file}: sliding_window {render(value)} is not supported for model_type "
                        f"{render(cfg.config['model_type'])} (supported: null)")


def _llama(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False)
    _head_dim(cfg, None)
    _bias(cfg, "attention_bias")
    _bias(cfg, "mlp_bias")
    _no_window(cfg)
    rope = read_rope(cfg, ("default", "linear", "llama3", "yarn"))
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))
    if rope["rope_type"] == "default":
        cfg.ignore("original_max_position_embeddings", "the context before a rotary scaling; none is declared")
        return
    m.spec = "llama3"        # the spec whose layers scale the rotary frequencies
    cfg.put("rope_type", rope["rope_type"], rope.source("rope_type"))
    cfg.put("rope_factor", float(rope["factor"]), rope.source("factor"))
    if rope["rope_type"] == "linear":
        cfg.ignore("original_max_position_embeddings", "linear scaling divides every frequency alike: the "
                                                       "original context changes nothing")
        return
    cfg.put("original_max_position_embeddings", rope["original_max_position_embeddings"],
            rope.source("original_max_position_embeddings"))
    m.scaled_from = rope["original_max_position_embeddings"]
    if rope["rope_type"] == "llama3":
        for name in ("low_freq_factor", "high_freq_factor"):
            if name not in rope:
                raise UserError(f"{cfg.file}: {rope.where} has rope_type \"llama3\" but no {name}")
            cfg.put(name, float(rope[name]), rope.source(name))
        return
    for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        cfg.put(name, float(rope.get(name, default)), rope.source(name) if name in rope else f"{name} (default)")
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        raise UserError(f"{cfg.file}: {rope.where}.truncate {render(truncate)} is not true or false")
    cfg.put("rope_truncate", truncate, rope.source("truncate") if "truncate" in rope else "truncate (default)")


def _mistral(cfg: ConfigReader, m: Mapped, *, window: int | None = 4096, theta: float = 10000.0,
             eps: float = 1e-6) -> None:
    """Mistral's layers, each attending within sliding_window (`window` where config.json has none; null:
    no window). Its config class keeps a layer_types list it is given, but its attention does not read it."""
    _common(cfg, tie_default=False, eps=eps, kv_heads=8)
    _head_dim(cfg, "head_dim")
    _default_rope(cfg, theta)
    if cfg.get("sliding_window", window) is None:   # no window: one as long as the positions the model takes
        cfg.put("sliding_window", m.max_positions, "sliding_window null: max_position_embeddings")
    else:
        m.window = _window(cfg, window or 0)
    _unread_layer_types(cfg, "transformers applies sliding_window to every layer; layer_types shapes only its cache")


def _mixtral(cfg: ConfigReader, m: Mapped) -> None:
    _mistral(cfg, m, window=None, theta=1000000.0, eps=1e-5)
    cfg.map(cfg.spelling("num_experts", "num_local_experts"), "num_local_experts", 8)
    cfg.map("num_experts_per_tok", "num_experts_per_tok", 2)
    cfg.map("router_aux_loss_coef", "router_aux_loss_coef", 0.001, integer=False, least=0)
    cfg.expect("router_jitter_noise", ZERO, 0.0, " (jitter noise on the router is not in the spec)")


def _default_rope(cfg: ConfigReader, theta: float = 10000.0) -> None:
    rope = read_rope(cfg, ("default",), default_theta=theta)
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))


def _qwen2_windows(cfg: ConfigReader, m: Mapped, *, every_layer: bool = False) -> None:
    """Qwen2's windows, as its config class reads them: with use_sliding_window and a sliding_window, the
    layers layer_types marks sliding_attention slide, and without the list those from max_window_layers on
    (transformers' reading of the attribute, which its docstring describes the other way round:
    transformers #35896). `every_layer`: Qwen3-MoE, whose attention slides in every layer then and reads
    neither max_window_layers nor layer_types."""
    used = cfg.flag("use_sliding_window", False)
    window = cfg.get("sliding_window", 4096)
    if window is not None:       # read by transformers only with use_sliding_window, but checked as it checks it
        window = cfg.number("sliding_window", 4096)
    slides = used and window is not None
    layers = cfg.config["num_hidden_layers"]
    cfg.put("use_sliding_window", slides, "use_sliding_window, sliding_window")
    if slides:
        m.window = _window(cfg, 4096)
    first = cfg.number("max_window_layers", 28, least=0, null=True)
    if every_layer:
        cfg.ignore("max_window_layers", "transformers' Qwen3-MoE slides in every layer when use_sliding_window")
        _unread_layer_types(cfg, "transformers' Qwen3-MoE slides in every layer when use_sliding_window; "
                                 "layer_types shapes only its cache")
        return
    cfg.put("max_window_layers", first, "max_window_layers")
    kinds = _kinds(cfg, "layer_types", LAYER_KINDS, layers)
    if kinds is None:
        return
    if "sliding_attention" in kinds and not slides:
        i = kinds.index("sliding_attention")
        raise UserError(f"{cfg.file}: layer_types[{i}] is \"sliding_attention\" but "
                        f"{'use_sliding_window is false' if not used else 'sliding_window is null'}: "
                        "transformers has no window to slide it by")
    cfg.put("layer_types", kinds, "layer_types")
    if "sliding_attention" not in kinds:
        m.window = None


def _qwen2(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False, kv_heads=32)
    _head_dim(cfg, None)                  # not a field of Qwen2Config, but its attention reads one given
    _default_rope(cfg)
    _qwen2_windows(cfg, m)
    # The q, k, v biases are part of Qwen2 (transformers has no attribute for them).
    cfg.expect("attention_bias", [True], True, " (Qwen2 has q, k, v biases)")


def _qwen3(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False, kv_heads=32)
    _head_dim(cfg, "head_dim", default=128)
    _bias(cfg, "attention_bias")
    _default_rope(cfg)
    _qwen2_windows(cfg, m)


def _qwen3_moe(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False, kv_heads=4)
    _head_dim(cfg, "head_dim")            # not a field of Qwen3MoeConfig: hidden_size / heads unless given
    _bias(cfg, "attention_bias")
    _default_rope(cfg)
    _qwen2_windows(cfg, m, every_layer=True)
    cfg.map(cfg.spelling("num_local_experts", "num_experts"), "num_experts", 128)
    _qwen_experts(cfg, normalized=False, per_token=8, width=768)


def _qwen_experts(cfg: ConfigReader, *, normalized: bool, per_token: int, width: int) -> None:
    """Qwen3-MoE's and Qwen3-Next's experts beyond their count: each token's, their width, the layers that
    have them, the renormalization and the balance loss (defaults: the config class's)."""
    cfg.map("num_experts_per_tok", "num_experts_per_tok", per_token)
    cfg.map("moe_intermediate_size", "moe_intermediate_size", width)
    step = cfg.map("decoder_sparse_step", "decoder_sparse_step", 1)
    cfg.put("norm_topk_prob", cfg.flag("norm_topk_prob", normalized), "norm_topk_prob")
    cfg.map("router_aux_loss_coef", "router_aux_loss_coef", 0.001, integer=False, least=0)
    _sparse_layers(cfg, step)


def _sparse_layers(cfg: ConfigReader, step: int) -> None:
    """Which layers have experts: those decoder_sparse_step picks, less mlp_only_layers (null: none), as
    transformers decides; the spec's layers read it by their index (sparse_layers) where the list changes it."""
    layers = cfg.config["num_hidden_layers"]
    dense = cfg.get("mlp_only_layers", None)
    dense = [] if dense is None else dense
    if not isinstance(dense, list) or not all(type(i) is int and 0 <= i < layers for i in dense):
        raise UserError(f"{cfg.file}: mlp_only_layers {render(dense)} is not a list of layer indices from 0 to "
                        f"{layers - 1}")
    if dense:
        cfg.put("sparse_layers", [i not in dense and (i + 1) % step == 0 for i in range(layers)],
                "mlp_only_layers, decoder_sparse_step")


def _gemma_common(cfg: ConfigReader, m: Mapped, *, final_softcap: float | None) -> None:
    """Gemma's layers; `final_softcap`: final_logit_softcapping where config.json has none (null: none)."""
    _common(cfg, tie_default=True, activation="gelu_pytorch_tanh", kv_heads=4)
    _head_dim(cfg, "head_dim", default=256)
    _bias(cfg, "attention_bias")
    cfg.map("query_pre_attn_scalar", "query_pre_attn_scalar", 256, integer=False)
    m.window = _window(cfg, 4096)
    cfg.expect("use_bidirectional_attention", [None, False], None, " (the spec's attention is causal)")
    final = cfg.get("final_logit_softcapping", final_softcap)
    cfg.put("final_logit_softcapping",
            0.0 if final is None else cfg.number("final_logit_softcapping", final_softcap, integer=False, least=1e-9),
            "final_logit_softcapping" if cfg.has("final_logit_softcapping") else "final_logit_softcapping (default)")


def _gemma2(cfg: ConfigReader, m: Mapped) -> None:
    _gemma_common(cfg, m, final_softcap=30.0)
    cfg.map("attn_logit_softcapping", "attn_logit_softcapping", 50.0, integer=False, least=1e-9)
    _default_rope(cfg)
    _layer_types(cfg)
    cfg.ignore("sliding_window_pattern", "transformers' Gemma 2 alternates sliding and full layers whatever it says")


def _gemma3(cfg: ConfigReader, m: Mapped) -> None:
    _gemma_common(cfg, m, final_softcap=None)
    cfg.expect("attn_logit_softcapping", [None], None, " (Gemma 3 uses QK-norm)")
    pattern = cfg.number("sliding_window_pattern", 6)
    cfg.put("sliding_window_pattern", pattern, "sliding_window_pattern" if cfg.has("sliding_window_pattern") else
            "sliding_window_pattern (default)")
    cfg.ignore("_sliding_window_pattern", "transformers derives the layers from sliding_window_pattern (6 where "
                                          "absent) and layer_types, not from this")
    _layer_types(cfg)
    local = read_gemma3_rope(cfg, "sliding_attention", ("default",))
    cfg.put("rope_local_base_freq", local["rope_theta"], local.source("rope_theta"))
    rope = read_gemma3_rope(cfg, "full_attention", ("default", "linear"))
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))
    cfg.put("rope_scaling_factor", float(rope.get("factor", 1.0)),
            rope.source("factor") if "factor" in rope else f"{rope.where}.rope_type \"default\": factor 1")


def _olmo2(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False, eps=1e-5)
    _head_dim(cfg, None)
    _bias(cfg, "attention_bias")
    _default_rope(cfg)
    cfg.ignore("clip_qkv", "OLMo 1 clipped q, k and v; transformers' OLMo 2 does not read it")


def _phi3(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False, eps=1e-5)
    _head_dim(cfg, None)
    _bias(cfg, "attention_bias")
    _no_window(cfg)
    _partial_rotary(cfg, default=1.0)
    cfg.ignore("original_max_position_embeddings", "the context before long-rope scaling; rope_type default has none")


def _unquantized(cfg: ConfigReader) -> None:
    """Weights as plain tensors: a quantization_config (gpt-oss's MXFP4, DeepSeek-V3's FP8) is refused."""
    if cfg.has("quantization_config"):
        quantization = cfg.config["quantization_config"]
        method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
        raise UserError(f"{cfg.file}: quantization_config ({render(method)}) "
                        "is not supported (supported: unquantized weights; dequantize with transformers first)")


def _partial_rotary(cfg: ConfigReader, default: float, top_level: bool = True) -> None:
    """Default rotary positions on the first partial_rotary_factor of each head: inside the rotary settings,
    else at the top level (`top_level`: where the config class reads it there), else the class's default."""
    rope = read_rope(cfg, ("default",), top_level_partial=top_level)
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))
    factor = rope.get("partial_rotary_factor", default)
    source = rope.source("partial_rotary_factor") if "partial_rotary_factor" in rope else \
        "partial_rotary_factor (default)"
    cfg.put("partial_rotary_factor", float(factor), source)


# gpt-oss's rotary settings where config.json gives none (its config class's).
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def _gpt_oss(cfg: ConfigReader, m: Mapped) -> None:
    _unquantized(cfg)
    _common(cfg, tie_default=False, eps=1e-5, kv_heads=8)
    _head_dim(cfg, "head_dim", default=64)
    cfg.expect("attention_bias", [True], True, " (gpt-oss has biases on every attention projection)")
    m.window = _window(cfg, 128)
    cfg.map(cfg.spelling("num_experts", "num_local_experts"), "num_local_experts", 128)
    cfg.map("num_experts_per_tok", "num_experts_per_tok", 4)
    cfg.ignore("experts_per_token", "another spelling of num_experts_per_tok, which transformers reads instead")
    cfg.map("swiglu_limit", "swiglu_limit", 7.0, integer=False, least=1e-9)
    cfg.map("swiglu_alpha", "swiglu_alpha", 1.702, integer=False, least=1e-9)
    cfg.map("router_aux_loss_coef", "router_aux_loss_coef", 0.001, integer=False, least=0)
    cfg.ignore("initial_context_length", "the context of pretraining; YaRN's original_max_position_embeddings is used")
    given = cfg.config.get("rope_scaling") is not None or cfg.config.get("rope_parameters") is not None
    rope = read_rope(cfg, ("yarn",), default_theta=150000.0, default=None if given else GPT_OSS_ROPE)
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))
    truncate = rope.get("truncate", True)
    if truncate is not False:
        raise UserError(f"{cfg.file}: {rope.where}.truncate {render(truncate)} is not supported (supported: false)")
    for param, key in (("rope_scaling_factor", "factor"), ("original_max_position_embeddings",
                                                           "original_max_position_embeddings"),
                       ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow")):
        cfg.put(param, rope.get(key, {"beta_fast": 32.0, "beta_slow": 1.0}.get(key)), rope.source(key))
    m.scaled_from = rope["original_max_position_embeddings"]
    _layer_types(cfg)


def _yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's magnitude correction, as transformers computes it: 0.1 mscale ln(factor) + 1 (1 unscaled)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _multi_token_prediction(cfg: ConfigReader, default: int) -> None:
    """DeepSeek-V3's multi-token prediction modules (§2.2), which transformers neither runs nor loads: xspec
    keeps them (the importer drops them, saying so, where the checkpoint lacks their weights). `default`:
    the config class's count where config.json gives none."""
    key = cfg.spelling("num_nextn_predict_layers", "num_mtp_layers")
    cfg.put("mtp_depth", cfg.number(key, default, least=0, most=MAX_REPEAT),
            key if cfg.has(key) else f"{key} (default)")


def _deepseek_v3(cfg: ConfigReader, m: Mapped) -> None:
    _deepseek_attention(cfg, m, interleaved=cfg.flag("rope_interleave", True), kv_default=128)
    _multi_token_prediction(cfg, 1)
    experts = _deepseek_experts(cfg, "num_local_experts", first_dense=3, experts=256, per_token=8, width=2048,
                                shared=1, scale=2.5)
    _expert_groups(cfg, experts, groups=8, top_groups=4)
    cfg.put("norm_topk_prob", cfg.flag("norm_topk_prob", True), "norm_topk_prob")
    # Keys DeepSeek's own config.json carries beside transformers' ones, which transformers does not read.
    cfg.ignore("topk_method", "transformers' DeepSeek-V3 always chooses within groups with the correction bias "
                              "(noaux_tc)")
    cfg.ignore("scoring_func", "transformers' DeepSeek-V3 always scores experts by sigmoid")


def _deepseek_v2(cfg: ConfigReader, m: Mapped) -> None:
    _deepseek_attention(cfg, m, interleaved=True)   # DeepSeek-V2 turns pairs (x0, x1) as complex numbers
    cfg.ignore("num_nextn_predict_layers", "multi-token prediction modules, which DeepSeek-V2 does not have and "
                                           "transformers does not run either; xspec imports the model without them")
    _deepseek_experts(cfg, "num_experts", first_dense=0, experts=64, per_token=None, width=1407, shared=2, scale=1.0)
    cfg.expect("topk_method", ["greedy"], "greedy", " (group_limited_greedy is not supported yet)")
    for key in ("n_group", "topk_group"):
        cfg.ignore(key, "the groups of group_limited_greedy; greedy routing has none")
    cfg.expect("norm_topk_prob", [False], False, " (transformers' DeepseekV2 weighs the chosen experts by their "
                                                 "softmax scores without renormalizing them)")
    cfg.ignore("scoring_func", "transformers' DeepSeek-V2 always scores experts by softmax")
    cfg.expect("mlp_bias", [False], False, " (DeepSeek's checkpoints have no feed-forward biases)")


def _glm4_moe(cfg: ConfigReader, m: Mapped) -> None:
    """GLM-4.5: grouped-query attention with partial rotary positions and optional QK-norm, DeepSeek-V3's
    experts."""
    _unquantized(cfg)
    _common(cfg, tie_default=False, eps=1e-5, kv_heads=8)
    _head_dim(cfg, "head_dim")
    _bias(cfg, "attention_bias")
    cfg.put("use_qk_norm", cfg.flag("use_qk_norm", False), "use_qk_norm")
    _partial_rotary(cfg, default=0.5)
    _multi_token_prediction(cfg, 1)
    experts = _deepseek_experts(cfg, "num_local_experts", first_dense=1, experts=128, per_token=8, width=1408,
                                shared=1, scale=1.0)
    _expert_groups(cfg, experts, groups=1, top_groups=1)
    cfg.put("norm_topk_prob", cfg.flag("norm_topk_prob", True), "norm_topk_prob")


def _bamba(cfg: ConfigReader, m: Mapped) -> None:
    """Bamba: LLaMA's layers whose mixer is Mamba-2's state space, or at attn_layer_indices grouped-query
    attention with rotary positions on half of each head (transformers fixes the half)."""
    _common(cfg, tie_default=False, eps=1e-5, kv_heads=8)
    _head_dim(cfg, None)
    for key in ("attention_bias", "mlp_bias"):
        _bias(cfg, key)
    layers = cfg.config["num_hidden_layers"]
    indices = cfg.get("attn_layer_indices", None)
    indices = [] if indices is None else indices
    if not isinstance(indices, list) or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in indices):
        raise UserError(f"{cfg.file}: attn_layer_indices is not a list of layer numbers")
    if any(i >= layers for i in indices):
        cfg.notes["attn_layer_indices"] = f"numbers from num_hidden_layers ({layers}) on name no layer; transformers " \
                                          "drops them"
    cfg.put("layer_types", ["full_attention" if i in indices else "linear_attention" for i in range(layers)],
            "attn_layer_indices")
    _partial_rotary(cfg, default=0.5, top_level=False)
    cfg.ignore("partial_rotary_factor", "transformers' Bamba sets 0.5 over it (only rope_parameters may say otherwise)")
    cfg.ignore("attn_rotary_emb", "the rotary width of Bamba's original code; transformers turns half of each head")
    heads = cfg.map("mamba_n_heads", "mamba_n_heads", 128)
    expand = cfg.map("mamba_expand", "mamba_expand", 2)
    width = expand * cfg.config["hidden_size"]
    if width % heads:
        raise UserError(f"{cfg.file}: mamba_n_heads {heads} does not divide mamba_expand * hidden_size ({width})")
    cfg.expect("mamba_d_head", ["auto", width // heads], "auto", " (mamba_expand * hidden_size / mamba_n_heads)")
    groups = cfg.map("mamba_n_groups", "mamba_n_groups", 1)
    if heads % groups:
        raise UserError(f"{cfg.file}: mamba_n_groups {groups} does not divide mamba_n_heads {heads}")
    for key, default in (("mamba_d_state", 256), ("mamba_d_conv", 4), ("mamba_chunk_size", 256)):
        cfg.map(key, key, default)
    cfg.put("mamba_conv_bias", cfg.flag("mamba_conv_bias", True), "mamba_conv_bias")
    cfg.put("mamba_proj_bias", cfg.flag("mamba_proj_bias", False), "mamba_proj_bias")
    limit = cfg.get("time_step_limit", [0.0, INFINITY])
    if not (isinstance(limit, list) and len(limit) == 2 and isinstance(limit[0], (int, float))
            and not isinstance(limit[0], bool) and limit[0] >= 0 and limit[1] in (INFINITY, float("inf"))):
        raise UserError(f"{cfg.file}: time_step_limit {render(limit)} is not supported (supported: [min, "
                        "Infinity], dt bounded below only)")
    cfg.put("time_step_min", float(limit[0]), "time_step_limit")
    for key in ("time_step_min", "time_step_max", "time_step_floor"):
        cfg.ignore(key, "how dt_bias is initialised for training from scratch; an import starts from the weights")
    cfg.ignore("z_loss_coefficient", "a training loss on the logits; fine-tuning with xspec adds none")
    cfg.ignore("num_logits_to_keep", "how many positions' logits transformers' forward returns")


def _qwen3_next(cfg: ConfigReader, m: Mapped) -> None:
    """Qwen3-Next: by layer_types, Gated DeltaNet (the linear_* sizes) or gated full attention with
    QK-norm and partial rotary positions; Qwen3-MoE's experts with a gated shared expert."""
    _common(cfg, tie_default=False, kv_heads=2)
    _head_dim(cfg, "head_dim", default=256)
    _bias(cfg, "attention_bias")
    _partial_rotary(cfg, default=0.25)
    layers = cfg.config["num_hidden_layers"]
    interval = cfg.number("full_attention_interval", 4)
    kinds = _kinds(cfg, "layer_types", ("linear_attention", "full_attention"), layers)
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
    _qwen_experts(cfg, normalized=True, per_token=10, width=512)


# Nemotron-H's block kinds as hybrid_override_pattern spells them, one character a block, and those the
# spec has (no mixture of experts yet).
PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
NEMOTRON_H_BLOCKS = ("linear_attention", "full_attention", "mlp")
# Keys of NVIDIA's own config.json that transformers reads under Nemotron-H's names (the older first).
NEMOTRON_H_SPELLINGS = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "expand": "mamba_expand",
                        "time_step_min": "mamba_dt_min", "time_step_max": "mamba_dt_max",
                        "time_step_limit": "mamba_dt_limit", "time_step_floor": "mamba_dt_init_floor",
                        "use_conv_bias": "mamba_conv_bias", "chunk_size": "mamba_chunk_size"}


def _nemotron_h_blocks(cfg: ConfigReader) -> list[str]:
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


def _nemotron_h(cfg: ConfigReader, m: Mapped) -> None:
    """Nemotron-H: single-mixer blocks, by layers_block_type Mamba-2, attention without positions or a
    squared-ReLU feed-forward (mixture-of-experts blocks are refused)."""
    kinds = _nemotron_h_blocks(cfg)
    cfg.put("layers", len(kinds), "layers_block_type")
    layers = cfg.get("num_hidden_layers", None)
    if layers is not None and layers != len(kinds):
        cfg.notes["num_hidden_layers"] = f"transformers counts the blocks ({len(kinds)}) in its place"
    cfg.map("vocab_size", "vocab")
    cfg.map("hidden_size", "d_model")
    _kv_heads(cfg, cfg.map("num_attention_heads", "heads"), 8)
    cfg.map("head_dim", "head_dim", 128)
    cfg.map("intermediate_size", "d_ff")
    cfg.map("layer_norm_epsilon", "rms_norm_eps", 1e-5, integer=False, least=0)
    cfg.put("tie_word_embeddings", cfg.flag("tie_word_embeddings", False), "tie_word_embeddings")
    for key in ("attention_bias", "mlp_bias", "mamba_proj_bias"):
        _bias(cfg, key)
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


# transformers 5 writes an infinite float in config.json as this object (JSON has no Infinity).
INFINITY = {"__float__": "Infinity"}


def _expert_groups(cfg: ConfigReader, experts: int, *, groups: int, top_groups: int) -> None:
    """n_group and topk_group of DeepSeek-V3's routing over `experts` (defaults: the transformers config
    class's)."""
    count = cfg.map("n_group", "n_group", groups, most=experts)
    cfg.map("topk_group", "topk_group", top_groups, most=count)
    if experts % count or experts // count < 2:
        raise UserError(f"{cfg.file}: n_group {count} does not split n_routed_experts {experts} into groups of "
                        "two or more experts, which DeepSeek-V3's routing scores by their two best")


def _deepseek_attention(cfg: ConfigReader, m: Mapped, interleaved: bool, kv_default: int | None = None) -> None:
    """DeepSeek's layers but their experts: multi-head latent attention, YaRN with its mscale, the norms.
    `kv_default`: num_key_value_heads where config.json has none (None: num_attention_heads)."""
    _unquantized(cfg)
    _common(cfg, tie_default=False)
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
    _bias(cfg, "attention_bias")
    # Interleaved rotary features ((x0, x1), (x2, x3), ...) are the plain layout's rows reordered: import
    # reorders them (weight_map.py), so the spec turns halves as every family does.
    m.layout = "deepseek_interleaved" if interleaved else "deepseek"
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
        attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        source = f"{rope.where}.mscale / mscale_all_dim"
    else:
        attention_factor, source = _yarn_mscale(factor, 1.0), f"{rope.where}.factor (0.1 ln(factor) + 1)"
    cfg.put("rope_attention_factor", attention_factor, source)
    cfg.put("mscale_all_dim", mscale_all_dim, f"{rope.where}.mscale_all_dim" if mscale_all_dim else
            f"{rope.where}: no mscale_all_dim")


def _deepseek_experts(cfg: ConfigReader, alias: str, *, first_dense: int, experts: int, per_token: int | None,
                      width: int, shared: int, scale: float) -> int:
    """DeepSeek's routed experts after the first first_k_dense_replace layers, with shared experts beside
    them; their count. Absent keys take the transformers config class's defaults (given here), as
    transformers reads them; `alias`: the other spelling of n_routed_experts its class reads first."""
    cfg.map("first_k_dense_replace", "first_k_dense_replace", first_dense, least=0)
    count = cfg.map(cfg.spelling(alias, "n_routed_experts"), "n_routed_experts", experts)
    cfg.map("num_experts_per_tok", "num_experts_per_tok", *([] if per_token is None else [per_token]), most=count)
    cfg.map("moe_intermediate_size", "moe_intermediate_size", width)
    cfg.map("n_shared_experts", "n_shared_experts", shared)
    cfg.map("routed_scaling_factor", "routed_scaling_factor", scale, integer=False, least=1e-9)
    # DeepSeek's own config.json keys beside transformers' ones.
    cfg.ignore("moe_layer_freq", "transformers puts experts in every layer from first_k_dense_replace on")
    cfg.ignore("ep_size", "the expert-parallel degree of pretraining")
    cfg.ignore("aux_loss_alpha", "the weight of pretraining's balance loss (train.router_aux_loss_coef sets xspec's)")
    cfg.ignore("seq_aux", "whether pretraining's balance loss is sequence-wise")
    return count


@dataclass(frozen=True)
class Family:
    spec: str
    hf_class: str
    layout: str
    read: Callable[[ConfigReader, Mapped], None]
    positions: int          # max_position_embeddings where config.json has none (the config class's)


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", "LlamaForCausalLM", "plain", _llama, 2048),
    "mistral": Family("mistral", "MistralForCausalLM", "plain", _mistral, 131072),
    "qwen2": Family("qwen2", "Qwen2ForCausalLM", "plain", _qwen2, 32768),
    "qwen3": Family("qwen3", "Qwen3ForCausalLM", "plain", _qwen3, 32768),
    "gemma2": Family("gemma2", "Gemma2ForCausalLM", "plain", _gemma2, 8192),
    "gemma3_text": Family("gemma3", "Gemma3ForCausalLM", "plain", _gemma3, 131072),
    "olmo2": Family("olmo2", "Olmo2ForCausalLM", "plain", _olmo2, 2048),
    "phi3": Family("phi3", "Phi3ForCausalLM", "phi3", _phi3, 4096),
    "mixtral": Family("mixtral", "MixtralForCausalLM", "mixtral", _mixtral, 131072),
    "qwen3_moe": Family("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe", _qwen3_moe, 32768),
    "gpt_oss": Family("gpt_oss", "GptOssForCausalLM", "gpt_oss", _gpt_oss, 131072),
    "deepseek_v2": Family("deepseek_v2", "DeepseekV2ForCausalLM", "deepseek", _deepseek_v2, 2048),
    "deepseek_v3": Family("deepseek_v3", "DeepseekV3ForCausalLM", "deepseek", _deepseek_v3, 4096),
    "glm4_moe": Family("glm4_moe", "Glm4MoeForCausalLM", "deepseek", _glm4_moe, 131072),
    "bamba": Family("bamba", "BambaForCausalLM", "plain", _bamba, 262144),
    "qwen3_next": Family("qwen3_next", "Qwen3NextForCausalLM", "qwen3_next", _qwen3_next, 32768),
    "nemotron_h": Family("nemotron_h", "NemotronHForCausalLM", "nemotron_h", _nemotron_h, 4096),
}
REFUSED_TYPES = {
    "gemma3": "a Gemma 3 checkpoint with its vision tower; xspec imports the text model (model_type gemma3_text)",
}


def map_config(config: dict, file: str = "config.json") -> Mapped:
    model_type = config.get("model_type")
    if not isinstance(model_type, (str, type(None))):
        raise UserError(f"{file}: model_type {render(model_type)} is not a string")
    if model_type in REFUSED_TYPES:
        raise UserError(f"{file}: model_type {render(model_type)} is not supported: {REFUSED_TYPES[model_type]}")
    if model_type not in FAMILIES:
        what = "no model_type" if model_type is None else f"model_type {render(model_type)}"
        refuse(what, list(FAMILIES), file)
    if config.get("auto_map") is not None:
        raise UserError(f"{file}: auto_map names remote code; xspec runs none (supported: transformers' own "
                        f"{FAMILIES[model_type].hf_class})")
    family = FAMILIES[model_type]
    cfg = ConfigReader(config, file)
    cfg.get("model_type")
    mapped = Mapped(family.spec, model_type, family.hf_class, family.layout, cfg.settings, cfg.notes,
                    cfg.number("max_position_embeddings", family.positions), config=config)
    family.read(cfg, mapped)
    cfg.finish()
    mapped.tied = bool(mapped.params.get("tie_word_embeddings"))
    return mapped
