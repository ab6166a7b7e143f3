"""BERT (BertForMaskedLM), and what RoBERTa reads alike: the paper's encoder alone, post-norm, with learned
positions, a token type embedding, a layer norm of the embeddings, and the masked-LM head (a dense layer, the
activation and a layer norm, then the output projection tied to the word embedding, with a bias of its own).

Checkpoints written from BertForPreTraining (the Hub's bert-base-*) also hold the pooler and the next-sentence
head, which BertForMaskedLM does not read and the import sets aside, as transformers does."""

from __future__ import annotations

import re
from typing import Any, Optional

from xspec.base.errors import UserError
from xspec.compiler.limits import MAX_REPEAT
from xspec.hf.config_reader import ConfigReader, refuse, render
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import ACTIVATIONS, WRITTEN_ACTIVATIONS, read_classifier, write_classifier
from xspec.hf.weight_map import Extra, Group, WeightRules, same


# The sequence classifier of each family, which config.json's architectures names where the checkpoint is one.
CLASSIFIERS = {"bert": "BertForSequenceClassification", "roberta": "RobertaForSequenceClassification"}


def read_bert(cfg: ConfigReader, m: Mapped, *, offset: int) -> None:
    """BertConfig's keys; `offset`: the rows of the positions' table before the first position's."""
    cfg.map("vocab_size", "vocab")
    cfg.map("hidden_size", "d_model")
    cfg.map("num_hidden_layers", "layers", most=MAX_REPEAT)
    cfg.map("num_attention_heads", "heads")
    cfg.map("intermediate_size", "d_ff")
    if m.max_positions <= offset:
        raise UserError(f"{cfg.file}: max_position_embeddings {m.max_positions} leaves no position after the "
                        f"{offset} rows before the first")
    m.max_positions -= offset       # the positions a text may fill
    cfg.put("max_len", m.max_positions, "max_position_embeddings" + (f" - {offset}" if offset else ""))
    cfg.put("position_offset", offset, "pad_token_id + 1" if offset else f"model_type {m.model_type}")
    cfg.map("type_vocab_size", "type_vocab_size", 2)
    cfg.map("layer_norm_eps", "layer_norm_eps", 1e-12, integer=False, least=0)
    activation = cfg.get("hidden_act", "gelu")
    if activation not in ACTIVATIONS:
        refuse(f"hidden_act {render(activation)}", list(ACTIVATIONS), cfg.file)
    cfg.put("hidden_act", ACTIVATIONS[activation], "hidden_act")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        cfg.map(key, key, 0.1, integer=False, least=0)
    cfg.put("tie_word_embeddings", cfg.flag("tie_word_embeddings", True), "tie_word_embeddings")
    cfg.expect("position_embedding_type", ["absolute"], "absolute")
    for key in ("is_decoder", "add_cross_attention"):
        cfg.expect(key, [False], False)
    cfg.ignore("gradient_checkpointing", "whether transformers recomputes activations in training")
    _read_head(cfg, m)


def _read_head(cfg: ConfigReader, m: Mapped) -> None:
    """The masked-LM head, or, where architectures names the family's sequence classifier, its classifier
    (readers.read_classifier) with its dropout (hidden_dropout_prob where classifier_dropout is null)."""
    if not read_classifier(cfg, m, CLASSIFIERS[m.model_type]):
        cfg.ignore("classifier_dropout", "the dropout of a classification head; the masked-LM head has none")
        return
    dropout = cfg.get("classifier_dropout", None)
    cfg.put("classifier_dropout", dropout if dropout is not None else cfg.config.get("hidden_dropout_prob", 0.1),
            "classifier_dropout" if dropout is not None else "hidden_dropout_prob (classifier_dropout null)")


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_bert(cfg, m, offset=0)


def write(params: dict[str, Any], config: dict[str, Any]) -> None:
    config["hidden_act"] = WRITTEN_ACTIVATIONS[params["hidden_act"]]
    config["max_position_embeddings"] = params["max_len"] + params["position_offset"]
    config["pad_token_id"] = max(params["position_offset"] - 1, 0)
    write_classifier(params, config, CLASSIFIERS[config["model_type"]])


