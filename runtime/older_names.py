"""The tensor names an older xspec wrote, read as the names the same tensors have now: every checkpoint
passes through this one mapping when it is read, so runs written before a rename load, resume, average
and export as they did.

Renamed so far, to transformers' names: attention's W^O (`out_proj`, now `o_proj`), latent attention's
parts (now DeepSeek's), and a router's load-correction bias (`correction_bias`, now DeepSeek's
`e_score_correction_bias`). Mamba-2's and Gated DeltaNet's `out_proj` keep their name, so an attention is
recognized by its other projections beside it, never by the one name."""

from __future__ import annotations

import re
from typing import TypeVar

T = TypeVar("T")

# latent attention's old parts -> DeepSeek's names
_LATENT = {"kv_down": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj",
           "q_proj.down": "q_a_proj", "q_proj.norm": "q_a_layernorm", "q_proj.up": "q_b_proj", "out_proj": "o_proj"}
_PART = re.compile(r"(.*)\.(out_proj|kv_down|kv_norm|kv_up|q_proj\.(?:down|norm|up))\.(.+)")


def current_names(tensors: dict[str, T]) -> dict[str, T]:
    """`tensors` (a new dict), any name an older xspec wrote renamed."""
    prefixes = {name.rsplit(".", 1)[0] for name in tensors}  # the modules holding them
    attentions = {p.rsplit(".", 1)[0] for p in prefixes if p.endswith((".q_proj", ".k_proj", ".v_proj"))}
    latents = {p.rsplit(".", 1)[0] for p in prefixes if p.endswith(".kv_down")}
    renamed: dict[str, T] = {}
    for name, tensor in tensors.items():
        if name.endswith(".router.correction_bias"):
            name = name.removesuffix("correction_bias") + "e_score_correction_bias"
        found = _PART.fullmatch(name)
        if found is not None and found[1] in latents:
            name = f"{found[1]}.{_LATENT[found[2]]}.{found[3]}"
        elif found is not None and found[2] == "out_proj" and found[1] in attentions:
            name = f"{found[1]}.o_proj.{found[3]}"
        renamed[name] = tensor
    return renamed
