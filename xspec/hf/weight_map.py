"""Hugging Face's tensor names and packing against the spec's, in both directions.

The specs of imported families name their modules as transformers does, so a tensor's name is the
checkpoint's after the top-level prefix: `decoder.layers.0.mlp.up_proj.weight` is
`model.layers.0.mlp.up_proj.weight`, and the output head `decoder.lm_head.weight` is `lm_head.weight`. What
remains is packing, a family's weight rules: Mixtral, Qwen3-MoE and DeepSeek store each expert apart where
the spec stacks them, gpt-oss interleaves gate and up columns and multiplies from the left. A `Group` ties
some checkpoint tensors to some of the model's. The groups are made from the spec's own tensor names, so a
checkpoint tensor no group asks for is left over, and one a group asks for but the checkpoint lacks is
missing: both are errors naming it.

DeepSeek-V3's multi-token prediction modules (`mtp.K.*`) are stored as layers after the last
(`model.layers.{layers + K}.*`): their transformer layer under the names of every layer, their norms and
projection under their own; the embedding and the output head each module shares are stored again in each,
copies that import checks and export writes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from xspec.base.errors import UserError

if TYPE_CHECKING:
    import torch

# torch is imported where tensors are packed, not here: `xspec --help` lists the families without it.
Tensors = list["torch.Tensor"]


@dataclass(frozen=True)
class Group:
    hf: tuple[str, ...]
    ours: tuple[str, ...]
    to_ours: Callable[[Tensors], Tensors]
    to_hf: Callable[[Tensors], Tensors]


# A family's own packing: the group of the spec's tensor `name` (given every tensor's shape and the spec's
# parameters), or None where the tensor is stored as it is.
Packing = Callable[[str, dict, dict], Optional[Group]]


@dataclass(frozen=True)
class Extra:
    """A checkpoint tensor no tensor of the spec is made from: a copy of another, or a table the spec
    derives (sinusoidal positions). Either must hold what the spec computes."""

    copy_of: Optional[str]          # the checkpoint tensor it copies; None: derived, or unused
    why: str                        # why the checkpoint holds it (`tie_word_embeddings is true`)
    # A derived table's values, given its stored shape (the spec computes them; the checkpoint's must agree).
    derived: Optional[Callable[[tuple[int, ...]], "torch.Tensor"]] = None
    # A tensor the family's class does not read (BERT pretraining's pooler), which transformers drops too.
    unused: bool = False


def tied_output_head(name: str, params: dict) -> Optional[Extra]:
    """The output head some checkpoints keep beside the embedding it is tied to."""
    if name == "lm_head.weight" and params.get("tie_word_embeddings"):
        return Extra("model.embed_tokens.weight", "tie_word_embeddings is true")
    return None


@dataclass(frozen=True)
class WeightRules:
    """How a family's checkpoint stores the spec's tensors: its top-level module, its packing, and the
    tensors it holds beside them."""

    name: str
    packing: Optional[Packing] = None
    prefix: str = "model."          # the checkpoint's top-level module (Nemotron-H's say `backbone.`)
    extras: Callable[[str, dict], Optional[Extra]] = tied_output_head
    # Checkpoint tensors some checkpoints lack, which transformers then takes as zeros (BART's
    # final_logits_bias, which checkpoints of BartModel do not hold): the import does the same.
    zeros: tuple[str, ...] = ()
    head: str = "lm_head.weight"    # the checkpoint's output projection (tied or not)

    def checkpoint_name(self, name: str) -> str:
        """The checkpoint's name of the spec's tensor `name` (`decoder.` is the checkpoint's top-level
        module, whose output head stands beside it)."""
        assert name.startswith("decoder."), f"no Hugging Face name for the spec's tensor {name}"
        rest = name.removeprefix("decoder.")
        return rest if rest.startswith("lm_head.") else self.prefix + rest


PLAIN = WeightRules("plain")


def same(tensors: Tensors) -> Tensors:
    return tensors


def groups(rules: WeightRules, names: list[str], shapes: dict[str, tuple[int, ...]], params: dict) -> list[Group]:
    """The groups covering `names` (the spec's tensors, tied copies left out)."""
    found: dict[tuple[str, ...], Group] = {}

    def group_of(name: str, tensor_shapes: dict[str, tuple[int, ...]]) -> Group:
        group = rules.packing(name, tensor_shapes, params) if rules.packing else None
        return group if group is not None else Group((rules.checkpoint_name(name),), (name,), same, same)

    depths = sorted({int(found_[1]) for name in names if (found_ := re.match(r"mtp\.(\d+)\.", name))})
    for name in names:
        group = _prediction_group(name, params["layers"], shapes, group_of) if name.startswith("mtp.") \
            else group_of(name, shapes)
        found.setdefault(group.hf, group)
    return [_with_copies(group, params.get("layers", 0), depths) for group in found.values()]


# A multi-token prediction module's own tensors, after its layer's number.
_PREDICTION_OWN = {"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "eh_proj.weight",
                   "head_norm.weight": "shared_head.norm.weight"}


def _prediction_group(name: str, layers: int, shapes: dict[str, tuple[int, ...]], group_of) -> Group:
    """A tensor of multi-token prediction's depth K: its own (`mtp.K.eh_proj.weight`), or its transformer
    layer's (`mtp.K.layer.*`), grouped as the same tensor of a decoder layer numbered `layers + K`."""
    depth, rest = re.fullmatch(r"mtp\.(\d+)\.(.+)", name).groups()  # type: ignore[union-attr]
    number = layers + int(depth)
    if rest in _PREDICTION_OWN:
        return Group((f"model.layers.{number}.{_PREDICTION_OWN[rest]}",), (name,), same, same)
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
        import torch

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


# --- packing several families share ------------------------------------------------------------------

def per_expert(prefix: str, names: dict[str, str], router: str):
    """Experts stored one tensor per expert (`prefix.experts.E.<name>.weight`), where the spec stacks them,
    gate and up in one (`mlp.experts.gate_up_proj`, gate's rows first); the router (`mlp.gate`) and
    DeepSeek's load-correction bias under the checkpoint's names."""

    def special(name: str, shapes: dict, params: dict) -> Group | None:
        import torch

        found = re.fullmatch(r"decoder\.layers\.(\d+)\.mlp\.(gate\.weight|gate\.e_score_correction_bias|"
                             r"experts\.gate_up_proj|experts\.down_proj)", name)
        if found is None:
            return None
        layer, part = found[1], found[2]
        base = f"model.layers.{layer}.{prefix}"
        if part.startswith("gate."):
            return Group((f"{base}.{router}.{part.removeprefix('gate.')}",), (name,), same, same)
        count = shapes[name][0]
        each = lambda kind: tuple(f"{base}.experts.{e}.{names[kind]}.weight" for e in range(count))  # noqa: E731
        if part == "experts.down_proj":
            return Group(each("down"), (name,), lambda t: [torch.stack(t)], lambda t: list(t[0].unbind(0)))
        def apart(t: Tensors) -> Tensors:
            gate, up = t[0].chunk(2, dim=1)
            return [*gate.unbind(0), *up.unbind(0)]

        return Group(each("gate") + each("up"), (name,),
                     lambda t: [torch.cat([torch.stack(t[:count]), torch.stack(t[count:])], dim=1)], apart)

    return special


# Qwen3-MoE's and DeepSeek's experts: mlp.experts.E.{gate,up,down}_proj, the router mlp.gate.
mlp_experts = per_expert("mlp", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}, "gate")




