"""FlexAttention for the attentions whose options SDPA cannot run fused: soft-capped scores and sinks,
which the generated module otherwise writes out as an n x n matrix, and sliding windows, whose blocks
outside the window FlexAttention skips. On CUDA the runtime runs such a module's forward through
FlexAttention, compiled: the soft cap as a score_mod, causality, the window and padding as a block
mask, and sinks from the log-sum-exp it returns (a row's weights shrink by Z / (Z + e^sink) =
sigmoid(lse - sink)). A forward with a decoding cache, or with dropout on the weights in training,
runs the module's own computation.

Which modules and options: the spec's graph says (`attrs`), not the module's attributes; the module
gives its heads (`heads_of`: projections, positions, norms), its output gate and its `sinks`.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Optional

import torch
from torch import nn

from xspec.compiler.op_attention import AttentionAttrs
from xspec.compiler.op_attention_mask import PORT
from xspec.compiler.spec import CompiledSpec

from .compile_choice import compiled

_compiled_flex: Optional[Callable[..., Any]] = None


def flex_suits(attrs: AttentionAttrs) -> bool:
    """Options FlexAttention runs better than SDPA's dense masks or the written-out scores."""
    return (attrs.softcap is not None or attrs.sinks or attrs.window is not None) and not attrs.alibi


def use_flex_attention(model: nn.Module, spec: CompiledSpec, compiled: bool = True) -> list[str]:
    """Runs the forward of each attention of `model` that FlexAttention suits through it; returns their
    paths. `compiled=False` runs FlexAttention's reference implementation (for tests off CUDA). A stack's
    mask that only such attentions read is made only where a cache is passed (FlexAttention makes its
    block mask of the same keys instead of reading a dense one)."""
    paths, flexed = [], set()
    for node in spec.ops:
        if node.op == "attention" and node.module and flex_suits(node.attrs_as(AttentionAttrs)):
            run_through_flex(model.get_submodule(node.module), node.attrs_as(AttentionAttrs), compiled)
            paths.append(node.module)
            flexed.add(node.id)
    readers: dict[str, set[str]] = {}    # a mask's node -> the attentions that read it
    for node in spec.ops:
        if PORT in node.inputs:
            readers.setdefault(node.inputs[PORT], set()).add(node.id)
    for node in spec.ops:
        if node.op == "attention_mask" and node.module and node.id in readers and readers[node.id] <= flexed:
            mask = model.get_submodule(node.module)
            mask.forward = types.MethodType(_made_with_cache(type(mask).forward), mask)
    return paths


def _made_with_cache(own: Callable[..., Any]):
    def forward(mask: nn.Module, x: torch.Tensor, cache: Any = None) -> Optional[torch.Tensor]:
        return own(mask, x, cache) if cache is not None else None
    return forward


def run_through_flex(module: nn.Module, attrs: AttentionAttrs, compiled: bool = True) -> None:
    """The generated attention `module`, whose options are `attrs`, runs its forward through FlexAttention
    from now on (without a cache; with one, its own)."""
    module.forward = types.MethodType(_flex_forward(attrs, compiled, type(module).forward), module)


def heads_of(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             angles: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A generated attention's queries [B, h, Tq, d_k], keys [B, kv_h, Tk, d_k] and values [..., d_v], by
    its own steps (positions, norms) and without a cache, as its forward makes them: turned by the stack's
    rotary `angles` where it passes them."""
    q, k, v, _ = _heads_and_gate(module, query, key, value, angles)
    return q, k, v


def _heads_and_gate(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    angles: Optional[torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """heads_of's queries, keys and values, and the attention's output gate (None without one)."""
    attention: Any = module  # its methods: torch types a module's attributes Tensor | Module
    return attention.heads_of(query, key, value, None, angles)


def _flex_forward(attrs: AttentionAttrs, compiled: bool, own: Callable[..., torch.Tensor]):
    def forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                padding_mask: Optional[torch.Tensor] = None, cache: Any = None,
                position_bias: Optional[torch.Tensor] = None,
                position_embeddings: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        # Without a cache a stack's mask is the causality and window of `attrs`, which the block mask holds.
        if cache is not None or (module.training and attrs.dropout) or position_bias is not None:
            return own(module, query, key, value, padding_mask, cache, position_bias, position_embeddings,
                       attention_mask)
        q, k, v, gate = _heads_and_gate(module, query, key, value, position_embeddings)
        sinks = module.sinks if attrs.sinks else None
        out = flex_attention(q, k, v, attrs, padding_mask, sinks, compiled)
        return module.o_proj(module.gated(out.transpose(1, 2).flatten(2), gate))
    return forward


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attrs: AttentionAttrs,
                   padding_mask: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                   compiled: bool) -> torch.Tensor:
    """The heads' outputs [B, h, Tq, d_v] of queries [B, h, Tq, d_k] over keys [B, kv_h, Tk, d_k]."""
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as flex

    past, window, causal, softcap = k.size(2) - q.size(2), attrs.window, attrs.causal, attrs.softcap

    def allowed(b, h, q_index, k_index):
        keep = k_index >= 0
        if causal:
            keep = keep & (k_index <= q_index + past)
        if window is not None and causal:
            keep = keep & (q_index + past - k_index < window)
        elif window is not None:    # a band both ways
            keep = keep & (q_index + past - k_index < window) & (k_index - q_index - past < window)
        if padding_mask is not None:
            keep = keep & ~padding_mask[b, k_index]
        return keep

    def capped(score, b, h, q_index, k_index):
        return torch.tanh(score / softcap) * softcap

    batch = q.size(0) if padding_mask is not None else None
    block_mask = create_block_mask(allowed, batch, None, q.size(2), k.size(2), device=q.device)
    attend: Callable[..., Any] = flex
    if compiled and not torch.compiler.is_compiling():
        attend = _compiled()
    # A scale of the spec's own is in the queries already (Attention.queries).
    options: dict[str, Any] = {"score_mod": capped if softcap is not None else None, "block_mask": block_mask,
                               "enable_gqa": q.size(1) != k.size(1)}
    if sinks is None:
        return attend(q, k, v, **options)
    out, aux = attend(q, k, v, **options, return_aux=AuxRequest(lse=True))
    shrink = torch.sigmoid(aux.lse - sinks[None, :, None].float())
    return out * shrink[..., None].to(out.dtype)


def _compiled() -> Callable[..., Any]:
    """flex_attention compiled once per process (outside torch.compile of the model, which fuses it
    itself)."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention as flex

        _compiled_flex = compiled(flex)
    return _compiled_flex
