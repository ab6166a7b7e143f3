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
from xspec.hf.rope import read_rope

ZERO = [0, 0.0]


@dataclass
class Mapped:
    spec: str                       # the shipped spec extended, e.g. "llama3" (specs/modern/llama3.xspec)
    model_type: str
    hf_class: str                   # transformers' class for this model_type (verification and export)
    layout: str                     # how the weights are named and packed (weight_map.py)
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


def _common(cfg: ConfigReader, *, tie_default: bool, activation: str = "silu") -> None:
    cfg.map("vocab_size", "vocab")
    cfg.map("hidden_size", "d_model")
    cfg.map("num_hidden_layers", "layers", most=MAX_REPEAT)     # the layer-kind lists below have one per layer
    heads = cfg.map("num_attention_heads", "heads")
    cfg.map("num_key_value_heads", "kv_heads", heads)
    cfg.map("intermediate_size", "d_ff")
    cfg.map("rms_norm_eps", "rms_norm_eps", integer=False, least=0)
    cfg.put("tie_word_embeddings", cfg.flag("tie_word_embeddings", tie_default), "tie_word_embeddings")
    for key in ("attention_dropout", "resid_pdrop", "embd_pdrop", "hidden_dropout"):
        cfg.expect(key, ZERO, 0.0, " (dropout is left out of imported models)")
    act_keys = [k for k in ("hidden_act", "hidden_activation") if cfg.has(k)] or ["hidden_act"]
    for key in act_keys:
        cfg.expect(key, [activation], activation)


def _max_positions(cfg: ConfigReader) -> int:
    return cfg.number("max_position_embeddings", 2048)


def _head_dim(cfg: ConfigReader, param: str | None) -> int:
    """head_dim given separately (null or absent: hidden_size / num_attention_heads). `param`: the spec's
    own head_dim parameter, or None where the spec has d_k and d_v."""
    default = cfg.config["hidden_size"] // cfg.config["num_attention_heads"]
    value = cfg.get("head_dim", None)
    value = default if value is None else cfg.number("head_dim")
    if param is not None:
        cfg.put(param, value, "head_dim")
    elif value != default:
        cfg.put("d_k", value, "head_dim")
        cfg.put("d_v", value, "head_dim")
    return value


def _bias(cfg: ConfigReader, key: str) -> None:
    cfg.put(key, cfg.flag(key, False), key)


def _layer_kinds(cfg: ConfigReader, expected: list[str], rule: str) -> None:
    """layer_types, when given, must be the pattern the spec computes (`rule` says which)."""
    given = cfg.get("layer_types", None)
    if given is None:
        return
    if not isinstance(given, list) or len(given) != len(expected):
        raise UserError(f"{cfg.file}: layer_types is not a list of {len(expected)} layer kinds")
    for i, (was, spec) in enumerate(zip(given, expected)):
        if was != spec:
            raise UserError(f"{cfg.file}: layer_types[{i}] {render(was)} is not supported: the spec has "
                            f"{spec} there ({rule})")


LAYER_KINDS = ("sliding_attention", "full_attention")


def _layer_types(cfg: ConfigReader) -> None:
    """layer_types, when given: each layer's kind, which the spec's layers read by their index."""
    given = cfg.get("layer_types", None)
    if given is None:
        return
    layers = cfg.config["num_hidden_layers"]
    if not isinstance(given, list) or len(given) != layers:
        raise UserError(f"{cfg.file}: layer_types is not a list of {layers} layer kinds (num_hidden_layers)")
    for i, kind in enumerate(given):
        if kind not in LAYER_KINDS:
            refuse(f"layer_types[{i}] {render(kind)}", list(LAYER_KINDS), cfg.file)
    cfg.put("layer_types", list(given), "layer_types")


