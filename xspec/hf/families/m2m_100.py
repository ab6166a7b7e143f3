"""M2M100 and NLLB-200 (M2M100ForConditionalGeneration): mBART's pre-norm layers with ReLU, scaled embeddings,
fairseq's sinusoidal positions from the padding id + 1, and an output projection without a bias. Its
checkpoints are BART's but for final_logits_bias, which it has none of."""

from __future__ import annotations

from typing import Any

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_seq2seq
from xspec.hf.hf_config import SEQ2SEQ_KEYS, write_seq2seq
from xspec.hf.weight_map import WeightRules, seq2seq, seq2seq_with_positions


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_seq2seq(cfg, m, activation="relu", scale_embedding=True, normalize_embedding=False, pre_norm=True)
    cfg.put("share_encoder_decoder_embeddings", True, "model_type m2m_100: one embedding, model.shared")
    # The positions' table starts at the padding id + 1 (transformers reads the first position's row so).
    cfg.put("position_offset", cfg.number("pad_token_id", 1, least=0) + 1, "pad_token_id + 1")


def _positions(shape: tuple[int, ...]):
    from xspec.nn import FairseqSinusoidalPositions   # here: `xspec --help` lists the families without torch

    return FairseqSinusoidalPositions.sinusoids(*shape)


def write(params: dict[str, Any], config: dict[str, Any]) -> None:
    write_seq2seq(params, config)
    config["pad_token_id"] = params["position_offset"] - 1   # where the positions' table starts


FAMILY = Family("m2m_100", "m2m_100", "M2M100ForConditionalGeneration", read, 1024, write=write,
                encoder_decoder=True, common_keys=False, depth="decoder_layers", keys=SEQ2SEQ_KEYS,
                weights=WeightRules("m2m_100", seq2seq, extras=seq2seq_with_positions(
                    "embed_positions.weights", "the sinusoidal positions fairseq computes", _positions)))
