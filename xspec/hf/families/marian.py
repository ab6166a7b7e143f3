"""Marian (MarianMTModel): the paper's encoder-decoder, post-norm, with sinusoidal positions laid out as every
sine then every cosine, an activation of the checkpoint's choosing, one vocabulary for source and target (or,
where the embeddings are not shared, a target vocabulary of its own: decoder_vocab_size) whose embedding the
output projection shares, and a bias on the logits (`final_logits_bias`).

Its checkpoints are BART's (weight_map.seq2seq), some also holding the positions' tables, which are checked
against what the spec computes and not read."""

from __future__ import annotations

from typing import Any

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
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


FAMILY = Family("marian", "marian", "MarianMTModel", read, 1024, write=write, encoder_decoder=True, common_keys=False,
                depth="decoder_layers",
                keys={**SEQ2SEQ_KEYS, "share_encoder_decoder_embeddings": "share_encoder_decoder_embeddings",
                      "decoder_vocab_size": "decoder_vocab_size"},
                weights=WeightRules("marian", seq2seq, extras=seq2seq_with_positions(
                    "embed_positions.weight", "the sinusoidal positions Marian computes (every sine, then every "
                    "cosine)", _positions)))
