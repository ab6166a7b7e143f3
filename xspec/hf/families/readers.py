"""What several families' config classes read alike: the sizes every family has, head sizes, biases,
windows and layer kinds, rotary settings, experts. Each reads config.json keys through a ConfigReader,
which records the spec parameter each becomes and refuses what the spec cannot compute, by name."""

from __future__ import annotations

import math

from xspec.base.errors import UserError
from xspec.compiler.limits import MAX_REPEAT
from xspec.hf.config_reader import ConfigReader, refuse, render
from xspec.hf.families.family import Mapped
from xspec.hf.rope import read_rope


ZERO = [0, 0.0]


def read_common(cfg: ConfigReader, *, tie_default: bool, activation: str = "silu", eps: float = 1e-6,
                kv_heads: int | None = None) -> None:
    """What every family's config class reads alike; where config.json lacks them, `eps` is its
    rms_norm_eps and `kv_heads` its num_key_value_heads (None: one per attention head, as for null)."""
    cfg.map("vocab_size", "vocab")
    cfg.map("hidden_size", "d_model")
    cfg.map("num_hidden_layers", "layers", most=MAX_REPEAT)     # the layer-kind lists below have one per layer
    read_kv_heads(cfg, cfg.map("num_attention_heads", "heads"), kv_heads)
    cfg.map("intermediate_size", "d_ff")
    cfg.map("rms_norm_eps", "rms_norm_eps", eps, integer=False, least=0)
    cfg.put("tie_word_embeddings", cfg.flag("tie_word_embeddings", tie_default), "tie_word_embeddings")
    for key in ("attention_dropout", "resid_pdrop", "embd_pdrop", "hidden_dropout"):
        cfg.expect(key, ZERO, 0.0, " (dropout is left out of imported models)")
    act_keys = [k for k in ("hidden_act", "hidden_activation") if cfg.has(k)] or ["hidden_act"]
    for key in act_keys:
        cfg.expect(key, [activation], activation)


def read_kv_heads(cfg: ConfigReader, heads: int, default: int | None) -> None:
    """num_key_value_heads: absent, the config class's `default` (None: one per attention head); null, one
    per attention head."""
    if cfg.get("num_key_value_heads", None) is not None:
        cfg.map("num_key_value_heads", "kv_heads")
    elif cfg.has("num_key_value_heads") or default is None:
        cfg.put("kv_heads", heads, "num_key_value_heads" if cfg.has("num_key_value_heads") else
                "num_key_value_heads (default: num_attention_heads)")
    else:
        cfg.put("kv_heads", default, "num_key_value_heads (default)")


def read_head_dim(cfg: ConfigReader, param: str | None, default: int | None = None) -> int:
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


def read_bias(cfg: ConfigReader, key: str) -> None:
    cfg.put(key, cfg.flag(key, False), key)


LAYER_KINDS = ("sliding_attention", "full_attention")


# Layer kinds under their older names, which transformers reads as today's (remap_legacy_layer_types).
LEGACY_KINDS = {"mamba": "linear_attention", "attention": "full_attention"}


def read_kinds(cfg: ConfigReader, key: str, allowed: tuple[str, ...], count: int) -> list[str] | None:
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


def read_layer_types(cfg: ConfigReader) -> None:
    """layer_types, when given: each layer's kind, which the spec's layers read by their index."""
    kinds = read_kinds(cfg, "layer_types", LAYER_KINDS, cfg.config["num_hidden_layers"])
    if kinds is not None:
        cfg.put("layer_types", kinds, "layer_types")


def note_unread_layer_types(cfg: ConfigReader, why: str) -> None:
    """layer_types where the family's attention does not read it (transformers checks it all the same)."""
    if read_kinds(cfg, "layer_types", LAYER_KINDS, cfg.config["num_hidden_layers"]) is not None:
        cfg.notes["layer_types"] = why


def read_window(cfg: ConfigReader, default: int) -> int:
    return cfg.map("sliding_window", "sliding_window", default)


def refuse_window(cfg: ConfigReader) -> None:
    value = cfg.get("sliding_window", None)
    if value is not None:
        raise UserError(f"{cfg.file}: sliding_window {render(value)} is not supported for model_type "
                        f"{render(cfg.config['model_type'])} (supported: null)")


def read_default_rope(cfg: ConfigReader, theta: float = 10000.0) -> None:
    rope = read_rope(cfg, ("default",), default_theta=theta)
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))


def read_partial_rotary(cfg: ConfigReader, default: float, top_level: bool = True) -> None:
    """Default rotary positions on the first partial_rotary_factor of each head: inside the rotary settings,
    else at the top level (`top_level`: where the config class reads it there), else the class's default."""
    rope = read_rope(cfg, ("default",), top_level_partial=top_level)
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))
    factor = rope.get("partial_rotary_factor", default)
    source = rope.source("partial_rotary_factor") if "partial_rotary_factor" in rope else \
        "partial_rotary_factor (default)"
    cfg.put("partial_rotary_factor", float(factor), source)


