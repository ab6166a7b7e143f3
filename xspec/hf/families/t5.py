"""T5 (T5ForConditionalGeneration), and what mT5 and umT5 read alike: a pre-norm encoder-decoder with RMS norms
that subtract no mean, no biases, unscaled attention scores, a relative position bias per head and distance
bucket made once per stack (umT5: in every layer), a ReLU or gated feed-forward sublayer, and one embedding
for source, target and logits.

transformers 5 ties the output projection to the embedding whatever tie_word_embeddings says (a checkpoint
holding a head of other values unties it; the importer does the same), and reads tie_word_embeddings false
as "do not scale the decoder's output by d_model^-0.5" (`scale_decoder_outputs`, which mT5 never does).

Its checkpoints name each layer's sublayers by position: `block.N.layer.0` is self-attention, then (in the
decoder) `layer.1` cross-attention, and the last the feed-forward; projections are `q`, `k`, `v` and `o`."""

from __future__ import annotations

import re
from typing import Any, Optional

from xspec.base.errors import UserError
from xspec.compiler.limits import MAX_REPEAT
from xspec.hf.config_reader import ConfigReader, refuse, render
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import ACTIVATIONS, WRITTEN_ACTIVATIONS
from xspec.hf.weight_map import Extra, Group, WeightRules, same

T5_POSITIONS = 512   # n_positions of T5's configs: the length its tokenizers cut at; its positions have no table