# --- encoder-decoders (BART's descendants) ----------------------------------------------------------------

def seq2seq(name: str, shapes: dict, params: dict) -> Optional[Group]:
    """BART's and Marian's checkpoints: every tensor under `model.` but the output head's, attention's W^O
    as `out_proj`, the shared embedding as `model.shared`, and the output projection's bias as
    final_logits_bias [1, vocab]."""
    if name == "decoder.lm_head.bias":
        return Group(("final_logits_bias",), (name,), lambda t: [t[0].reshape(-1)], lambda t: [t[0].reshape(1, -1)])
    if name == "decoder.lm_head.weight":
        return Group(("lm_head.weight",), (name,), same, same)
    if name == "encoder.embed_tokens.weight" and params["share_encoder_decoder_embeddings"]:
        return Group(("model.shared.weight",), (name,), same, same)
    return Group(("model." + re.sub(r"\.o_proj\.", ".out_proj.", name),), (name,), same, same)


def seq2seq_with_positions(key: str, why: str,
                           table: Callable[[tuple[int, ...]], "torch.Tensor"]) -> Callable[[str, dict], Extra | None]:
    """BART's copies (`seq2seq_copies`), and the sinusoidal positions' tables a checkpoint may keep under
    `model.encoder.{key}` and `model.decoder.{key}`: derived, their values `table` of their shape (`why`
    names them)."""
    tables = re.compile(rf"model\.(encoder|decoder)\.{re.escape(key)}")

    def extras(name: str, params: dict) -> Optional[Extra]:
        return Extra(None, why, table) if tables.fullmatch(name) else seq2seq_copies(name, params)
    return extras


def seq2seq_copies(name: str, params: dict) -> Optional[Extra]:
    """The copies BART's checkpoints may keep of the shared embedding (the encoder's, the decoder's, a tied
    output head's)."""
    shared = "model.shared.weight" if params["share_encoder_decoder_embeddings"] else None
    if shared and name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        return Extra(shared, "the encoder and the decoder share one embedding")
    if name == "lm_head.weight" and params["tie_word_embeddings"]:
        return Extra(shared or "model.decoder.embed_tokens.weight", "tie_word_embeddings is true")
    return None
