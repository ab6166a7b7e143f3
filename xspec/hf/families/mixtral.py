"""Mixtral (MixtralForCausalLM): Mistral's layers with routed experts, stored one matrix per expert."""

from __future__ import annotations

from xspec.hf.config_reader import ConfigReader
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.mistral import read_mistral
from xspec.hf.families.readers import ZERO
from xspec.hf.weight_map import WeightRules, per_expert


def read(cfg: ConfigReader, m: Mapped) -> None:
    read_mistral(cfg, m, window=None, theta=1000000.0, eps=1e-5)
    cfg.map(cfg.spelling("num_experts", "num_local_experts"), "num_local_experts", 8)
    cfg.map("num_experts_per_tok", "num_experts_per_tok", 2)
    cfg.map("router_aux_loss_coef", "router_aux_loss_coef", 0.001, integer=False, least=0)
    cfg.expect("router_jitter_noise", ZERO, 0.0, " (jitter noise on the router is not in the spec)")


FAMILY = Family("mixtral", "mixtral", "MixtralForCausalLM", read, 131072,
                keys={"head_dim": "head_dim", "sliding_window": "sliding_window",
                      "num_local_experts": "num_local_experts", "num_experts_per_tok": "num_experts_per_tok",
                      "router_aux_loss_coef": "router_aux_loss_coef"},
                weights=WeightRules("mixtral", per_expert("block_sparse_moe", {"gate": "w1", "up": "w3", "down": "w2"},
                                                          "gate")))
