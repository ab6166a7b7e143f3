"""Marian (MarianMTModel): the paper's encoder-decoder, post-norm, with sinusoidal positions laid out as every
sine then every cosine, an activation of the checkpoint's choosing, one vocabulary for source and target (or,
where the embeddings are not shared, a target vocabulary of its own: decoder_vocab_size) whose embedding the
output projection shares, and a bias on the logits (`final_logits_bias`).

Its checkpoints are BART's (weight_map.seq2seq), some also holding the positions' tables, which are checked
against what the spec computes and not read."""

from __future__ import annotations

from typing import Any

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Kin, Mapped
from xspec.hf.families.readers import read_seq2seq
from xspec.hf.hf_config import SEQ2SEQ_KEYS, write_seq2seq
from xspec.hf.weight_map import WeightRules, seq2seq, seq2seq_with_positions


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_seq2seq(cfg, m, activation="gelu", scale_embedding=False, normalize_embedding=False, target_vocabulary=True)
    shared = cfg.flag("share_encoder_decoder_embeddings", True)
    cfg.put("share_encoder_decoder_embeddings", shared, "share_encoder_decoder_embeddings")
    if shared:      # one embedding of vocab_size rows for both sides, as MarianMTModel builds it
        cfg.ignore("decoder_vocab_size", "the target's vocabulary size where the sides have embeddings of their "
                                         "own; share_encoder_decoder_embeddings is true")
    elif cfg.get("decoder_vocab_size", None) is None:
        cfg.put("decoder_vocab_size", cfg.number("vocab_size"), "vocab_size (decoder_vocab_size is null)")
    else:
        cfg.map("decoder_vocab_size", "decoder_vocab_size")
    cfg.expect("static_position_embeddings", [True], True)


def write(params: dict[str, Any], config: dict[str, Any]) -> None:
    write_seq2seq(params, config)
    config["decoder_vocab_size"] = params["decoder_vocab_size"]


def _positions(shape: tuple[int, ...]):
    from xspec.nn import SinusoidalPositionsInHalves   # here: `xspec --help` lists the families without torch

    return SinusoidalPositionsInHalves.sinusoids(*shape)


def _from_paper(params: dict[str, Any]) -> dict[str, Any] | None:
    """The paper's Transformer (specs/base.xspec and its kin) under Marian's names: one size for both sides,
    ReLU, embeddings scaled by sqrt(d_model), and one vocabulary whose embedding all three share where
    tie_embeddings (§3.4). None for a spec that names its parameters otherwise."""
    if not {"d_ff", "heads", "layers", "tie_embeddings"} <= params.keys() or "encoder_ffn_dim" in params:
        return None
    tied = params["tie_embeddings"]
    sides = {f"{side}_{key}": params[ours] for side in ("encoder", "decoder")
             for key, ours in (("layers", "layers"), ("attention_heads", "heads"), ("ffn_dim", "d_ff"))}
    return {"vocab": params["vocab"], "decoder_vocab_size": params["vocab"], "d_model": params["d_model"], **sides,
            "activation_function": "relu", "dropout": params["dropout"], "attention_dropout": 0.0,
            "activation_dropout": 0.0, "max_len": params["max_len"], "scale_embedding": True,
            "share_encoder_decoder_embeddings": tied, "tie_word_embeddings": tied,
            "label_smoothing": params.get("label_smoothing", 0.1)}


# Marian's tensors that read the model's features (their columns) and those that write them (their rows), by
# their last two names; the norms and embeddings hold them along their last axis.
_READ, _WRITTEN = ("q_proj", "k_proj", "v_proj", "fc1", "lm_head"), ("o_proj", "fc2")


def _feature_axes(name: str) -> tuple[int, ...]:
    """The axes of Marian's tensor `name` that hold the model's features (d_model)."""
    module, kind = name.rsplit(".", 2)[-2:]
    if module in _READ:
        return (1,) if kind == "weight" else ()
    if module in _WRITTEN or module.endswith("layer_norm"):
        return (0,)
    return (1,) if module == "embed_tokens" else ()


FAMILY = Family("marian", "marian", "MarianMTModel", read, 1024, write=write, encoder_decoder=True, common_keys=False,
                depth="decoder_layers",
                keys={**SEQ2SEQ_KEYS, "share_encoder_decoder_embeddings": "share_encoder_decoder_embeddings",
                      "decoder_vocab_size": "decoder_vocab_size"},
                weights=WeightRules("marian", seq2seq, extras=seq2seq_with_positions(
                    "embed_positions.weight", "the sinusoidal positions Marian computes (every sine, then every "
                    "cosine)", _positions)),
                # the paper's sines and cosines alternate: the same encodings, each model feature elsewhere
                kin=Kin(_from_paper, {"interleaved": "halves"}, _feature_axes))
