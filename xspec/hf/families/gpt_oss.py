"""gpt-oss (GptOssForCausalLM): attention with sinks, sliding and full layers alternating, YaRN, and
experts with a clamped SwiGLU whose checkpoint interleaves gate and up."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from xspec.base.errors import UserError
from xspec.hf.config_reader import ConfigReader, render
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_common, read_head_dim, read_layer_types, read_window, refuse_quantized
from xspec.hf.hf_config import layer_types
from xspec.hf.rope import read_rope
from xspec.hf.weight_map import Group, WeightRules

if TYPE_CHECKING:
    import torch


# gpt-oss's rotary settings where config.json gives none (its config class's).
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def read(cfg: ConfigReader, m: Mapped) -> None:
    refuse_quantized(cfg)
    read_common(cfg, tie_default=False, eps=1e-5, kv_heads=8)
    read_head_dim(cfg, "head_dim", default=64)
    cfg.expect("attention_bias", [True], True, " (gpt-oss has biases on every attention projection)")
    m.window = read_window(cfg, 128)
    cfg.map(cfg.spelling("num_experts", "num_local_experts"), "num_local_experts", 128)
    cfg.map("num_experts_per_tok", "num_experts_per_tok", 4)
    cfg.ignore("experts_per_token", "another spelling of num_experts_per_tok, which transformers reads instead")
    cfg.map("swiglu_limit", "swiglu_limit", 7.0, integer=False, least=1e-9)
    cfg.map("swiglu_alpha", "swiglu_alpha", 1.702, integer=False, least=1e-9)
    cfg.map("router_aux_loss_coef", "router_aux_loss_coef", 0.001, integer=False, least=0)
    cfg.ignore("initial_context_length", "the context of pretraining; YaRN's original_max_position_embeddings is used")
    given = cfg.config.get("rope_scaling") is not None or cfg.config.get("rope_parameters") is not None
    rope = read_rope(cfg, ("yarn",), default_theta=150000.0, default=None if given else GPT_OSS_ROPE)
    cfg.put("rope_theta", rope["rope_theta"], rope.source("rope_theta"))
    truncate = rope.get("truncate", True)
    if truncate is not False:
        raise UserError(f"{cfg.file}: {rope.where}.truncate {render(truncate)} is not supported (supported: false)")
    for param, key in (("rope_scaling_factor", "factor"), ("original_max_position_embeddings",
                                                           "original_max_position_embeddings"),
                       ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow")):
        cfg.put(param, rope.get(key, {"beta_fast": 32.0, "beta_slow": 1.0}.get(key)), rope.source(key))
    m.scaled_from = rope["original_max_position_embeddings"]
    read_layer_types(cfg)


def write(params: dict, config: dict) -> None:
    config["layer_types"] = layer_types(params)
    config["attention_bias"] = True
    config["rope_scaling"] = {"rope_type": "yarn", "factor": params["rope_scaling_factor"],
                              "beta_fast": params["beta_fast"], "beta_slow": params["beta_slow"],
                              "original_max_position_embeddings": params["original_max_position_embeddings"],
                              "truncate": False}


def experts(name: str, shapes: dict, params: dict) -> Group | None:
    """The experts' gate_up_proj as the checkpoint keeps it: [E, d, 2 f], gate and up interleaved (even, odd
    columns) and multiplied from the left, where the spec's is [E, 2 f, d], gate's rows then up's (its bias
    likewise); down_proj multiplied from the left. The router is stored as it is."""

    found = re.fullmatch(r"decoder\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|gate_up_proj_bias|down_proj)", name)
    if found is None:
        return None
    hf = (f"model.layers.{found[1]}.mlp.experts.{found[2]}",)
    if found[2] == "gate_up_proj":
        return Group(hf, (name,), lambda t: [_halves(t[0]).transpose(1, 2)],
                     lambda t: [_interleaved(t[0].transpose(1, 2))])
    if found[2] == "gate_up_proj_bias":
        return Group(hf, (name,), lambda t: [_halves(t[0])], lambda t: [_interleaved(t[0])])
    return Group(hf, (name,), lambda t: [t[0].transpose(1, 2)], lambda t: [t[0].transpose(1, 2)])


def _halves(interleaved: "torch.Tensor") -> "torch.Tensor":
    """Columns gate, up, gate, up, ... as all of gate's, then all of up's."""
    import torch

    return torch.cat([interleaved[..., ::2], interleaved[..., 1::2]], dim=-1)


def _interleaved(halves: "torch.Tensor") -> "torch.Tensor":
    import torch

    return torch.stack(halves.chunk(2, dim=-1), dim=-1).flatten(-2)


FAMILY = Family("gpt_oss", "gpt_oss", "GptOssForCausalLM", read, 131072,
                keys={"head_dim": "head_dim", "sliding_window": "sliding_window",
                      "num_local_experts": "num_local_experts", "num_experts_per_tok": "num_experts_per_tok",
                      "swiglu_limit": "swiglu_limit", "router_aux_loss_coef": "router_aux_loss_coef"},
                write=write, weights=WeightRules("gpt_oss", experts))
