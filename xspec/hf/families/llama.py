"""LLaMA (LlamaForCausalLM), and Llama 3.1's scaled rotary frequencies (specs/modern/llama3.xspec)."""

from __future__ import annotations

from xspec.base.errors import UserError
from xspec.hf.config_reader import ConfigReader, render
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_bias, read_common, read_head_dim, refuse_window
from xspec.hf.hf_config import own_head_dim
from xspec.hf.rope import read_rope


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_common(cfg, tie_default=False)
    read_head_dim(cfg, None)
    read_bias(cfg, "attention_bias")
    read_bias(cfg, "mlp_bias")
    refuse_window(cfg)
    rope = read_rope(cfg, ("default", "linear", "llama3", "yarn"))
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))
    if rope["rope_type"] == "default":
        cfg.ignore("original_max_position_embeddings", "the context before a rotary scaling; none is declared")
        return
    m.spec = "llama3"        # the spec whose layers scale the rotary frequencies
    cfg.put("rope_type", rope["rope_type"], rope.source("rope_type"))
    cfg.put("rope_factor", float(rope["factor"]), rope.source("factor"))
    if rope["rope_type"] == "linear":
        cfg.ignore("original_max_position_embeddings", "linear scaling divides every frequency alike: the "
                                                       "original context changes nothing")
        return
    cfg.put("original_max_position_embeddings", rope["original_max_position_embeddings"],
            rope.source("original_max_position_embeddings"))
    m.scaled_from = rope["original_max_position_embeddings"]
    if rope["rope_type"] == "llama3":
        for name in ("low_freq_factor", "high_freq_factor"):
            if name not in rope:
                raise UserError(f"{cfg.file}: {rope.where} has rope_type \"llama3\" but no {name}")
            cfg.put(name, float(rope[name]), rope.source(name))
        return
    for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        cfg.put(name, float(rope.get(name, default)), rope.source(name) if name in rope else f"{name} (default)")
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        raise UserError(f"{cfg.file}: {rope.where}.truncate {render(truncate)} is not true or false")
    cfg.put("rope_truncate", truncate, rope.source("truncate") if "truncate" in rope else "truncate (default)")


def write(params: dict, config: dict) -> None:
    own_head_dim(params, config)
    if "rope_type" in params:
        config["rope_scaling"] = _scaling(params)


def _scaling(params: dict) -> dict:
    kind = params["rope_type"]
    scaling: dict = {"rope_type": kind, "factor": params["rope_factor"]}
    if kind in ("llama3", "yarn"):
        scaling["original_max_position_embeddings"] = params["original_max_position_embeddings"]
    if kind == "llama3":
        scaling |= {"low_freq_factor": params["low_freq_factor"], "high_freq_factor": params["high_freq_factor"]}
    if kind == "yarn":
        scaling |= {"beta_fast": params["beta_fast"], "beta_slow": params["beta_slow"],
                    "truncate": params["rope_truncate"]}
    return scaling


FAMILY = Family("llama", "llama", "LlamaForCausalLM", read, 2048,
                keys={"attention_bias": "attention_bias", "mlp_bias": "mlp_bias"}, write=write)
