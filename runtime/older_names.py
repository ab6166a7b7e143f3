"""The tensor names an older xspec wrote, read as the names the same tensors have now: every checkpoint
passes through this one mapping when it is read, so runs written before a rename load, resume, average
and export as they did.

Renamed so far, to transformers' names: attention's W^O (`out_proj`, now `o_proj`), latent attention's
parts (now DeepSeek's), and a router's load-correction bias (`correction_bias`, now DeepSeek's
`e_score_correction_bias`). Mamba-2's and Gated DeltaNet's `out_proj` keep their name, so an attention is
recognized by its other projections beside it, never by the one name. Repacked: a gated attention's W^G
(`gate_proj`, now rows of `q_proj`, each head's queries then its gate's, as transformers keeps
Qwen3-Next's), where the attention normalizes each head's queries (its `q_norm` then says a head's size;
Qwen3-Next's does)."""

from __future__ import annotations

import re

import torch

# latent attention's old parts -> DeepSeek's names
_LATENT = {"kv_down": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj",
           "q_proj.down": "q_a_proj", "q_proj.norm": "q_a_layernorm", "q_proj.up": "q_b_proj", "out_proj": "o_proj"}
_PART = re.compile(r"(.*)\.(out_proj|kv_down|kv_norm|kv_up|q_proj\.(?:down|norm|up))\.(.+)")


def current_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` (a new dict), any name an older xspec wrote renamed, any layout it wrote repacked."""
    prefixes = {name.rsplit(".", 1)[0] for name in tensors}  # the modules holding them
    attentions = {p.rsplit(".", 1)[0] for p in prefixes if p.endswith((".q_proj", ".k_proj", ".v_proj"))}
    latents = {p.rsplit(".", 1)[0] for p in prefixes if p.endswith(".kv_down")}
    renamed: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(".router.correction_bias"):
            name = name.removesuffix("correction_bias") + "e_score_correction_bias"
        found = _PART.fullmatch(name)
        if found is not None and found[1] in latents:
            name = f"{found[1]}.{_LATENT[found[2]]}.{found[3]}"
        elif found is not None and found[2] == "out_proj" and found[1] in attentions:
            name = f"{found[1]}.o_proj.{found[3]}"
        renamed[name] = tensor
    return _gates_in_queries(renamed)


def _gates_in_queries(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A gated attention's `gate_proj` (weight and bias) as rows of its `q_proj`: each head's queries, then
    its gate's."""
    gated = [name.removesuffix(".gate_proj.weight") for name in tensors if name.endswith(".gate_proj.weight")]
    for attention in gated:
        norm = tensors.get(f"{attention}.q_norm.weight")
        parts = [(tensors.get(f"{attention}.q_proj.{kind}"), tensors.get(f"{attention}.gate_proj.{kind}"))
                 for kind in ("weight", "bias")]
        if norm is None or norm.dim() != 1 or not _repackable(parts, norm.numel()):
            continue  # not an older gated attention: left as it is, for the model's checks to name
        for kind, (queries, gate) in zip(("weight", "bias"), parts):
            if queries is not None and gate is not None:
                heads = queries.size(0) // norm.numel()
                del tensors[f"{attention}.gate_proj.{kind}"]
                tensors[f"{attention}.q_proj.{kind}"] = torch.cat(
                    [queries.unflatten(0, (heads, -1)), gate.unflatten(0, (heads, -1))], dim=1).flatten(0, 1)
    return tensors


def _repackable(parts: list[tuple[torch.Tensor | None, torch.Tensor | None]], head: int) -> bool:
    """Whether each (queries, gate) pair, where both are, splits into the same heads of `head` queries: the
    sizes are the file's, so any other is left for the model's checks to refuse by name."""
    weight, _ = parts[0]
    if weight is None or head < 1 or weight.dim() < 1 or weight.size(0) % head:
        return False
    heads = weight.size(0) // head
    return all(queries.dim() == gate.dim() >= 1 and queries.size(0) == heads * head and gate.size(0) % heads == 0
               and queries.shape[1:] == gate.shape[1:] for queries, gate in parts
               if queries is not None and gate is not None)