KEYS = {"vocab": "vocab_size", "d_model": "hidden_size", "layers": "num_hidden_layers",
        "heads": "num_attention_heads", "d_ff": "intermediate_size", "type_vocab_size": "type_vocab_size",
        "layer_norm_eps": "layer_norm_eps", "hidden_dropout_prob": "hidden_dropout_prob",
        "attention_probs_dropout_prob": "attention_probs_dropout_prob", "tie_word_embeddings": "tie_word_embeddings"}

# The spec's names -> the checkpoint's, under the encoder's top-level module (`bert.`, `roberta.`).
_EMBEDDINGS = {"word_embeddings": "embeddings.word_embeddings", "position_embeddings": "embeddings.position_embeddings",
               "token_type_embeddings": "embeddings.token_type_embeddings",
               "embeddings_layer_norm": "embeddings.LayerNorm"}
_LAYER = {"attention.q_proj": "attention.self.query", "attention.k_proj": "attention.self.key",
          "attention.v_proj": "attention.self.value", "attention.o_proj": "attention.output.dense",
          "attention_layer_norm": "attention.output.LayerNorm", "intermediate": "intermediate.dense",
          "output": "output.dense", "output_layer_norm": "output.LayerNorm"}
_IN_LAYER = re.compile(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)")


def encoder_rules(name: str, prefix: str, head: dict[str, str]) -> WeightRules:
    """A BERT-like family's rules: the encoder under `prefix`, the heads' parts as `head` names them (the
    masked LM's transform, transform_layer_norm, projection and its bias; a classifier's pooler and
    classifier)."""

    projection, bias = head["lm_head.weight"], head["lm_head.bias"]
    pooler = head["pooler.weight"].removesuffix(".weight")
    # Untied, transformers' projection keeps a bias of its own, which its forward adds (the head's is unused).
    own_bias = projection.removesuffix("weight") + "bias"

    def checkpoint_name(tensor: str, params: dict) -> str:
        if tensor == "encoder.lm_head.bias" and not params["tie_word_embeddings"]:
            return own_bias
        found = _IN_LAYER.fullmatch(tensor)
        if found is not None:
            layer, part, kind = found.groups()
            return f"{prefix}encoder.layer.{layer}.{_LAYER[part]}.{kind}"
        part, kind = tensor.removeprefix("encoder.").rsplit(".", 1)
        if part in _EMBEDDINGS:
            return f"{prefix}{_EMBEDDINGS[part]}.{kind}"
        return head[f"{part}.{kind}"]

    def names(tensor: str, shapes: dict, params: dict) -> Optional[Group]:
        return Group((checkpoint_name(tensor, params),), (tensor,), same, same)

    unused = re.compile(rf"{re.escape(prefix)}pooler\..+|cls\.seq_relationship\..+|{re.escape(prefix)}embeddings\."
                        r"position_ids")

    def extras(tensor: str, params: dict) -> Optional[Extra]:
        if tensor == projection and params["tie_word_embeddings"]:
            return Extra(f"{prefix}embeddings.word_embeddings.weight", "tie_word_embeddings is true")
        if tensor == own_bias and params["tie_word_embeddings"]:
            return Extra(bias, "the output projection's bias is the head's")
        if tensor == bias and not params["tie_word_embeddings"]:
            return Extra(None, "the head's bias, which an untied output projection does not read (it adds "
                               f"{own_bias})", unused=True)
        if unused.fullmatch(tensor) and not (params["num_labels"] and tensor.startswith(pooler)):
            return Extra(None, "the pooler, the next-sentence head and the position ids, which the masked-LM "
                               "class does not read", unused=True)
        return None

    return WeightRules(name, names, prefix=prefix, extras=extras, head=projection)


HEAD = {"transform.weight": "cls.predictions.transform.dense.weight",
        "transform.bias": "cls.predictions.transform.dense.bias",
        "transform_layer_norm.weight": "cls.predictions.transform.LayerNorm.weight",
        "transform_layer_norm.bias": "cls.predictions.transform.LayerNorm.bias",
        "lm_head.weight": "cls.predictions.decoder.weight", "lm_head.bias": "cls.predictions.bias",
        "pooler.weight": "bert.pooler.dense.weight", "pooler.bias": "bert.pooler.dense.bias",
        "classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"}

FAMILY = Family("bert", "bert", "BertForMaskedLM", read, 512, write=write, keys=KEYS, common_keys=False,
                encoder_only=True, weights=encoder_rules("bert", "bert.", HEAD))

