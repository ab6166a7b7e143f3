"""Hugging Face's tensor names and packing against the spec's, in both directions.

The specs of imported families name their modules as transformers does, so a tensor's name is the
checkpoint's after the top-level prefix: `decoder.layers.0.mlp.up_proj.weight` is
`model.layers.0.mlp.up_proj.weight`, and the output head `decoder.lm_head.weight` is `lm_head.weight`. What
remains is packing, a family's weight rules: Phi-3 fuses q, k, v (and gate, up) into one matrix, Mixtral,
Qwen3-MoE and DeepSeek store each expert apart where the spec stacks them, gpt-oss interleaves gate and up
columns and multiplies from the left. A `Group` ties some checkpoint tensors to some of the model's. The
groups are made from the spec's own tensor names, so a checkpoint tensor no group asks for is left over,
and one a group asks for but the checkpoint lacks is missing: both are errors naming it.

DeepSeek-V3's multi-token prediction modules (`mtp.K.*`) are stored as layers after the last
(`model.layers.{layers + K}.*`): their transformer layer under the names of every layer, their norms and
projection under their own; the embedding and the output head each module shares are stored again in each,
copies that import checks and export writes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from xspec.base.errors import UserError

Tensors = list[torch.Tensor]


@dataclass(frozen=True)
class Group:
    hf: tuple[str, ...]
    ours: tuple[str, ...]
    to_ours: Callable[[Tensors], Tensors]
    to_hf: Callable[[Tensors], Tensors]


def _same(tensors: Tensors) -> Tensors:
    return tensors


# The checkpoint's top-level module where it is not transformers' usual `model.`.
PREFIX = {"nemotron_h": "backbone."}


def checkpoint_name(name: str, layout: str) -> str:
    """The checkpoint's name of the spec's tensor `name` (`decoder.` is the checkpoint's top-level module,
    whose output head stands beside it)."""
    assert name.startswith("decoder."), f"no Hugging Face name for the spec's tensor {name}"
    rest = name.removeprefix("decoder.")
    return rest if rest.startswith("lm_head.") else PREFIX.get(layout, "model.") + rest


def groups(layout: str, names: list[str], shapes: dict[str, tuple[int, ...]], params: dict) -> list[Group]:
    """The groups covering `names` (the spec's tensors, tied copies left out)."""
    found: dict[tuple[str, ...], Group] = {}
    special = SPECIAL.get(layout)

    def group_of(name: str, tensor_shapes: dict[str, tuple[int, ...]]) -> Group:
        group = special(name, tensor_shapes, params) if special else None
        return group if group is not None else Group((checkpoint_name(name, layout),), (name,), _same, _same)

    depths = sorted({int(found_[1]) for name in names if (found_ := re.match(r"mtp\.(\d+)\.", name))})
    for name in names:
        group = _prediction_group(name, params["layers"], shapes, group_of) if name.startswith("mtp.") \
            else group_of(name, shapes)
        found.setdefault(group.hf, group)
    return [_with_copies(group, params["layers"], depths) for group in found.values()]


# A multi-token prediction module's own tensors, after its layer's number.
_PREDICTION_OWN = {"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "eh_proj.weight",
                   "head_norm.weight": "shared_head.norm.weight"}


def _prediction_group(name: str, layers: int, shapes: dict[str, tuple[int, ...]], group_of) -> Group:
    """A tensor of multi-token prediction's depth K: its own (`mtp.K.eh_proj.weight`), or its transformer
    layer's (`mtp.K.layer.*`), grouped as the same tensor of a decoder layer numbered `layers + K`."""
    depth, rest = re.fullmatch(r"mtp\.(\d+)\.(.+)", name).groups()  # type: ignore[union-attr]
    number = layers + int(depth)
    if rest in _PREDICTION_OWN:
        return Group((f"model.layers.{number}.{_PREDICTION_OWN[rest]}",), (name,), _same, _same)
    assert rest.startswith("layer."), f"no Hugging Face name for the spec's tensor {name}"
    alias = f"decoder.layers.{number}.{rest.removeprefix('layer.')}"
    renamed = {alias: name}
    group = group_of(alias, {**shapes, alias: shapes[name]})
    return Group(group.hf, tuple(renamed.get(n, n) for n in group.ours), group.to_ours, group.to_hf)


def _with_copies(group: Group, layers: int, depths: list[int]) -> Group:
    """The embedding's and the output head's group, with the copies each multi-token prediction module
    stores of them (DeepSeek-V3 §2.2: shared, and stored again)."""
    copy = {"model.embed_tokens.weight": "embed_tokens.weight", "lm_head.weight": "shared_head.head.weight"}
    # (the copy's name, the index in group.hf of the tensor it copies)
    copies = [(f"model.layers.{layers + depth}.{copy[hf]}", index) for index, hf in enumerate(group.hf)
              if hf in copy for depth in depths]
    if not copies:
        return group
    count = len(group.hf)

    def to_ours(tensors: Tensors) -> Tensors:
        for (name, index), tensor in zip(copies, tensors[count:]):
            original = tensors[index]
            # (planning reads shapes only, on meta tensors: the values are compared when written)
            if tensor.shape != original.shape or not (tensor.is_meta or torch.equal(tensor, original)):
                raise UserError(f"tensor {name} differs from {group.hf[index]}: xspec's multi-token prediction "
                                "shares the model's embedding and output head, of which the checkpoint stores "
                                "copies")
        return group.to_ours(tensors[:count])

    def to_hf(tensors: Tensors) -> Tensors:
        written = group.to_hf(tensors)
        return written + [written[index].clone() for _, index in copies]

    return Group(group.hf + tuple(name for name, _ in copies), group.ours, to_ours, to_hf)


# --- fused and stacked layouts -------------------------------------------------------------------

def _phi3(name: str, shapes: dict, params: dict) -> Group | None:
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


def _per_expert(prefix: str, names: dict[str, str], router: str):
    """Experts stored one tensor per expert (`prefix.experts.E.<name>.weight`), stacked by the spec; the
    router's weight, and DeepSeek's load-correction bias."""

    def special(name: str, shapes: dict, params: dict) -> Group | None:
        found = re.fullmatch(r"decoder\.layers\.(\d+)\.mlp\.moe\.(router\.weight|router\.correction_bias|gate|up|down)",
                             name)
        if found is None:
            return None
        layer, part = found[1], found[2]
        base = f"model.layers.{layer}.{prefix}"
        if part == "router.weight":
            return Group((f"{base}.{router}.weight",), (name,), _same, _same)
        if part == "router.correction_bias":
            return Group((f"{base}.{router}.e_score_correction_bias",), (name,), _same, _same)
        experts = shapes[name][0]
        hf = tuple(f"{base}.experts.{e}.{names[part]}.weight" for e in range(experts))
        return Group(hf, (name,), lambda t: [torch.stack(t)], lambda t: list(t[0].unbind(0)))

    return special


def _gpt_oss(name: str, shapes: dict, params: dict) -> Group | None:
    found = re.fullmatch(r"decoder\.layers\.(\d+)\.mlp\.moe\.(\w+(?:\.\w+)?)", name)
    if found is None:
        return None
    layer, part = found[1], found[2]
    base = f"model.layers.{layer}.mlp"
    if part.startswith("router."):
        return Group((f"{base}.{part}",), (name,), _same, _same)
    ours = lambda *parts: tuple(f"decoder.layers.{layer}.mlp.moe.{p}" for p in parts)  # noqa: E731
    if part in ("gate", "up"):   # [E, d, 2 f], gate and up interleaved (even, odd columns), multiplied from the left
        return Group((f"{base}.experts.gate_up_proj",), ours("gate", "up"),
                     lambda t: [t[0][..., ::2].transpose(1, 2), t[0][..., 1::2].transpose(1, 2)],
                     lambda t: [torch.stack([t[0].transpose(1, 2), t[1].transpose(1, 2)], dim=-1).flatten(-2)])
    if part in ("gate_bias", "up_bias"):
        return Group((f"{base}.experts.gate_up_proj_bias",), ours("gate_bias", "up_bias"),
                     lambda t: [t[0][..., ::2], t[0][..., 1::2]],
                     lambda t: [torch.stack(t, dim=-1).flatten(-2)])
    if part == "down":
        return Group((f"{base}.experts.down_proj",), (name,), lambda t: [t[0].transpose(1, 2)],
                     lambda t: [t[0].transpose(1, 2)])
    return Group((f"{base}.experts.down_proj_bias",), (name,), _same, _same)


def _interleaved_rotary(name: str, shapes: dict, params: dict) -> Group | None:
    """DeepSeek's rotary features as pairs (x0, x1), (x2, x3), ... (rope_interleave): the rows of the
    projections that make them, reordered to halves (x0, x2, ..., x1, x3, ...), which the spec turns."""
    found = re.fullmatch(r"decoder\.layers\.\d+\.self_attn\.(q_proj\.weight|q_b_proj\.weight|kv_a_proj_with_mqa\.\w+)",
                         name)
    if found is None:
        return None
    rope = params["qk_rope_head_dim"]
    halves = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])
    pairs = halves.argsort()
    if found[1].startswith("kv_a_proj"):  # [kv_lora_rank + rope, ...]: the shared rotary key last
        latent = params["kv_lora_rank"]

        def reorder(order):
            return lambda t: [torch.cat([t[0][:latent], t[0][latent:][order]])]
    else:  # [heads * (nope + rope), ...]: each head's rotary features after its others
        nope = params["qk_nope_head_dim"]

        def reorder(order):
            def apply(t: Tensors) -> Tensors:
                heads = t[0].view(-1, nope + rope, t[0].size(-1))
                return [torch.cat([heads[:, :nope], heads[:, nope:][:, order]], dim=1).flatten(0, 1)]
            return apply
    return Group((checkpoint_name(name, "deepseek"),), (name,), reorder(halves), reorder(pairs))


