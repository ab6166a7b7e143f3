"""The Hugging Face families xspec imports and exports, one module each (`llama.py`, `qwen3.py`, ...).

`map_config(config)` picks the family by model_type alone and returns the spec to extend, the `set`
lines (each with the config key it came from), how the weights are stored, and what verification must
cover (the window, the positions past which rotary scaling acts). Every attribute of config.json is
taken by the family's `read`, set aside in `NOT_ARCHITECTURAL` or with its reason, or refused by name."""

from __future__ import annotations

from xspec.base.errors import UserError
from xspec.hf.config_reader import ConfigReader, refuse, render
from xspec.hf.families import (bamba, bart, bert, deepseek_v2, deepseek_v3, gemma2, gemma3, glm4_moe, gpt_oss, llama,
                               m2m_100, marian, mbart, mistral, mixtral, modernbert, mt5, nemotron_h, olmo2, phi3,
                               qwen2, qwen3, qwen3_moe, qwen3_next, roberta, t5, umt5)
from xspec.hf.families.family import Family, Mapped


__all__ = ["FAMILIES", "Family", "Mapped", "map_config"]

FAMILIES: dict[str, Family] = {module.FAMILY.model_type: module.FAMILY for module in (
    llama, mistral, qwen2, qwen3, gemma2, gemma3, olmo2, phi3, mixtral, qwen3_moe, gpt_oss, deepseek_v2, deepseek_v3,
    glm4_moe, bamba, qwen3_next, nemotron_h, marian, bart, mbart, m2m_100, t5, mt5, umt5, bert, roberta, modernbert)}
REFUSED_TYPES = {
    "gemma3": "a Gemma 3 checkpoint with its vision tower; xspec imports the text model (model_type gemma3_text)",
}


def map_config(config: dict, file: str = "config.json") -> Mapped:
    model_type = config.get("model_type")
    if not isinstance(model_type, (str, type(None))):
        raise UserError(f"{file}: model_type {render(model_type)} is not a string")
    if model_type in REFUSED_TYPES:
        raise UserError(f"{file}: model_type {render(model_type)} is not supported: {REFUSED_TYPES[model_type]}")
    if model_type not in FAMILIES:
        what = "no model_type" if model_type is None else f"model_type {render(model_type)}"
        refuse(what, list(FAMILIES), file)
    if config.get("auto_map") is not None:
        raise UserError(f"{file}: auto_map names remote code; xspec runs none (supported: transformers' own "
                        f"{FAMILIES[model_type].hf_class})")
    family = FAMILIES[model_type]
    cfg = ConfigReader(config, file)
    cfg.get("model_type")
    mapped = Mapped(family.spec, model_type, family.hf_class, family.weights, cfg.settings, cfg.notes,
                    cfg.number("max_position_embeddings", family.positions), config=config)
    family.read(cfg, mapped)
    cfg.finish(family.encoder_decoder)
    return mapped