def _window(cfg: ConfigReader, key: str = "sliding_window") -> int:
    return cfg.map(key, "sliding_window")


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
    rope = read_rope(cfg, ("default", "linear", "llama3", "yarn"))
    cfg.put("rope_theta", rope["rope_theta"], f"{rope.where}.rope_theta")
    if rope["rope_type"] == "default":
        cfg.ignore("original_max_position_embeddings", "the context before a rotary scaling; none is declared")
        return
    m.spec = "llama3"        # the spec whose layers scale the rotary frequencies
    cfg.put("rope_type", rope["rope_type"], f"{rope.where}.rope_type")
    cfg.put("rope_factor", float(rope["factor"]), f"{rope.where}.factor")
    if rope["rope_type"] == "linear":
        cfg.ignore("original_max_position_embeddings", "linear scaling divides every frequency alike: the "
                                                       "original context changes nothing")
        return
    cfg.put("original_max_position_embeddings", rope["original_max_position_embeddings"],
            f"{rope.where}.original_max_position_embeddings")
    m.scaled_from = rope["original_max_position_embeddings"]
    if rope["rope_type"] == "llama3":
        for name in ("low_freq_factor", "high_freq_factor"):
            if name not in rope:
                raise UserError(f"{cfg.file}: {rope.where} has rope_type \"llama3\" but no {name}")
            cfg.put(name, float(rope[name]), f"{rope.where}.{name}")
        return
    for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        cfg.put(name, float(rope.get(name, default)), f"{rope.where}.{name}" if name in rope else f"{name} (default)")
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        raise UserError(f"{cfg.file}: {rope.where}.truncate {render(truncate)} is not true or false")
    cfg.put("rope_truncate", truncate, f"{rope.where}.truncate" if "truncate" in rope else "truncate (default)")


def _mistral(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False)
    _head_dim(cfg, "head_dim")
    _default_rope(cfg)
    window = cfg.get("sliding_window", None)
    if window is None:   # no window: one as long as the positions the model takes sees everything
        cfg.put("sliding_window", _max_positions(cfg), "sliding_window null: max_position_embeddings")
    else:
        m.window = _window(cfg)


def _mixtral(cfg: ConfigReader, m: Mapped) -> None:
    _mistral(cfg, m)
    cfg.map("num_local_experts", "num_local_experts")
    cfg.map("num_experts_per_tok", "num_experts_per_tok")
    cfg.map("router_aux_loss_coef", "router_aux_loss_coef", 0.001, integer=False, least=0)
    cfg.expect("router_jitter_noise", ZERO, 0.0, " (jitter noise on the router is not in the spec)")


def _default_rope(cfg: ConfigReader) -> None:
    rope = read_rope(cfg, ("default",))
    cfg.put("rope_theta", rope["rope_theta"], f"{rope.where}.rope_theta")


def _qwen2_windows(cfg: ConfigReader, m: Mapped) -> None:
    """Qwen2's windows: with use_sliding_window, layers from max_window_layers on slide (transformers'
    reading of the attribute, which its docstring describes the other way round: transformers #35896)."""
    used = cfg.flag("use_sliding_window", False)
    cfg.put("use_sliding_window", used, "use_sliding_window")
    layers = cfg.config["num_hidden_layers"]
    first = cfg.number("max_window_layers", 28, least=0)
    window = cfg.get("sliding_window", None)
    if used:
        if window is None:
            raise UserError(f"{cfg.file}: use_sliding_window true but sliding_window null")
        m.window = _window(cfg)
        cfg.put("max_window_layers", first, "max_window_layers")
        if first >= layers:
            m.window = None
    kinds = ["sliding_attention" if used and i >= first else "full_attention" for i in range(layers)]
    _layer_kinds(cfg, kinds, "sliding from max_window_layers on when use_sliding_window")


def _qwen2(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False)
    _default_rope(cfg)
    _qwen2_windows(cfg, m)
    # The q, k, v biases are part of Qwen2 (transformers has no attribute for them).
    cfg.expect("attention_bias", [True], True, " (Qwen2 has q, k, v biases)")


def _qwen3(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False)
    _head_dim(cfg, "head_dim")
    _bias(cfg, "attention_bias")
    _default_rope(cfg)
    _qwen2_windows(cfg, m)