def read_t5(cfg: ConfigReader, m: Mapped, *, feed_forward: str, scales: bool) -> None:
    """T5Config's keys; `feed_forward`: the family's default feed_forward_proj; `scales`: whether the family
    reads scale_decoder_outputs (T5, umT5) or never scales (mT5)."""
    cfg.map("vocab_size", "vocab")
    cfg.map(cfg.spelling("d_model", "hidden_size"), "d_model")
    cfg.map(cfg.spelling("d_kv", "head_dim"), "d_kv")
    cfg.map("d_ff", "d_ff")
    layers = cfg.map(cfg.spelling("num_layers", "num_hidden_layers"), "num_layers", most=MAX_REPEAT)
    cfg.map("num_decoder_layers", "num_decoder_layers", layers, most=MAX_REPEAT, null=True)
    cfg.map(cfg.spelling("num_heads", "num_attention_heads"), "num_heads")
    # the encoder's buckets are half per direction, half of those exact distances; the decoder counts
    # buckets / 2 distances one by one, which the log-spaced ones must reach past
    buckets = cfg.map("relative_attention_num_buckets", "relative_attention_num_buckets", 32, least=4)
    cfg.map("relative_attention_max_distance", "relative_attention_max_distance", 128, least=buckets // 2 + 1)
    cfg.map("dropout_rate", "dropout_rate", 0.1, integer=False, least=0)
    cfg.map("layer_norm_epsilon", "layer_norm_epsilon", 1e-6, integer=False, least=0)
    _read_feed_forward(cfg, feed_forward)
    tie = cfg.get("tie_word_embeddings", None)
    if tie is not None and not isinstance(tie, bool):
        raise UserError(f"{cfg.file}: tie_word_embeddings {render(tie)} is not true or false")
    cfg.put("tie_word_embeddings", True, f"model_type {m.model_type}: transformers ties the output projection to "
                                         "the embedding (a checkpoint's lm_head.weight of other values unties it)")
    if scales:
        cfg.put("scale_decoder_outputs", cfg.flag("scale_decoder_outputs", tie is not False),
                "scale_decoder_outputs" if cfg.has("scale_decoder_outputs") else "tie_word_embeddings")
    else:
        cfg.put("scale_decoder_outputs", False, f"model_type {m.model_type}: the decoder's output is not scaled")
        cfg.ignore("scale_decoder_outputs", f"model_type {m.model_type} reads no such key")
    m.max_positions = cfg.number("n_positions", m.max_positions)
    cfg.expect("is_decoder", [False], False)
    for key, reason in (("initializer_factor", "how a new model is initialised; an import starts from the weights"),
                        ("output_past", "whether older versions returned the cache: xspec's decoding keeps one"),
                        ("gradient_checkpointing", "whether transformers recomputes activations in training"),
                        ("classifier_dropout", "the dropout of a classification head; a translation model has none"),
                        ("decoder_start_token_id", "the token every output starts from: a generation setting"),
                        ("task_specific_params", "generation presets for tasks (summarization, translation); "
                                                 "generation_config.json's settings are read")):
        cfg.ignore(key, reason)


def _read_feed_forward(cfg: ConfigReader, default: str) -> None:
    """feed_forward_proj ("relu", "gated-gelu", ...), and the dense_act_fn and is_gated_act it implies, which
    config.json may also give (transformers then reads those)."""
    chosen = cfg.get("feed_forward_proj", default)
    parts = chosen.split("-") if isinstance(chosen, str) else []
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise UserError(f"{cfg.file}: feed_forward_proj {render(chosen)} is not an activation (\"relu\") or a gated "
                        "one (\"gated-gelu\")")
    activation = cfg.get("dense_act_fn", "gelu_new" if chosen == "gated-gelu" else parts[-1])
    if activation not in ACTIVATIONS:
        refuse(f"{'dense_act_fn' if cfg.has('dense_act_fn') else 'feed_forward_proj'} activation "
               f"{render(activation)}", list(ACTIVATIONS), cfg.file)
    source = "dense_act_fn" if cfg.has("dense_act_fn") else "feed_forward_proj"
    cfg.put("dense_act_fn", ACTIVATIONS[activation], source)
    gated = cfg.flag("is_gated_act", len(parts) == 2)
    cfg.put("is_gated_act", gated, "is_gated_act" if cfg.has("is_gated_act") else "feed_forward_proj")


T5_KEYS = {"vocab": "vocab_size", "d_model": "d_model", "d_kv": "d_kv", "d_ff": "d_ff", "num_layers": "num_layers",
           "num_decoder_layers": "num_decoder_layers", "num_heads": "num_heads",
           "relative_attention_num_buckets": "relative_attention_num_buckets",
           "relative_attention_max_distance": "relative_attention_max_distance", "dropout_rate": "dropout_rate",
           "layer_norm_epsilon": "layer_norm_epsilon", "is_gated_act": "is_gated_act"}


def write_t5(params: dict[str, Any], config: dict[str, Any]) -> None:
    activation, gated = WRITTEN_ACTIVATIONS[params["dense_act_fn"]], params["is_gated_act"]
    config["feed_forward_proj"] = ("gated-gelu" if activation == "gelu_new" else f"gated-{activation}") if gated \
        else activation
    config["dense_act_fn"] = activation
    config["tie_word_embeddings"] = params["tie_word_embeddings"]
    config["is_encoder_decoder"] = True
    config["decoder_start_token_id"] = config["pad_token_id"] = 0   # T5's: replaced by the tokenizer's where kept


def write_scaled(params: dict[str, Any], config: dict[str, Any]) -> None:
    write_t5(params, config)
    config["scale_decoder_outputs"] = params["scale_decoder_outputs"]


# The spec's names of a layer's parts -> the checkpoint's, in each stack (the number of the sublayer holding it).
_ATTENTION = {"self_attn": "0.SelfAttention", "encoder_attn": "1.EncDecAttention"}
_NORMS = {"encoder": {"self_attn_layer_norm": "0", "final_layer_norm": "1"},
          "decoder": {"self_attn_layer_norm": "0", "encoder_attn_layer_norm": "1", "final_layer_norm": "2"}}
_PART = re.compile(r"(encoder|decoder)\.layers\.(\d+)\.(\w+)\.(.+)")


def checkpoint_name(name: str) -> str:
    """T5's name of the spec's tensor `name`."""
    if name == "decoder.lm_head.weight":
        return "lm_head.weight"
    if name == "encoder.embed_tokens.weight":
        return "shared.weight"
    stack, rest = name.split(".", 1)
    if rest == "relative_attention_bias.weight":   # made once per stack: the first layer's
        return f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    found = _PART.fullmatch(name)
    if found is None:
        return name                                  # the stacks' final_layer_norm
    stack, layer, part, tensor = found.groups()
    block = f"{stack}.block.{layer}.layer."
    feed_forward = _NORMS[stack]["final_layer_norm"]
    if part in _ATTENTION:
        return block + _ATTENTION[part] + "." + tensor.replace("_proj.", ".")
    if part in _NORMS[stack]:
        return f"{block}{_NORMS[stack][part]}.layer_norm.{tensor}"
    if part == "mlp":
        return f"{block}{feed_forward}.DenseReluDense.{tensor}"
    if part == "relative_attention_bias":          # umT5's, one per layer
        return f"{block}0.SelfAttention.relative_attention_bias.{tensor}"
    raise AssertionError(f"no T5 name for the spec's tensor {name}")


def t5_names(name: str, shapes: dict, params: dict) -> Optional[Group]:
    return Group((checkpoint_name(name),), (name,), same, same)


def t5_copies(name: str, params: dict) -> Optional[Extra]:
    """The copies T5's checkpoints may keep of the shared embedding (each stack's, a tied output head's)."""
    if name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        return Extra("shared.weight", "the encoder and the decoder share one embedding")
    if name == "lm_head.weight" and params["tie_word_embeddings"]:
        return Extra("shared.weight", "the output projection is tied to the embedding")
    return None


WEIGHTS = WeightRules("t5", t5_names, extras=t5_copies)


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_t5(cfg, m, feed_forward="relu", scales=True)


FAMILY = Family("t5", "t5", "T5ForConditionalGeneration", read, T5_POSITIONS, write=write_scaled,
                encoder_decoder=True, common_keys=False, depth="num_decoder_layers", keys=T5_KEYS, weights=WEIGHTS)
