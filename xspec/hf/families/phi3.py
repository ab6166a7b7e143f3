"""Phi-3 (Phi3ForCausalLM): LLaMA's layers with rotary positions on a share of each head, and checkpoints
that store q, k, v (and gate, up) as fused matrices."""

from __future__ import annotations

import re

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import read_bias, read_common, read_head_dim, read_partial_rotary, refuse_window
from xspec.hf.weight_map import Group, WeightRules


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_common(cfg, tie_default=False, eps=1e-5)
    read_head_dim(cfg, None)
    read_bias(cfg, "attention_bias")
    refuse_window(cfg)
    read_partial_rotary(cfg, default=1.0)
    cfg.ignore("original_max_position_embeddings", "the context before long-rope scaling; rope_type default has none")


def fused(name: str, shapes: dict, params: dict) -> Group | None:
    """qkv_proj (Q, then K, then V rows) and gate_up_proj (gate, then up), the spec's separate matrices."""
    import torch  # here, not at the top: `xspec --help` lists the families without torch

    found = re.fullmatch(r"decoder\.layers\.(\d+)\.(self_attn\.[qkv]_proj|mlp\.(?:gate|up)_proj)\.weight", name)
    if found is None:
        return None
    layer = found[1]
    if found[2].startswith("self_attn"):
        ours = tuple(f"decoder.layers.{layer}.self_attn.{p}_proj.weight" for p in "qkv")
        rows = [shapes[n][0] for n in ours]
        return Group((f"model.layers.{layer}.self_attn.qkv_proj.weight",), ours,
                     lambda t: list(t[0].split(rows)), lambda t: [torch.cat(t)])
    ours = (f"decoder.layers.{layer}.mlp.gate_proj.weight", f"decoder.layers.{layer}.mlp.up_proj.weight")
    return Group((f"model.layers.{layer}.mlp.gate_up_proj.weight",), ours,
                 lambda t: list(t[0].chunk(2)), lambda t: [torch.cat(t)])


FAMILY = Family("phi3", "phi3", "Phi3ForCausalLM", read, 4096, keys={"partial_rotary_factor": "partial_rotary_factor"},
                weights=WeightRules("phi3", fused))