def _qwen3_moe(cfg: ConfigReader, m: Mapped) -> None:
    _qwen3(cfg, m)
    spellings = [k for k in ("num_experts", "num_local_experts") if cfg.has(k)]
    if len(spellings) == 2 and cfg.config["num_experts"] != cfg.config["num_local_experts"]:
        raise UserError(f"{cfg.file}: num_experts and num_local_experts disagree")
    cfg.map(spellings[0] if spellings else "num_experts", "num_experts")
    for key in spellings[1:]:
        cfg.get(key)
    _qwen_experts(cfg, normalized=False)


def _qwen_experts(cfg: ConfigReader, *, normalized: bool) -> None:
    """Qwen3-MoE's and Qwen3-Next's experts beyond their count: each token's, their width, the layers that
    have them, the renormalization (`normalized`: the config class's default) and the balance loss."""
    cfg.map("num_experts_per_tok", "num_experts_per_tok")
    cfg.map("moe_intermediate_size", "moe_intermediate_size")
    step = cfg.map("decoder_sparse_step", "decoder_sparse_step", 1)
    cfg.put("norm_topk_prob", cfg.flag("norm_topk_prob", normalized), "norm_topk_prob")
    cfg.map("router_aux_loss_coef", "router_aux_loss_coef", 0.001, integer=False, least=0)
    _sparse_layers(cfg, step)


def _sparse_layers(cfg: ConfigReader, step: int) -> None:
    """Which layers have experts: those decoder_sparse_step picks, less mlp_only_layers, as transformers
    decides; the spec's layers read it by their index (sparse_layers) where the list changes it."""
    layers = cfg.config["num_hidden_layers"]
    dense = cfg.get("mlp_only_layers", [])
    if not isinstance(dense, list) or not all(type(i) is int and 0 <= i < layers for i in dense):
        raise UserError(f"{cfg.file}: mlp_only_layers {render(dense)} is not a list of layer indices from 0 to "
                        f"{layers - 1}")
    if dense:
        cfg.put("sparse_layers", [i not in dense and (i + 1) % step == 0 for i in range(layers)],
                "mlp_only_layers, decoder_sparse_step")


def _gemma_common(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=True, activation="gelu_pytorch_tanh")
    _head_dim(cfg, "head_dim")
    _bias(cfg, "attention_bias")
    cfg.map("query_pre_attn_scalar", "query_pre_attn_scalar", integer=False)
    m.window = _window(cfg)
    cfg.expect("use_bidirectional_attention", [None, False], None, " (the spec's attention is causal)")
    final = cfg.get("final_logit_softcapping", None)
    cfg.put("final_logit_softcapping", 0.0 if final is None else cfg.number("final_logit_softcapping", integer=False,
                                                                             least=1e-9),
            "final_logit_softcapping")


def _gemma2(cfg: ConfigReader, m: Mapped) -> None:
    _gemma_common(cfg, m)
    cfg.map("attn_logit_softcapping", "attn_logit_softcapping", integer=False, least=1e-9)
    _default_rope(cfg)
    _layer_types(cfg)


def _gemma3(cfg: ConfigReader, m: Mapped) -> None:
    _gemma_common(cfg, m)
    cfg.expect("attn_logit_softcapping", [None], None, " (Gemma 3 uses QK-norm)")
    spellings = [k for k in ("sliding_window_pattern", "_sliding_window_pattern") if cfg.has(k)]
    if any(cfg.get(k) != cfg.get(spellings[0]) for k in spellings):
        raise UserError(f"{cfg.file}: sliding_window_pattern and _sliding_window_pattern disagree")
    pattern = cfg.number(spellings[0], 6) if spellings else 6
    cfg.put("sliding_window_pattern", pattern, spellings[0] if spellings else "sliding_window_pattern (default)")
    _layer_types(cfg)
    if cfg.has("rope_parameters") and isinstance(cfg.config["rope_parameters"], dict) \
            and "full_attention" in cfg.config["rope_parameters"]:
        local = read_rope(cfg, ("default",), kind="sliding_attention")
        cfg.put("rope_local_base_freq", local["rope_theta"], f"{local.where}.rope_theta")
        rope = read_rope(cfg, ("default", "linear"), kind="full_attention")
    else:
        cfg.put("rope_local_base_freq", cfg.number("rope_local_base_freq", 10000.0, integer=False),
                "rope_local_base_freq")
        rope = read_rope(cfg, ("default", "linear"), default_theta=1000000.0)
    cfg.put("rope_theta", rope["rope_theta"], f"{rope.where}.rope_theta")
    cfg.put("rope_scaling_factor", float(rope.get("factor", 1.0)),
            f"{rope.where}.factor" if "factor" in rope else f"{rope.where}.rope_type \"default\": factor 1")