def refuse_quantized(cfg: ConfigReader) -> None:
    """Weights as plain tensors: a quantization_config (gpt-oss's MXFP4, DeepSeek-V3's FP8) is refused."""
    if cfg.has("quantization_config"):
        quantization = cfg.config["quantization_config"]
        method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
        raise UserError(f"{cfg.file}: quantization_config ({render(method)}) "
                        "is not supported (supported: unquantized weights; dequantize with transformers first)")


def read_qwen2_windows(cfg: ConfigReader, m: Mapped, *, every_layer: bool = False) -> None:
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
        m.window = read_window(cfg, 4096)
    first = cfg.number("max_window_layers", 28, least=0, null=True)
    if every_layer:
        cfg.ignore("max_window_layers", "transformers' Qwen3-MoE slides in every layer when use_sliding_window")
        note_unread_layer_types(cfg, "transformers' Qwen3-MoE slides in every layer when use_sliding_window; "
                                 "layer_types shapes only its cache")
        return
    cfg.put("max_window_layers", first, "max_window_layers")
    kinds = read_kinds(cfg, "layer_types", LAYER_KINDS, layers)
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


def read_qwen_experts(cfg: ConfigReader, *, normalized: bool, per_token: int, width: int) -> None:
    """Qwen3-MoE's and Qwen3-Next's experts beyond their count: each token's, their width, the layers that
    have them, the renormalization and the balance loss (defaults: the config class's)."""
    cfg.map("num_experts_per_tok", "num_experts_per_tok", per_token)
    cfg.map("moe_intermediate_size", "moe_intermediate_size", width)
    step = cfg.map("decoder_sparse_step", "decoder_sparse_step", 1)
    cfg.put("norm_topk_prob", cfg.flag("norm_topk_prob", normalized), "norm_topk_prob")
    cfg.map("router_aux_loss_coef", "router_aux_loss_coef", 0.001, integer=False, least=0)
    read_sparse_layers(cfg, step)


def read_sparse_layers(cfg: ConfigReader, step: int) -> None:
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


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's magnitude correction, as transformers computes it: 0.1 mscale ln(factor) + 1 (1 unscaled)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def read_multi_token_prediction(cfg: ConfigReader, default: int) -> None:
    """DeepSeek-V3's multi-token prediction modules (§2.2), which transformers neither runs nor loads: xspec
    keeps them (the importer drops them, saying so, where the checkpoint lacks their weights). `default`:
    the config class's count where config.json gives none."""
    key = cfg.spelling("num_nextn_predict_layers", "num_mtp_layers")
    cfg.put("mtp_depth", cfg.number(key, default, least=0, most=MAX_REPEAT),
            key if cfg.has(key) else f"{key} (default)")


# transformers 5 writes an infinite float in config.json as this object (JSON has no Infinity).
INFINITY = {"__float__": "Infinity"}


def read_expert_groups(cfg: ConfigReader, experts: int, *, groups: int, top_groups: int) -> None:
    """n_group and topk_group of DeepSeek-V3's routing over `experts` (defaults: the transformers config
    class's)."""
    count = cfg.map("n_group", "n_group", groups, most=experts)
    cfg.map("topk_group", "topk_group", top_groups, most=count)
    if experts % count or experts // count < 2:
        raise UserError(f"{cfg.file}: n_group {count} does not split n_routed_experts {experts} into groups of "
                        "two or more experts, which DeepSeek-V3's routing scores by their two best")


