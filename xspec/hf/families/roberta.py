"""RoBERTa (RobertaForMaskedLM): BERT's layers and head, with positions counted from the padding id + 1 (the
rows before never read by a text) and its head under `lm_head`."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.bert import KEYS, encoder_rules, read_bert, write
from xspec.hf.families.family import Family, Mapped


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_bert(cfg, m, offset=cfg.number("pad_token_id", 1, least=0) + 1)


HEAD = {"transform.weight": "lm_head.dense.weight", "transform.bias": "lm_head.dense.bias",
        "transform_layer_norm.weight": "lm_head.layer_norm.weight",
        "transform_layer_norm.bias": "lm_head.layer_norm.bias",
        "lm_head.weight": "lm_head.decoder.weight", "lm_head.bias": "lm_head.bias",
        "pooler.weight": "classifier.dense.weight", "pooler.bias": "classifier.dense.bias",
        "classifier.weight": "classifier.out_proj.weight", "classifier.bias": "classifier.out_proj.bias"}

FAMILY = Family("roberta", "roberta", "RobertaForMaskedLM", read, 514, write=write, keys=KEYS,
                common_keys=False, encoder_only=True, weights=encoder_rules("roberta", "roberta.", HEAD))