# Qwen3-MoE's and DeepSeek's experts: mlp.experts.E.{gate,up,down}_proj, the router mlp.gate.
_mlp_experts = _per_expert("mlp", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}, "gate")


def _deepseek_interleaved(name: str, shapes: dict, params: dict) -> Group | None:
    return _interleaved_rotary(name, shapes, params) or _mlp_experts(name, shapes, params)


def _qwen3_next(name: str, shapes: dict, params: dict) -> Group | None:
    """Qwen3-Next's gated attention's q_proj (weight and bias), each head's query rows then its gate's rows,
    split into the spec's q_proj and gate_proj; its experts as Qwen3-MoE's."""
    found = re.fullmatch(r"decoder\.layers\.(\d+)\.self_attn\.(q|gate)_proj\.(weight|bias)", name)
    if found is None:
        return _mlp_experts(name, shapes, params)
    layer, kind = found[1], found[3]
    heads = params["heads"]
    ours = (f"decoder.layers.{layer}.self_attn.q_proj.{kind}", f"decoder.layers.{layer}.self_attn.gate_proj.{kind}")
    return Group((f"model.layers.{layer}.self_attn.q_proj.{kind}",), ours,
                 lambda t: [rows.flatten(0, 1) for rows in t[0].unflatten(0, (heads, 2, -1)).unbind(1)],
                 lambda t: [torch.stack([t[0].unflatten(0, (heads, -1)), t[1].unflatten(0, (heads, -1))], 1)
                            .flatten(0, 2)])


SPECIAL = {
    "phi3": _phi3,
    "mixtral": _per_expert("block_sparse_moe", {"gate": "w1", "up": "w3", "down": "w2"}, "gate"),
    "qwen3_moe": _mlp_experts,
    "gpt_oss": _gpt_oss,
    "deepseek": _mlp_experts,
    "deepseek_interleaved": _deepseek_interleaved,
    "qwen3_next": _qwen3_next,
}