def _olmo2(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False)
    _bias(cfg, "attention_bias")
    _default_rope(cfg)


def _phi3(cfg: ConfigReader, m: Mapped) -> None:
    _common(cfg, tie_default=False)
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


def _partial_rotary(cfg: ConfigReader, default: float) -> None:
    """Default rotary positions on the first partial_rotary_factor of each head: the factor at the top
    level or in the rotary settings (both given, they must agree), else the config class's default."""
    rope = read_rope(cfg, ("default",))
    cfg.put("rope_theta", rope["rope_theta"], f"{rope.where}.rope_theta")
    factor = cfg.number("partial_rotary_factor", rope.get("partial_rotary_factor", default), integer=False,
                        least=1e-9, most=1)
    if rope.get("partial_rotary_factor", factor) != factor:
        raise UserError(f"{cfg.file}: partial_rotary_factor and {rope.where}.partial_rotary_factor disagree")
    source = "partial_rotary_factor" if cfg.has("partial_rotary_factor") or "partial_rotary_factor" not in rope \
        else f"{rope.where}.partial_rotary_factor"
    cfg.put("partial_rotary_factor", factor, source)


def _gpt_oss(cfg: ConfigReader, m: Mapped) -> None:
    _unquantized(cfg)
    _common(cfg, tie_default=False)
    _head_dim(cfg, "head_dim")
    cfg.expect("attention_bias", [True], True, " (gpt-oss has biases on every attention projection)")
    m.window = _window(cfg)
    spellings = [k for k in ("num_experts_per_tok", "experts_per_token") if cfg.has(k)]
    if any(cfg.config[k] != cfg.config[spellings[0]] for k in spellings):
        raise UserError(f"{cfg.file}: num_experts_per_tok and experts_per_token disagree")
    cfg.map("num_local_experts", "num_local_experts")
    cfg.map(spellings[0] if spellings else "num_experts_per_tok", "num_experts_per_tok")
    for key in spellings[1:]:
        cfg.get(key)
    cfg.map("swiglu_limit", "swiglu_limit", 7.0, integer=False, least=1e-9)
    cfg.map("swiglu_alpha", "swiglu_alpha", 1.702, integer=False, least=1e-9)
    cfg.map("router_aux_loss_coef", "router_aux_loss_coef", 0.001, integer=False, least=0)
    cfg.ignore("initial_context_length", "the context of pretraining; YaRN's original_max_position_embeddings is used")
    rope = read_rope(cfg, ("yarn",), default_theta=150000.0)
    cfg.put("rope_theta", rope["rope_theta"], f"{rope.where}.rope_theta")
    truncate = rope.get("truncate", True)
    if truncate is not False:
        raise UserError(f"{cfg.file}: {rope.where}.truncate {render(truncate)} is not supported (supported: false)")
    for param, key in (("rope_scaling_factor", "factor"), ("original_max_position_embeddings",
                                                           "original_max_position_embeddings"),
                       ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow")):
        cfg.put(param, rope.get(key, {"beta_fast": 32.0, "beta_slow": 1.0}.get(key)), f"{rope.where}.{key}")
    m.scaled_from = rope["original_max_position_embeddings"]
    _layer_types(cfg)


def _yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's magnitude correction, as transformers computes it: 0.1 mscale ln(factor) + 1 (1 unscaled)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _multi_token_prediction(cfg: ConfigReader, keys: tuple[str, ...]) -> None:
    """DeepSeek-V3's multi-token prediction modules (§2.2), which transformers neither runs nor loads: xspec
    keeps them (the importer drops them, saying so, where the checkpoint lacks their weights)."""
    present = [key for key in keys if cfg.has(key)]
    if not present:
        cfg.put("mtp_depth", 0, keys[0])
        return
    cfg.map(present[0], "mtp_depth", least=0, most=MAX_REPEAT)
    for key in present[1:]:
        cfg.expect(key, [cfg.config[present[0]]], what=f" (the same count as {present[0]})")


def _deepseek_v3(cfg: ConfigReader, m: Mapped) -> None:
    _deepseek_attention(cfg, m, interleaved=cfg.flag("rope_interleave", True))
    _multi_token_prediction(cfg, ("num_nextn_predict_layers",))
    experts = _deepseek_experts(cfg, first_dense=3, experts=256, per_token=8, width=2048, shared=1, scale=2.5)
    _expert_groups(cfg, experts, groups=8, top_groups=4)
    cfg.put("norm_topk_prob", cfg.flag("norm_topk_prob", True), "norm_topk_prob")
    # Keys DeepSeek's own config.json carries beside transformers' ones.
    cfg.expect("topk_method", ["noaux_tc"], "noaux_tc", " (DeepSeek-V3's group-limited choice with the correction "
                                                        "bias)")
    cfg.expect("scoring_func", ["sigmoid"], "sigmoid")


def _deepseek_v2(cfg: ConfigReader, m: Mapped) -> None:
    _deepseek_attention(cfg, m, interleaved=True)   # DeepSeek-V2 turns pairs (x0, x1) as complex numbers
    cfg.ignore("num_nextn_predict_layers", "multi-token prediction modules, which DeepSeek-V2 does not have and "
                                           "transformers does not run either; xspec imports the model without them")
    _deepseek_experts(cfg, first_dense=0, experts=64, per_token=None, width=1407, shared=2, scale=1.0)
    cfg.expect("topk_method", ["greedy"], "greedy", " (group_limited_greedy is not supported yet)")
    for key in ("n_group", "topk_group"):
        cfg.ignore(key, "the groups of group_limited_greedy; greedy routing has none")
    cfg.expect("norm_topk_prob", [False], False, " (transformers' DeepseekV2 weighs the chosen experts by their "
                                                 "softmax scores without renormalizing them)")
    cfg.expect("scoring_func", ["softmax"], "softmax")
    cfg.expect("mlp_bias", [False], False, " (DeepSeek's checkpoints have no feed-forward biases)")


def _glm4_moe(cfg: ConfigReader, m: Mapped) -> None:
    """GLM-4.5: grouped-query attention with partial rotary positions and optional QK-norm, DeepSeek-V3's
    experts."""
    _unquantized(cfg)
    _common(cfg, tie_default=False)
    _head_dim(cfg, "head_dim")
    _bias(cfg, "attention_bias")
    cfg.put("use_qk_norm", cfg.flag("use_qk_norm", False), "use_qk_norm")
    _partial_rotary(cfg, default=0.5)
    _multi_token_prediction(cfg, ("num_nextn_predict_layers", "num_mtp_layers"))
    experts = _deepseek_experts(cfg, first_dense=1, experts=128, per_token=8, width=1408, shared=1, scale=1.0)
    _expert_groups(cfg, experts, groups=1, top_groups=1)
    cfg.put("norm_topk_prob", cfg.flag("norm_topk_prob", True), "norm_topk_prob")


def _bamba(cfg: ConfigReader, m: Mapped) -> None:
    """Bamba: LLaMA's layers whose mixer is Mamba-2's state space, or at attn_layer_indices grouped-query
    attention with rotary positions on half of each head (transformers fixes the half)."""
    _common(cfg, tie_default=False)
    _head_dim(cfg, None)
    for key in ("attention_bias", "mlp_bias"):
        _bias(cfg, key)
    layers = cfg.config["num_hidden_layers"]
    indices = cfg.get("attn_layer_indices", None)
    indices = [] if indices is None else indices
    if not isinstance(indices, list) or any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < layers
                                            for i in indices):
        raise UserError(f"{cfg.file}: attn_layer_indices is not a list of layer numbers below num_hidden_layers "
                        f"({layers})")
    cfg.put("layer_types", ["full_attention" if i in indices else "linear_attention" for i in range(layers)],
            "attn_layer_indices")
    _partial_rotary(cfg, default=0.5)
    cfg.expect("partial_rotary_factor", [0.5], 0.5, " (transformers' Bamba fixes it at 0.5)")
    heads = cfg.map("mamba_n_heads", "mamba_n_heads")
    expand = cfg.map("mamba_expand", "mamba_expand")
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
    _common(cfg, tie_default=False)
    _head_dim(cfg, "head_dim")
    _bias(cfg, "attention_bias")
    _partial_rotary(cfg, default=0.25)
    layers = cfg.config["num_hidden_layers"]
    interval = cfg.number("full_attention_interval", 4)
    kinds = cfg.get("layer_types", None)
    if kinds is None:
        kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers:
        raise UserError(f"{cfg.file}: layer_types is not a list of {layers} layer kinds (num_hidden_layers)")
    for i, kind in enumerate(kinds):
        if kind not in ("linear_attention", "full_attention"):
            refuse(f"layer_types[{i}] {render(kind)}", ["linear_attention", "full_attention"], cfg.file)
    cfg.put("layer_types", list(kinds), "layer_types" if cfg.has("layer_types") else "full_attention_interval")
    key_heads = cfg.map("linear_num_key_heads", "linear_num_key_heads")
    value_heads = cfg.map("linear_num_value_heads", "linear_num_value_heads")
    if value_heads % key_heads:
        raise UserError(f"{cfg.file}: linear_num_value_heads {value_heads} is not a multiple of "
                        f"linear_num_key_heads {key_heads}")
    for key in ("linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"):
        cfg.map(key, key)
    cfg.map("num_experts", "num_experts")
    cfg.map("shared_expert_intermediate_size", "shared_expert_intermediate_size")
    _qwen_experts(cfg, normalized=True)


