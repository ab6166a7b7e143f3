"""Low-rank adaptation (Hu et al., 2021, "LoRA"): chosen linear layers learn W + (alpha / r) B A beside their
frozen weight W, A [r, in] from Kaiming's uniform and B [out, r] zero, so the first forward is the base
model's; nothing else trains.

Which layers (train.lora_targets): op kinds of the spec (`attention`: every projection of an attention op;
`linear`: every linear op but the output head), or the end of module names (`q_proj`, `self_attn.q_proj`).
A run's checkpoints hold the adapters alone and a reference to the checkpoint they adapt (checkpoint.py's
`BaseRef`); reading one for decoding, averaging or export merges them into the base's weights.

The frozen weights of the adapted layers may be kept smaller (train.lora_base), as QLoRA (Dettmers et al.,
2023) keeps them: in bf16, or in int8 with a scale per output row (its absolute maximum / 127). Each product
restores the float weight for itself alone, and merging applies the same rounding, so the merged model is
the one that trained."""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import nn

from xspec.base.errors import UserError
from xspec.compiler.ops import OPS
from .step import parameter_holders

ADAPTER_PARTS = ("lora_A", "lora_B")
BASE_FORMS = ("float32", "bfloat16", "int8")      # train.lora_base: how the adapted layers' frozen weights are kept


class LoRALinear(nn.Linear):
    """y = x W^T + b + (alpha / r) dropout(x) A^T B^T: an nn.Linear (its weight and bias keep their names
    and stay frozen) with the adapter beside it."""

    def __init__(self, linear: nn.Linear, rank: int, alpha: float, dropout: float) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        device, dtype = self.weight.device, self.weight.dtype
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))      # as nn.Linear's own weight, and PEFT's A
        self.scaling = alpha / rank
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.base_form = "float32"
        self.register_buffer("weight_scale", None, persistent=False)     # int8's scale per row

    def store_base(self, form: str) -> None:
        """Keeps the frozen weight as `form` (BASE_FORMS) says, once the base's weights are in it. The stored
        weight is a buffer outside the state dict: a LoRA run's checkpoints hold the adapters alone."""
        if form == "float32":
            return
        data, scale = stored_weight(self.weight.detach(), form)
        del self.weight
        self.register_buffer("weight", data, persistent=False)
        self.weight_scale = scale
        self.base_form = form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.base_form == "float32":
            base = F.linear(x, self.weight, self.bias)
        else:
            base = _StoredLinear.apply(x, self.weight, self.weight_scale, self.bias)
        adapted = _AddUpdate.apply(base.flatten(0, -2), self.dropout(x).flatten(0, -2), self.lora_A, self.lora_B,
                                   self.scaling)
        return adapted.view_as(base)


class _AddUpdate(torch.autograd.Function):
    """base + scaling * (x A^T) B^T, for 2-d base [tokens, out] and x [tokens, in]. Autograd's own backward
    of these products takes the forms with a [features, tokens] left operand (x^T g), several times slower on
    CPUs for a rank this small than the forms taken here, whose left operand is [rank, tokens] or [tokens, .].
    The products are in the base product's dtype (bf16 under autocast), backward too, where autocast is off."""

    @staticmethod
    def forward(ctx, base: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                scaling: float) -> torch.Tensor:
        x, a = x.to(base.dtype), a.to(base.dtype)
        down = x @ a.t()                                    # [tokens, rank]
        scaled_bt = (scaling * b).t().to(base.dtype).contiguous()   # [rank, out]
        ctx.save_for_backward(x, a, down, scaled_bt)
        ctx.scaling = scaling
        return torch.addmm(base, down, scaled_bt)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, a, down, scaled_bt = ctx.saved_tensors
        grad_down = grad @ scaled_bt.t()                   # [tokens, rank]
        grad_b = (down.t() @ grad).t() * ctx.scaling if ctx.needs_input_grad[3] else None
        grad_a = grad_down.t() @ x if ctx.needs_input_grad[2] else None
        grad_x = grad_down @ a if ctx.needs_input_grad[1] else None
        return grad, grad_x, grad_a, grad_b, None


