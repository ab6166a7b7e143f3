"""A spec's parameters as the config.json of its family's transformers class: the inverse of each family's
`read` (xspec/hf/families/), in the rope_theta + rope_scaling spelling that every transformers version
reads. What every family writes is here; each family's own keys are its module's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xspec.hf.families.family import Family

COMMON = {"vocab": "vocab_size", "d_model": "hidden_size", "layers": "num_hidden_layers",
          "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "d_ff": "intermediate_size",
          "rms_norm_eps": "rms_norm_eps", "tie_word_embeddings": "tie_word_embeddings", "rope_theta": "rope_theta"}

# What the encoder-decoder families (BART's descendants) write back as they are, in place of COMMON.
SEQ2SEQ_KEYS = {"vocab": "vocab_size", "d_model": "d_model", "activation_dropout": "activation_dropout",
                "attention_dropout": "attention_dropout", "dropout": "dropout", "scale_embedding": "scale_embedding",
                "tie_word_embeddings": "tie_word_embeddings",
                **{f"{side}_{key}": f"{side}_{key}" for side in ("encoder", "decoder")
                   for key in ("layers", "attention_heads", "ffn_dim")}}


def write_seq2seq(params: dict[str, Any], config: dict[str, Any]) -> None:
    """What the encoder-decoder families write alike beyond SEQ2SEQ_KEYS."""
    activation = params["activation_function"]
    config["activation_function"] = "swish" if activation == "silu" else activation
    config["is_encoder_decoder"] = True


def config_for(family: Family, params: dict[str, Any], max_positions: int, bos_id: int | None,
               eos_ids: list[int]) -> dict[str, Any]:
    config: dict[str, Any] = {"architectures": [family.hf_class], "model_type": family.model_type,
                              "max_position_embeddings": max_positions,
                              "bos_token_id": bos_id,
                              "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids or None,
                              # padding is never attended to; null keeps a class default (Phi-3's 32000) from
                              # naming a row past a small vocabulary
                              "pad_token_id": None}
    for param, key in (COMMON if family.common_keys else {}).items():
        config[key] = params[param]
    for param, key in family.keys.items():
        config[key] = params[param]
    if family.common_keys:
        config["hidden_act"] = "silu"
    family.write(params, config)
    return config


def layer_types(params: dict[str, Any], key: str = "layer_types") -> list[str]:
    """Each layer's kind (the parameter `key` lists them), as the spec's layers read it by their index."""
    return list(params[key][:params["layers"]])


def own_head_dim(params: dict[str, Any], config: dict[str, Any]) -> None:
    """head_dim where the heads' size is not hidden_size / num_attention_heads."""
    if params["d_k"] != params["d_model"] // params["heads"]:
        config["head_dim"] = params["d_k"]


def sparse_layers(params: dict[str, Any], config: dict[str, Any]) -> None:
    """Qwen's layers with experts: decoder_sparse_step's, less mlp_only_layers."""
    sparse, step = params["sparse_layers"], params["decoder_sparse_step"]
    if any(sparse[i] != ((i + 1) % step == 0) for i in range(params["layers"])):
        config["decoder_sparse_step"] = 1
    config["mlp_only_layers"] = [i for i in range(params["layers"])
                                 if not sparse[i] and (i + 1) % config["decoder_sparse_step"] == 0]


def qwen_windows(params: dict[str, Any], config: dict[str, Any], *, kinds: bool = True) -> None:
    """Qwen's sliding windows: the window with use_sliding_window, and each layer's kind (`kinds`), which
    slides with use_sliding_window alone, in transformers as here."""
    config["sliding_window"] = params["sliding_window"] if params["use_sliding_window"] else None
    if kinds:
        config["layer_types"] = [kind if params["use_sliding_window"] else "full_attention"
                                 for kind in layer_types(params)]