def _nemotron_h(cfg: ConfigReader, m: Mapped) -> None:
    """Nemotron-H: single-mixer blocks, by layers_block_type Mamba-2, attention without positions or a
    squared-ReLU feed-forward (mixture-of-experts blocks are refused)."""
    kinds = cfg.get("layers_block_type")
    allowed = ["linear_attention", "full_attention", "mlp"]
    if not isinstance(kinds, list) or not kinds or len(kinds) > MAX_REPEAT:
        raise UserError(f"{cfg.file}: layers_block_type is not a list of block kinds")
    for i, kind in enumerate(kinds):
        if kind not in allowed:
            refuse(f"layers_block_type[{i}] {render(kind)}", allowed, cfg.file,
                   " (mixture-of-experts blocks are not supported yet)" if kind == "moe" else "")
    cfg.put("layers", len(kinds), "layers_block_type")
    cfg.put("layers_block_type", list(kinds), "layers_block_type")
    if cfg.has("num_hidden_layers"):
        cfg.expect("num_hidden_layers", [len(kinds)], what=" (one block per entry of layers_block_type)")
    cfg.map("vocab_size", "vocab")
    cfg.map("hidden_size", "d_model")
    heads = cfg.map("num_attention_heads", "heads")
    cfg.map("num_key_value_heads", "kv_heads", heads)
    cfg.map("head_dim", "head_dim", cfg.config["hidden_size"] // heads)
    cfg.map("intermediate_size", "d_ff")
    cfg.map("layer_norm_epsilon", "rms_norm_eps", integer=False, least=0)
    cfg.put("tie_word_embeddings", cfg.flag("tie_word_embeddings", False), "tie_word_embeddings")
    for key in ("attention_bias", "mlp_bias", "mamba_proj_bias"):
        _bias(cfg, key)
    cfg.put("use_conv_bias", cfg.flag("use_conv_bias", True), "use_conv_bias")
    cfg.expect("mlp_hidden_act", ["relu2"], "relu2")
    cfg.expect("mamba_hidden_act", ["silu"], "silu")
    cfg.expect("sliding_window", [None], None)
    cfg.expect("use_bias", [False], False)
    for key in ("attention_dropout", "hidden_dropout"):
        cfg.expect(key, ZERO, 0.0, " (dropout is left out of imported models)")
    mamba_heads = cfg.map("mamba_num_heads", "mamba_num_heads")
    cfg.map("mamba_head_dim", "mamba_head_dim")
    groups = cfg.map("n_groups", "n_groups", 8)
    if mamba_heads % groups:
        raise UserError(f"{cfg.file}: n_groups {groups} does not divide mamba_num_heads {mamba_heads}")
    for key, default in (("ssm_state_size", 128), ("conv_kernel", 4), ("chunk_size", 128)):
        cfg.map(key, key, default)
    # transformers clamps dt at time_step_min from below, whatever time_step_limit says
    cfg.map("time_step_min", "time_step_min", 0.001, integer=False, least=0)
    for key, why in (("time_step_limit", "transformers' Nemotron-H bounds dt by time_step_min instead"),
                     ("time_step_max", "how dt_bias is initialised; an import starts from the weights"),
                     ("time_step_floor", "how dt_bias is initialised; an import starts from the weights"),
                     ("expand", "the mixer's width is mamba_num_heads x mamba_head_dim in transformers' Nemotron-H"),
                     ("residual_in_fp32", "a precision of the residual stream: float32 models keep it anyway"),
                     ("rescale_prenorm_residual", "how a new model is initialised"),
                     ("use_mamba_kernels", "whether transformers uses fused kernels; the pure form is the same"),
                     ("mamba_ssm_cache_dtype", "the precision of transformers' cache"),
                     ("num_logits_to_keep", "how many positions' logits transformers' forward returns")):
        cfg.ignore(key, why)
    for key in ("n_routed_experts", "n_shared_experts", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
                "moe_latent_size", "moe_shared_expert_overlap", "num_experts_per_tok", "routed_scaling_factor",
                "n_group", "topk_group", "norm_topk_prob", "mtp_layers_block_type"):
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


def _deepseek_attention(cfg: ConfigReader, m: Mapped, interleaved: bool) -> None:
    """DeepSeek's layers but their experts: multi-head latent attention, YaRN with its mscale, the norms."""
    _unquantized(cfg)
    _common(cfg, tie_default=False)
    heads = cfg.config["num_attention_heads"]
    kv_heads = cfg.config.get("num_key_value_heads")
    if kv_heads not in (None, heads):
        raise UserError(f"{cfg.file}: num_key_value_heads {render(kv_heads)} is not supported: latent attention "
                        f"makes every head's keys from the latent (supported: num_attention_heads, {heads})")
    query_rank = cfg.get("q_lora_rank", None)
    cfg.put("q_lora_rank", 0 if query_rank is None else cfg.number("q_lora_rank"), "q_lora_rank")
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        cfg.map(key, key)
    if cfg.config["qk_rope_head_dim"] % 2:
        raise UserError(f"{cfg.file}: qk_rope_head_dim {cfg.config['qk_rope_head_dim']} is odd: rotary positions "
                        "turn pairs of features")
    for key, derived in (("head_dim", "qk_rope_head_dim"), ("qk_head_dim", "qk_nope_head_dim + qk_rope_head_dim")):
        expected = cfg.config["qk_rope_head_dim"] if key == "head_dim" else \
            cfg.config["qk_nope_head_dim"] + cfg.config["qk_rope_head_dim"]
        cfg.expect(key, [expected], expected, f" (transformers derives it: {derived})")
    _bias(cfg, "attention_bias")
    # Interleaved rotary features ((x0, x1), (x2, x3), ...) are the plain layout's rows reordered: import
    # reorders them (weight_map.py), so the spec turns halves as every family does.
    m.layout = "deepseek_interleaved" if interleaved else "deepseek"
    rope = read_rope(cfg, ("default", "yarn"), scaling_extras=("mscale", "mscale_all_dim", "attention_factor"))
    cfg.put("rope_theta", rope["rope_theta"], f"{rope.where}.rope_theta")
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
            f"{rope.where}.original_max_position_embeddings")
    m.scaled_from = rope["original_max_position_embeddings"]
    for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        cfg.put(name, float(rope.get(name, default)), f"{rope.where}.{name}" if name in rope else f"{name} (default)")
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