class _StoredLinear(torch.autograd.Function):
    """x W^T + b for a frozen W kept in a smaller form (data and, for int8, a scale per row). W is restored
    for the product and again for the input's gradient: autograd's own F.linear would keep the restored
    float copy of every layer until the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor | None,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(data, scale)
        return F.linear(x, restored_weight(data, scale, x.dtype), bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        data, scale = ctx.saved_tensors
        grad_x = grad @ restored_weight(data, scale, grad.dtype) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


def stored_weight(weight: torch.Tensor, form: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`weight` [out, in] as `form` keeps it: (bf16 data, None), or (int8 data, float32 scale [out, 1]) with
    each row's absolute maximum mapped to 127."""
    if form == "bfloat16":
        return weight.to(torch.bfloat16), None
    assert form == "int8", f"a frozen weight is kept as float32, bfloat16 or int8, not {form}"
    scale = (weight.float().abs().amax(dim=1, keepdim=True) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(weight.float() / scale).clamp_(-127, 127).to(torch.int8), scale


def restored_weight(data: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The float weight that stored_weight's data (and scale) stand for, in `dtype`."""
    if scale is None:
        return data.to(dtype)
    return (data.to(torch.float32) * scale).to(dtype)


def as_trained(weight: torch.Tensor, form: str) -> torch.Tensor:
    """`weight` rounded as a run with train.lora_base = `form` kept it, in float32."""
    if form == "float32":
        return weight.float()
    return restored_weight(*stored_weight(weight, form), torch.float32)


def merged_weight(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float,
                  form: str = "float32") -> torch.Tensor:
    """W + scaling * B A, computed in float32 from W as the run kept it (`form`) and kept in W's dtype."""
    return (as_trained(weight, form) + scaling * (b.float() @ a.float())).to(weight.dtype)


def is_adapter(name: str) -> bool:
    """Whether a state-dict key is an adapter's (`...q_proj.lora_A`)."""
    return name.rsplit(".", 1)[-1] in ADAPTER_PARTS


def lora_targets(model: nn.Module, spec, targets: tuple[str, ...]) -> list[str]:
    """The names of the plain linear layers of `model` that `targets` choose (the module docstring); a target
    that is neither an op kind nor the end of a linear layer's name is refused by name."""
    owners: dict[str, list[str]] = {}
    for node in spec.ops:
        if node.module:
            owners.setdefault(node.op, []).append(node.module)
    linears = [name for name, module in model.named_modules() if type(module) is nn.Linear]

    def chooses(target: str, name: str) -> bool:
        if target == "linear":
            return name in owners.get("linear", ()) and name != spec.output_head
        if target in OPS:
            return any(name.startswith(f"{owner}.") for owner in owners.get(target, ()))
        return name == target or name.endswith(f".{target}")

    for target in targets:
        if target not in OPS and not any(chooses(target, name) for name in linears):
            raise UserError(f"train.lora_targets: {target!r} is neither an op kind nor the end of a linear layer's "
                            f"name in {spec.name} (its linear layers: {_examples(linears)})")
    return [name for name in linears if any(chooses(target, name) for target in targets)]


def _examples(names: list[str]) -> str:
    ends = sorted({name.rsplit(".", 1)[-1] for name in names})
    return ", ".join(ends[:12]) + (", ..." if len(ends) > 12 else "")


def apply_lora(model: nn.Module, spec, rank: int, alpha: float, dropout: float,
               targets: tuple[str, ...]) -> list[str]:
    """Replaces the chosen linear layers of `model` with LoRALinear, in place, and freezes every other
    parameter; the names replaced (a spec whose targets choose none is an error naming them)."""
    names = lora_targets(model, spec, targets)
    if not names:
        raise UserError(f"train.lora_targets {list(targets)}: no linear layer of {spec.name} is among them (its op "
                        f"kinds: {', '.join(sorted({node.op for node in spec.ops}))})")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for name in names:
        parent, _, child = name.rpartition(".")
        holder, linear = model.get_submodule(parent), model.get_submodule(name)
        assert isinstance(linear, nn.Linear), f"lora_targets chose {name}, a {type(linear).__name__}"
        setattr(holder, child, LoRALinear(linear, rank, alpha, dropout))
    return names


def store_frozen_base(model: nn.Module, form: str) -> str:
    """Keeps the frozen weight of every LoRALinear of `model` as `form` says (train.lora_base); what that
    saved, as the log says it. A weight shared with another module is refused by name: the other module would
    keep the float weight, and compute with other numbers."""
    uses = parameter_holders(model)
    adapted = [(name, module) for name, module in model.named_modules() if isinstance(module, LoRALinear)]
    before = after = 0
    for name, module in adapted:
        if uses[id(module.weight)] > 1:
            raise UserError(f"train.lora_base = \"{form}\": {name}.weight is shared with another module; keep it "
                            "in float32 (train.lora_base = \"float32\") or leave it out of train.lora_targets")
        before += module.weight.numel() * module.weight.element_size()
        module.store_base(form)
        after += sum(t.numel() * t.element_size() for t in (module.weight, module.weight_scale) if t is not None)
    return (f"LoRA: frozen weights of the {len(adapted)} adapted layers kept in {form}: {after / 2**20:,.1f} MiB "
            f"in place of {before / 2**20:,.1f} MiB")


STORED_BYTES = {"float32": 4, "bfloat16": 2, "int8": 1}   # a frozen weight's element, as train.lora_base keeps it


def lora_footprint(spec) -> tuple[int, int]:
    """(the parameters that train, the bytes every weight takes) of a LoRA run of `spec` (train.lora_*): the
    memory plan's counts, from a model built on the meta device."""
    cfg = spec.train
    model = spec.build(device="meta")
    adapted = [model.get_submodule(name) for name in lora_targets(model, spec, cfg.lora_targets)]
    adapters = sum(cfg.lora_rank * (layer.in_features + layer.out_features) for layer in adapted)
    frozen = sum(layer.weight.numel() for layer in adapted)
    scales = sum(layer.out_features for layer in adapted) if cfg.lora_base == "int8" else 0
    return adapters, (spec.parameters - frozen + adapters + scales) * 4 + frozen * STORED_BYTES[cfg.lora_base]


def adapter_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in state.items() if is_adapter(name)}


def trainable_share(model: nn.Module) -> tuple[int, int]:
    """(parameters that train, all parameters), tied ones counted once."""
    unique = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() for p in unique if p.requires_grad), sum(p.numel() for p in unique)