def read_deepseek_experts(cfg: ConfigReader, alias: str, *, first_dense: int, experts: int, per_token: int | None,
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


# activation_function -> the encoder-decoder specs' `activation_function` (transformers' ACT2FN: "swish" is SiLU)
SEQ2SEQ_ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu"}
# transformers' ACT2FN names of the encoders' and T5's activations -> the `activation` op's, and back.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "silu": "silu", "swish": "silu"}
WRITTEN_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def read_seq2seq(cfg: ConfigReader, m: Mapped, *, activation: str, scale_embedding: bool,
                 normalize_embedding: bool, pre_norm: bool = False, target_vocabulary: bool = False) -> None:
    """What BART's config class and its descendants (Marian's, mBART's) read alike: an encoder and a decoder
    sized apart, the activation, the dropouts, whether embeddings are scaled, tied output; and the BART-era
    switches, each only at the value the family computes (`normalize_embedding`: a layer norm of the
    embeddings; `pre_norm`: pre-norm layers and a layer norm after each side's last). `target_vocabulary`: the
    family reads decoder_vocab_size itself (Marian's); the others' must be vocab_size."""
    vocab = cfg.map("vocab_size", "vocab")
    if not target_vocabulary:
        decoder_vocab = cfg.get("decoder_vocab_size", None)
        if decoder_vocab not in (None, vocab):
            raise UserError(f"{cfg.file}: decoder_vocab_size {render(decoder_vocab)} differs from vocab_size {vocab}: "
                            "a target vocabulary of its own is not supported (supported: null, or vocab_size)")
    cfg.map(cfg.spelling("d_model", "hidden_size"), "d_model")
    for side in ("encoder", "decoder"):
        layers = cfg.spelling("encoder_layers", "num_hidden_layers") if side == "encoder" else "decoder_layers"
        heads = cfg.spelling("encoder_attention_heads", "num_attention_heads") if side == "encoder" \
            else "decoder_attention_heads"
        cfg.map(layers, f"{side}_layers", most=MAX_REPEAT)
        cfg.map(heads, f"{side}_attention_heads")
        cfg.map(f"{side}_ffn_dim", f"{side}_ffn_dim")
        layerdrop = f"{side}_layerdrop"
        if cfg.number(layerdrop, 0.0, integer=False, least=0, most=1):
            cfg.notes[layerdrop] = "LayerDrop skips whole layers in training only; xspec's fine-tuning runs each"
    chosen = cfg.get("activation_function", activation)
    if chosen not in SEQ2SEQ_ACTIVATIONS:
        refuse(f"activation_function {render(chosen)}", list(SEQ2SEQ_ACTIVATIONS), cfg.file)
    cfg.put("activation_function", SEQ2SEQ_ACTIVATIONS[chosen], "activation_function")
    for key, default in (("dropout", 0.1), ("attention_dropout", 0.0), ("activation_dropout", 0.0)):
        cfg.map(key, key, default, integer=False, least=0)
    cfg.put("max_len", m.max_positions, "max_position_embeddings")
    cfg.put("scale_embedding", cfg.flag("scale_embedding", scale_embedding), "scale_embedding")
    cfg.put("tie_word_embeddings", cfg.flag("tie_word_embeddings", True), "tie_word_embeddings")
    for key, value in (("normalize_before", pre_norm), ("normalize_embedding", normalize_embedding),
                       ("add_final_layer_norm", pre_norm), ("add_bias_logits", False), ("is_decoder", False)):
        cfg.expect(key, [value], value)
    cfg.ignore("extra_pos_embeddings", "a count BART-era configs carried; the positions read max_position_embeddings")
    for key in ("classif_dropout", "classifier_dropout"):
        cfg.ignore(key, "the dropout of a classification head; a translation model has none")
    cfg.ignore("gradient_checkpointing", "whether transformers recomputes activations in training")
    cfg.ignore("init_std", "how a new model is initialised; an import starts from the weights")
    cfg.ignore("decoder_start_token_id", "the token every output starts from: a generation setting")
    cfg.ignore("task_specific_params", "generation presets for tasks (summarization, translation); "
                                       "generation_config.json's settings are read")


def read_classifier(cfg: ConfigReader, m: Mapped, classifier: str) -> bool:
    """Whether architectures names the family's sequence classifier (`classifier`, its transformers class): then
    its classes, their number and names from id2label (transformers' LABEL_0, LABEL_1, ... where it gives none),
    single-label only (a softmax over them); the mapping's class becomes it."""
    architectures = cfg.get("architectures", None)
    if not isinstance(architectures, list) or classifier not in architectures:
        return False
    m.hf_class = classifier
    named = cfg.get("id2label", None)
    count = len(named) if isinstance(named, dict) else cfg.number("num_labels", 2)
    labels = [f"LABEL_{i}" for i in range(count)]
    if isinstance(named, dict):
        if sorted(map(str, named)) != sorted(map(str, range(count))):
            raise UserError(f"{cfg.file}: id2label's keys are not the classes 0 to {count - 1}")
        labels = [named[str(i)] if str(i) in named else named[i] for i in range(count)]
        if not all(isinstance(label, str) for label in labels):
            raise UserError(f"{cfg.file}: id2label names a class with something other than a string")
    cfg.put("num_labels", count, "id2label" if isinstance(named, dict) else "num_labels")
    cfg.put("labels", labels, "id2label" if isinstance(named, dict) else "num_labels (LABEL_0, LABEL_1, ...)")
    cfg.ignore("label2id", "the classes' ids by name: id2label read the other way")
    cfg.ignore("num_labels", "the classes' count, as id2label gives it")
    cfg.expect("problem_type", [None, "single_label_classification"], None, " (one class a text, a softmax over them)")
    return True


def write_classifier(params: dict, config: dict, classifier: str) -> None:
    """A classifier's architectures, id2label, label2id and classifier_dropout (read_classifier's inverse)."""
    if not params["num_labels"]:
        return
    labels = list(params["labels"]) or [f"LABEL_{i}" for i in range(params["num_labels"])]
    config["architectures"] = [classifier]
    config["id2label"] = {str(i): label for i, label in enumerate(labels)}
    config["label2id"] = {label: i for i, label in enumerate(labels)}
    config["classifier_dropout"] = params["classifier_dropout"]