def _deepseek_experts(cfg: ConfigReader, *, first_dense: int, experts: int, per_token: int | None, width: int,
                      shared: int, scale: float) -> int:
    """DeepSeek's routed experts after the first first_k_dense_replace layers, with shared experts beside
    them; their count. Absent keys take the transformers config class's defaults (given here), as
    transformers reads them."""
    cfg.map("first_k_dense_replace", "first_k_dense_replace", first_dense, least=0)
    count = cfg.map("n_routed_experts", "n_routed_experts", experts)
    cfg.map("num_experts_per_tok", "num_experts_per_tok", *([] if per_token is None else [per_token]), most=count)
    cfg.map("moe_intermediate_size", "moe_intermediate_size", width)
    cfg.map("n_shared_experts", "n_shared_experts", shared)
    cfg.map("routed_scaling_factor", "routed_scaling_factor", scale, integer=False, least=1e-9)
    # DeepSeek's own config.json keys beside transformers' ones.
    cfg.expect("moe_layer_freq", [1], 1, " (every layer after the dense ones has experts)")
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


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", "LlamaForCausalLM", "pre_norm", _llama),
    "mistral": Family("mistral", "MistralForCausalLM", "pre_norm", _mistral),
    "qwen2": Family("qwen2", "Qwen2ForCausalLM", "pre_norm", _qwen2),
    "qwen3": Family("qwen3", "Qwen3ForCausalLM", "pre_norm", _qwen3),
    "gemma2": Family("gemma2", "Gemma2ForCausalLM", "sandwich", _gemma2),
    "gemma3_text": Family("gemma3", "Gemma3ForCausalLM", "sandwich", _gemma3),
    "olmo2": Family("olmo2", "Olmo2ForCausalLM", "post_norm", _olmo2),
    "phi3": Family("phi3", "Phi3ForCausalLM", "phi3", _phi3),
    "mixtral": Family("mixtral", "MixtralForCausalLM", "mixtral", _mixtral),
    "qwen3_moe": Family("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe", _qwen3_moe),
    "gpt_oss": Family("gpt_oss", "GptOssForCausalLM", "gpt_oss", _gpt_oss),
    "deepseek_v2": Family("deepseek_v2", "DeepseekV2ForCausalLM", "deepseek", _deepseek_v2),
    "deepseek_v3": Family("deepseek_v3", "DeepseekV3ForCausalLM", "deepseek", _deepseek_v3),
    "glm4_moe": Family("glm4_moe", "Glm4MoeForCausalLM", "deepseek", _glm4_moe),
    "bamba": Family("bamba", "BambaForCausalLM", "bamba", _bamba),
    "qwen3_next": Family("qwen3_next", "Qwen3NextForCausalLM", "qwen3_next", _qwen3_next),
    "nemotron_h": Family("nemotron_h", "NemotronHForCausalLM", "nemotron_h", _nemotron_h),
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
    mapped = Mapped(family.spec, model_type, family.hf_class, family.layout, cfg.settings, cfg.notes, 0,
                    config=config)
    family.read(cfg, mapped)
    if not cfg.has("max_position_embeddings") or "max_position_embeddings" not in cfg.taken:
        mapped.max_positions = _max_positions(cfg)
    else:
        mapped.max_positions = cfg.config["max_position_embeddings"]
    cfg.finish()
    mapped.tied = bool(mapped.params.get("tie_word_embeddings"))
    return mapped
