"""BART (BartForConditionalGeneration): Marian's layers with GELU, learned positions after two rows no position
reads, and a layer norm of the embeddings on each side; source and target share one embedding. Checkpoints
written from BartModel hold no final_logits_bias, which transformers then takes as zeros, as the import does."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_seq2seq
from xspec.hf.hf_config import SEQ2SEQ_KEYS, write_seq2seq
from xspec.hf.weight_map import WeightRules, seq2seq, seq2seq_copies


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_seq2seq(cfg, m, activation="gelu", scale_embedding=False, normalize_embedding=True)
    cfg.put("share_encoder_decoder_embeddings", True, "model_type bart: one embedding, model.shared")


FAMILY = Family("bart", "bart", "BartForConditionalGeneration", read, 1024, write=write_seq2seq, encoder_decoder=True,
                common_keys=False, depth="decoder_layers", keys=SEQ2SEQ_KEYS,
                weights=WeightRules("bart", seq2seq, extras=seq2seq_copies, zeros=("final_logits_bias",)))
