"""The attention module the compiler writes for a set of options, built here from the library's pieces
(xspec/nn/attention.py) as the compiler chooses them (`attention_class`), for tests that exercise
attention alone; and the class of any op's pieces, as a generated file combines them."""

from __future__ import annotations

from types import ModuleType

import torch

import xspec.nn
from xspec.compiler.op_attention import AttentionAttrs, attention_class


def pieces_class(library: ModuleType, name: str, pieces: tuple[str, ...], alone: type) -> type:
    """The class a generated file uses for `pieces` of `library`: `alone` where there are none, the piece
    where one, else a class named `name` that extends them (as `class SlidingWindowRotaryAttention(...)`)."""
    bases = tuple(getattr(library, piece) for piece in pieces) or (alone,)
    return type(name, bases, {}) if len(bases) > 1 else bases[0]


def compose(d_model: int, heads: int, d_k: int, d_v: int, kv_heads: int | None = None, bias: bool = True,
            causal: bool = False, self_attention: bool = True, **options) -> torch.nn.Module:
    """`heads` heads of queries over `d_model` features; options as the pieces take them (`rotary` a
    rotary embedding module, `q_norm`/`k_norm` norm modules, `window`, `softcap`, `scale`, `dropout`
    numbers, `sinks`/`alibi` booleans)."""
    norm = options.get("q_norm")
    qk_norm = "none" if norm is None else "head" if norm.weight.numel() == d_k else "projection"
    attrs = AttentionAttrs(heads=heads, d_k=d_k, d_v=d_v, kv_heads=kv_heads, causal=causal, rotary="rotary" in options,
                           alibi=options.pop("alibi", False), window=options.get("window"),
                           softcap=options.get("softcap"), scale=options.get("scale"),
                           dropout=options.get("dropout", 0.0), sinks=options.pop("sinks", False), qk_norm=qk_norm)
    cls = pieces_class(xspec.nn, *attention_class(attrs, {"self_attention": self_attention}),
                       xspec.nn.MultiHeadAttention)
    return cls(d_model, heads, kv_heads or heads, d_k, d_v, bias=bias, out_bias=bias, causal=causal, **options)
