"""ModernBERT (ModernBertForMaskedLM): a pre-norm encoder alone with rotary positions, no biases, fused Q, K and V
projections, a GeGLU feed-forward sublayer, global attention every third layer and local attention (a band of
local_attention / 2 positions on either side) in the others, each kind rotated with a base of its own; a final
norm, and the masked-LM head (dense, activation, norm, then the projection tied to the embedding, with a bias)."""

from __future__ import annotations

import re
from typing import Any, Optional

from xspec.compiler.limits import MAX_REPEAT
from xspec.hf.config_reader import ConfigReader, refuse, render
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import ACTIVATIONS, read_classifier, read_layer_types, write_classifier
from xspec.hf.rope import read_rope_of_kind
from xspec.hf.weight_map import Extra, Group, WeightRules, same

# The spec's activations (the GLU op's and the head's) as ModernBERT's configs spell them.
WRITTEN = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu", "relu": "relu"}
CLASSIFIER = "ModernBertForSequenceClassification"
POOLINGS = ["cls", "mean"]  # what the classifier's head reads: the first position's state, or the text's mean
# Each layer kind's base: the top-level key older configs give it by, and its default.
BASES = {"full_attention": ("global_rope_theta", 160000.0), "sliding_attention": ("local_rope_theta", 10000.0)}


def _activation(cfg: ConfigReader, key: str) -> None:
    chosen = cfg.get(key, "gelu")
    if chosen not in ACTIVATIONS:
        refuse(f"{key} {render(chosen)}", list(ACTIVATIONS), cfg.file)
    cfg.put(key, ACTIVATIONS[chosen], key)


def read(cfg: ConfigReader, m: Mapped) -> None:
    cfg.map("vocab_size", "vocab")
    cfg.map("hidden_size", "d_model")
    cfg.map("intermediate_size", "d_ff")
    cfg.map("num_hidden_layers", "layers", most=MAX_REPEAT)
    cfg.map("num_attention_heads", "heads")
    cfg.put("max_len", m.max_positions, "max_position_embeddings")
    for key in ("hidden_activation", "classifier_activation"):
        _activation(cfg, key)
    cfg.map("norm_eps", "norm_eps", 1e-5, integer=False, least=0)
    for key, default in (("norm_bias", False), ("attention_bias", False), ("mlp_bias", False),
                         ("classifier_bias", False), ("decoder_bias", True), ("tie_word_embeddings", True)):
        cfg.put(key, cfg.flag(key, default), key)
    for key in ("attention_dropout", "embedding_dropout", "mlp_dropout"):
        cfg.map(key, key, 0.0, integer=False, least=0)
    cfg.map("local_attention", "local_attention", 128)
    every = cfg.number("global_attn_every_n_layers", 3)
    cfg.put("global_attn_every_n_layers", every, "global_attn_every_n_layers" if cfg.has("global_attn_every_n_layers")
            else "global_attn_every_n_layers (default)")
    read_layer_types(cfg)
    for kind, top in BASES.items():
        rope = read_rope_of_kind(cfg, kind, ("default",), top, scaled=True, family="ModernBERT")
        cfg.put(top[0], float(rope["rope_theta"]), rope.source("rope_theta"))
    if read_classifier(cfg, m, CLASSIFIER):
        pooling = cfg.expect("classifier_pooling", POOLINGS, "cls", " (the first position's state or the text's mean)")
        cfg.put("classifier_pooling", pooling, "classifier_pooling" if cfg.has("classifier_pooling")
                else "classifier_pooling (default)")
        cfg.map("classifier_dropout", "classifier_dropout", 0.0, integer=False, least=0)
    else:
        cfg.ignore("classifier_pooling", "how a classification head pools; the masked-LM head has none")
        cfg.ignore("classifier_dropout", "the dropout of a classification head; the masked-LM head has none")
    for key, reason in (("initializer_cutoff_factor", "how a new model is initialised; an import starts from the "
                                                      "weights"),
                        ("deterministic_flash_attn", "whether flash attention's backward is deterministic"),
                        ("sparse_prediction", "whether training scores the masked positions alone: the same loss"),
                        ("sparse_pred_ignore_index", "the label sparse prediction skips"),
                        ("reference_compile", "whether transformers compiles the model"),
                        ("repad_logits_with_grad", "how transformers repads unpadded logits"),
                        ("cls_token_id", "a tokenizer id (kept with the tokenizer)"),
                        ("sep_token_id", "a tokenizer id (kept with the tokenizer)")):
        cfg.ignore(key, reason)


def write(params: dict[str, Any], config: dict[str, Any]) -> None:
    write_classifier(params, config, CLASSIFIER)
    if params["num_labels"]:    # a spec of before its pooling was a parameter pools as "cls"
        config["classifier_pooling"] = params.get("classifier_pooling", "cls")
    for key in ("hidden_activation", "classifier_activation"):
        config[key] = WRITTEN[params[key]]
    config["layer_types"] = list(params["layer_types"][:params["layers"]])
    config["rope_parameters"] = {kind: {"rope_type": "default", "rope_theta": params[param]}
                                 for kind, (param, _) in BASES.items()}


KEYS = {"vocab": "vocab_size", "d_model": "hidden_size", "d_ff": "intermediate_size", "layers": "num_hidden_layers",
        "heads": "num_attention_heads", "norm_eps": "norm_eps", "norm_bias": "norm_bias",
        "attention_bias": "attention_bias", "mlp_bias": "mlp_bias", "classifier_bias": "classifier_bias",
        "decoder_bias": "decoder_bias", "local_attention": "local_attention",
        "attention_dropout": "attention_dropout", "embedding_dropout": "embedding_dropout",
        "mlp_dropout": "mlp_dropout", "tie_word_embeddings": "tie_word_embeddings"}

# The spec's names -> the checkpoint's.
_OUTSIDE = {"tok_embeddings": "model.embeddings.tok_embeddings", "embeddings_norm": "model.embeddings.norm",
            "final_norm": "model.final_norm", "head_dense": "head.dense", "head_norm": "head.norm",
            "lm_head": "decoder", "classifier": "classifier"}
_LAYER = {"attn.qkv_proj": "attn.Wqkv", "attn.o_proj": "attn.Wo", "Wi": "mlp.Wi", "Wo": "mlp.Wo"}
_IN_LAYER = re.compile(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)")


def checkpoint_name(name: str) -> str:
    found = _IN_LAYER.fullmatch(name)
    if found is not None:
        layer, part, kind = found.groups()
        return f"model.layers.{layer}.{_LAYER.get(part, part)}.{kind}"
    part, kind = name.removeprefix("encoder.").rsplit(".", 1)
    return f"{_OUTSIDE[part]}.{kind}"


def names(name: str, shapes: dict, params: dict) -> Optional[Group]:
    return Group((checkpoint_name(name),), (name,), same, same)


def extras(name: str, params: dict) -> Optional[Extra]:
    if name == "decoder.weight" and params["tie_word_embeddings"]:
        return Extra("model.embeddings.tok_embeddings.weight", "tie_word_embeddings is true")
    return None


FAMILY = Family("modernbert", "modernbert", "ModernBertForMaskedLM", read, 8192, write=write, keys=KEYS,
                common_keys=False, encoder_only=True,
                weights=WeightRules("modernbert", names, extras=extras, head="decoder.weight"))
