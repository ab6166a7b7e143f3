"""Gemma 3's text model (Gemma3ForCausalLM, model_type gemma3_text): Gemma 2's layers with QK-norm in
place of soft-capping, five local layers to a global one, a rotary base of each kind's own."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.gemma2 import read_gemma_common
from xspec.hf.families.gemma2 import write as write_gemma2
from xspec.hf.families.readers import read_layer_types
from xspec.hf.rope import read_gemma3_rope


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_gemma_common(cfg, m, final_softcap=None)
    cfg.expect("attn_logit_softcapping", [None], None, " (Gemma 3 uses QK-norm)")
    pattern = cfg.number("sliding_window_pattern", 6)
    cfg.put("sliding_window_pattern", pattern, "sliding_window_pattern" if cfg.has("sliding_window_pattern") else
            "sliding_window_pattern (default)")
    cfg.ignore("_sliding_window_pattern", "transformers derives the layers from sliding_window_pattern (6 where "
                                          "absent) and layer_types, not from this")
    read_layer_types(cfg)
    local = read_gemma3_rope(cfg, "sliding_attention", ("default",))
    cfg.put("rope_local_base_freq", local["rope_theta"], local.source("rope_theta"))
    rope = read_gemma3_rope(cfg, "full_attention", ("default", "linear"))
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))
    cfg.put("rope_scaling_factor", float(rope.get("factor", 1.0)),
            rope.source("factor") if "factor" in rope else f"{rope.where}.rope_type \"default\": factor 1")


def write(params: dict, config: dict) -> None:
    write_gemma2(params, config)
    factor = params["rope_scaling_factor"]
    config["rope_scaling"] = {"rope_type": "linear", "factor": factor} if factor != 1.0 else None


FAMILY = Family("gemma3_text", "gemma3", "Gemma3ForCausalLM", read, 131072,
                keys={"head_dim": "head_dim", "attention_bias": "attention_bias", "sliding_window": "sliding_window",
                      "query_pre_attn_scalar": "query_pre_attn_scalar",
                      "sliding_window_pattern": "sliding_window_pattern",
                      "rope_local_base_freq": "rope_local_base_freq"},
                write=write)
