"""Bamba (BambaForCausalLM): LLaMA's layers whose mixer is Mamba-2's, or attention at attn_layer_indices."""

from __future__ import annotations

from xspec.base.errors import UserError
from xspec.hf.config_reader import ConfigReader, render
from xspec.hf.families.family import Family, Mapped
from xspec.hf.families.readers import INFINITY, read_bias, read_common, read_head_dim, read_partial_rotary
from xspec.hf.hf_config import layer_types, own_head_dim


def read(cfg: ConfigReader, m: Mapped) -> None:
    """Bamba: LLaMA's layers whose mixer is Mamba-2's state space, or at attn_layer_indices grouped-query
    attention with rotary positions on half of each head (transformers fixes the half)."""
    read_common(cfg, tie_default=False, eps=1e-5, kv_heads=8)
    read_head_dim(cfg, None)
    for key in ("attention_bias", "mlp_bias"):
        read_bias(cfg, key)
    layers = cfg.config["num_hidden_layers"]
    indices = cfg.get("attn_layer_indices", None)
    indices = [] if indices is None else indices
    if not isinstance(indices, list) or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in indices):
        raise UserError(f"{cfg.file}: attn_layer_indices is not a list of layer numbers")
    if any(i >= layers for i in indices):
        cfg.notes["attn_layer_indices"] = f"numbers from num_hidden_layers ({layers}) on name no layer; transformers " \
                                          "drops them"
    cfg.put("layer_types", ["full_attention" if i in indices else "linear_attention" for i in range(layers)],
            "attn_layer_indices")
    read_partial_rotary(cfg, default=0.5, top_level=False)
    cfg.ignore("partial_rotary_factor", "transformers' Bamba sets 0.5 over it (only rope_parameters may say otherwise)")
    cfg.ignore("attn_rotary_emb", "the rotary width of Bamba's original code; transformers turns half of each head")
    heads = cfg.map("mamba_n_heads", "mamba_n_heads", 128)
    expand = cfg.map("mamba_expand", "mamba_expand", 2)
    width = expand * cfg.config["hidden_size"]
    if width % heads:
        raise UserError(f"{cfg.file}: mamba_n_heads {heads} does not divide mamba_expand * hidden_size ({width})")
    cfg.expect("mamba_d_head", ["auto", width // heads], "auto", " (mamba_expand * hidden_size / mamba_n_heads)")
    groups = cfg.map("mamba_n_groups", "mamba_n_groups", 1)
    if heads % groups:
        raise UserError(f"{cfg.file}: mamba_n_groups {groups} does not divide mamba_n_heads {heads}")
    for key, default in (("mamba_d_state", 256), ("mamba_d_conv", 4), ("mamba_chunk_size", 256)):
        cfg.map(key, key, default)
    cfg.put("mamba_conv_bias", cfg.flag("mamba_conv_bias", True), "mamba_conv_bias")
    cfg.put("mamba_proj_bias", cfg.flag("mamba_proj_bias", False), "mamba_proj_bias")
    limit = cfg.get("time_step_limit", [0.0, INFINITY])
    if not (isinstance(limit, list) and len(limit) == 2 and isinstance(limit[0], (int, float))
            and not isinstance(limit[0], bool) and limit[0] >= 0 and limit[1] in (INFINITY, float("inf"))):
        raise UserError(f"{cfg.file}: time_step_limit {render(limit)} is not supported (supported: [min, "
                        "Infinity], dt bounded below only)")
    cfg.put("time_step_min", float(limit[0]), "time_step_limit")
    for key in ("time_step_min", "time_step_max", "time_step_floor"):
        cfg.ignore(key, "how dt_bias is initialised for training from scratch; an import starts from the weights")
    cfg.ignore("z_loss_coefficient", "a training loss on the logits; fine-tuning with xspec adds none")
    cfg.ignore("num_logits_to_keep", "how many positions' logits transformers' forward returns")


def write(params: dict, config: dict) -> None:
    """The attention layers by number; dt bounded below only (transformers 5's spelling)."""
    config["attn_layer_indices"] = [i for i, kind in enumerate(layer_types(params)) if kind == "full_attention"]
    config["time_step_limit"] = [params["time_step_min"], INFINITY]
    own_head_dim(params, config)


FAMILY = Family("bamba", "bamba", "BambaForCausalLM", read, 262144,
                keys={"attention_bias": "attention_bias", "mlp_bias": "mlp_bias",
                      **{key: key for key in ("mamba_n_heads", "mamba_expand", "mamba_d_head", "mamba_n_groups",
                                              "mamba_d_state", "mamba_d_conv", "mamba_chunk_size", "mamba_conv_bias",
                                              "mamba_proj_bias")}},
                write=write)
