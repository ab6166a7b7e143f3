"""Marian (MarianMTModel): the paper's encoder-decoder, post-norm, with sinusoidal positions laid out as every
sine then every cosine, an activation of the checkpoint's choosing, one vocabulary for source and target whose
embedding the output projection shares, and a bias on the logits (`final_logits_bias`).

Its checkpoints hold the shared embedding once (`model.shared.weight`), some also the encoder's and the
decoder's copies of it and the positions' tables (checked against what the spec computes, not read), and
call attention's W^O `out_proj`."""

from __future__ import annotations

import re
from typing import Any, Optional

from xspec.base.errors import UserError
from xspec.compiler.limits import MAX_REPEAT
from xspec.hf.config_reader import ConfigReader, refuse, render
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import ZERO
from xspec.hf.weight_map import Extra, Group, WeightRules, same

# activation_function -> the spec's `activation` (transformers' ACT2FN: "swish" is SiLU)
ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu"}
SIDES = ("encoder", "decoder")


def read(cfg: ConfigReader, m: Mapped) -> None:
    vocab = cfg.map("vocab_size", "vocab")
    decoder_vocab = cfg.get("decoder_vocab_size", None)
    if decoder_vocab not in (None, vocab):
        raise UserError(f"{cfg.file}: decoder_vocab_size {render(decoder_vocab)} differs from vocab_size {vocab}: "
                        "a target vocabulary of its own is not supported (supported: null, or vocab_size)")
    cfg.map(cfg.spelling("d_model", "hidden_size"), "d_model")
    for side in SIDES:
        layers = cfg.spelling("encoder_layers", "num_hidden_layers") if side == "encoder" else "decoder_layers"
        heads = cfg.spelling("encoder_attention_heads", "num_attention_heads") if side == "encoder" \
            else "decoder_attention_heads"
        cfg.map(layers, f"{side}_layers", most=MAX_REPEAT)
        cfg.map(heads, f"{side}_attention_heads")
        cfg.map(f"{side}_ffn_dim", f"{side}_ffn_dim")
        cfg.expect(f"{side}_layerdrop", ZERO, 0.0, " (LayerDrop skips whole layers in training; xspec has none)")
    activation = cfg.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        refuse(f"activation_function {render(activation)}", list(ACTIVATIONS), cfg.file)
    cfg.put("activation", ACTIVATIONS[activation], "activation_function")
    for key, default in (("dropout", 0.1), ("attention_dropout", 0.0), ("activation_dropout", 0.0)):
        cfg.map(key, key, default, integer=False, least=0)
    cfg.put("max_len", m.max_positions, "max_position_embeddings")
    for key, default in (("scale_embedding", False), ("share_encoder_decoder_embeddings", True),
                         ("tie_word_embeddings", True)):
        cfg.put(key, cfg.flag(key, default), key)
    # What configs written for BART-era versions carry: each only at the value Marian computes.
    for key, value in (("normalize_before", False), ("normalize_embedding", False), ("add_final_layer_norm", False),
                       ("add_bias_logits", False), ("static_position_embeddings", True), ("is_decoder", False)):
        cfg.expect(key, [value], value)
    cfg.ignore("extra_pos_embeddings", "a count BART-era configs carried; Marian's positions read "
                                       "max_position_embeddings")
    for key in ("classif_dropout", "classifier_dropout"):
        cfg.ignore(key, "the dropout of a classification head; a translation model has none")
    cfg.ignore("gradient_checkpointing", "whether transformers recomputes activations in training")
    cfg.ignore("init_std", "how a new model is initialised; an import starts from the weights")
    cfg.ignore("decoder_start_token_id", "the token every output starts from: a generation setting")


def write(params: dict[str, Any], config: dict[str, Any]) -> None:
    config["activation_function"] = "swish" if params["activation"] == "silu" else params["activation"]
    config["decoder_vocab_size"] = params["vocab"]
    config["is_encoder_decoder"] = True


def packing(name: str, shapes: dict, params: dict) -> Optional[Group]:
    """Every tensor under `model.` but the output head's, attention's W^O as `out_proj`, the shared embedding
    as `model.shared`, and the output projection's bias as final_logits_bias [1, vocab]."""
    if name == "decoder.lm_head.bias":
        return Group(("final_logits_bias",), (name,), lambda t: [t[0].reshape(-1)], lambda t: [t[0].reshape(1, -1)])
    if name == "decoder.lm_head.weight":
        return Group(("lm_head.weight",), (name,), same, same)
    if name == "encoder.embed_tokens.weight" and params["share_encoder_decoder_embeddings"]:
        return Group(("model.shared.weight",), (name,), same, same)
    return Group(("model." + re.sub(r"\.o_proj\.", ".out_proj.", name),), (name,), same, same)


def extras(name: str, params: dict) -> Optional[Extra]:
    shared = "model.shared.weight" if params["share_encoder_decoder_embeddings"] else None
    if re.fullmatch(r"model\.(encoder|decoder)\.embed_positions\.weight", name):
        return Extra(None, "the sinusoidal positions Marian computes (every sine, then every cosine)", _positions)
    if shared and name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        return Extra(shared, "share_encoder_decoder_embeddings is true")
    if name == "lm_head.weight" and params["tie_word_embeddings"]:
        return Extra(shared or "model.decoder.embed_tokens.weight", "tie_word_embeddings is true")
    return None


def _positions(shape: tuple[int, ...]):
    from xspec.nn import SinusoidalPositionsInHalves   # here: `xspec --help` lists the families without torch

    return SinusoidalPositionsInHalves.sinusoids(*shape)


FAMILY = Family("marian", "marian", "MarianMTModel", read, 1024, write=write, encoder_decoder=True,
                keys={"vocab": "vocab_size", "d_model": "d_model", "activation_dropout": "activation_dropout",
                      "attention_dropout": "attention_dropout", "dropout": "dropout",
                      "scale_embedding": "scale_embedding", "tie_word_embeddings": "tie_word_embeddings",
                      "share_encoder_decoder_embeddings": "share_encoder_decoder_embeddings",
                      **{f"{side}_{key}": f"{side}_{key}" for side in SIDES
                         for key in ("layers", "attention_heads", "ffn_dim")}},
                weights=WeightRules("marian", packing, prefix="model.", extras=extras))
