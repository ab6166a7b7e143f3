"""The attention module the compiler writes for a set of options, built here from the library's parts
(xspec/nn/attention.py) as the generated code passes them, for tests that exercise attention alone."""

from __future__ import annotations

import torch

from xspec.nn import Attention, WrittenOutAttention


def compose(d_model: int, heads: int, d_k: int, d_v: int, kv_heads: int | None = None, bias: bool = True,
            causal: bool = False, self_attention: bool = True, **options) -> torch.nn.Module:
    """`heads` heads of queries over `d_model` features; options as Attention takes them (`rotary` a
    rotary embedding module, `q_norm`/`k_norm` norm modules, `window`, `scale`, `dropout` numbers, `alibi`
    a boolean), and `softcap` (a number) and `sinks` (a boolean), which the weights written out take."""
    norm = options.get("q_norm")
    if norm is not None and norm.weight.numel() != d_k:
        options["norm_over"] = "projection"
    softcap = options.pop("softcap", None)
    if softcap is not None or options.get("sinks"):
        options["inner_attention"] = WrittenOutAttention(softcap=softcap, dropout=options.pop("dropout", 0.0))
    return Attention(d_model, heads, kv_heads or heads, d_k, d_v, bias=bias, out_bias=bias, causal=causal,
                     cross=not self_attention, **options)


class Positions:
    """What a rotary embedding reads of a cache: the positions decoded, and each row's own where padded."""

    def __init__(self, length: int = 0, rows: torch.Tensor | None = None) -> None:
        self.length, self.rows = length, rows

    def row_positions(self, new: int) -> torch.Tensor | None:
        return self.rows


def turned(rotary: torch.nn.Module, x: torch.Tensor, start: int = 0, rows: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, h, T, d] turned by `rotary`'s angles of positions start, start + 1, ... (or each row's `rows`
    [B, T]), as an attention turns its queries and keys."""
    return Attention.turned(x, rotary(x[:, 0], Positions(start, rows)))
