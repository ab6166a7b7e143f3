"""mBART (MBartForConditionalGeneration, mBART-50's too): BART with pre-norm layers and a layer norm after each
side's last layer; embeddings scaled where the checkpoint says so. Its checkpoints are BART's."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_seq2seq
from xspec.hf.hf_config import SEQ2SEQ_KEYS, write_seq2seq
from xspec.hf.weight_map import WeightRules, seq2seq, seq2seq_copies


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_seq2seq(cfg, m, activation="gelu", scale_embedding=False, normalize_embedding=True, pre_norm=True)
    cfg.put("share_encoder_decoder_embeddings", True, "model_type mbart: one embedding, model.shared")


FAMILY = Family("mbart", "mbart", "MBartForConditionalGeneration", read, 1024, write=write_seq2seq,
                encoder_decoder=True, common_keys=False, depth="decoder_layers", keys=SEQ2SEQ_KEYS,
                weights=WeightRules("mbart", seq2seq, extras=seq2seq_copies, zeros=("final_logits_bias",)))
