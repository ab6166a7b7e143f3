"""The attention mask op's entry in the op table: which keys each query may see, made once by a stack for all
its attentions of one causality and window, as transformers' models make their causal masks:

    mask = attention_mask(x, causal = true) as causal_mask
    repeat layers { x = lm_layer(x, rope, mask) }     # ... attention(..., causal = true, attention_mask = mask)

Causality, a sliding window (`window`: the last `window` positions; not causal, those fewer than `window`
away on either side), and what the decoder cache says of the batch (a padded row's padding, another packed
document's positions) make it: [batch, 1, queries, keys] booleans, True where a query sees a key. An attention
given it is of the same causality and window (the cache keeps that window of its keys): the rule is checked
where the attention reads it (`check_reader`).

Everything about the op is here: schema, shape rule, lowering (xspec/nn/attention.py has the module,
AttentionMask) and what diagrams say.
"""

from __future__ import annotations

import ast as pyast
from typing import Optional

from pydantic import Field

from .opdef import Attrs, Family, Inferred, Input, OpDef, Shapes, Written
from .python_code import call, variable
from .shapes import ShapeError, TensorType, require

PORT = "attention_mask"    # the input an attention reads it at


class AttentionMaskAttrs(Attrs):
    causal: bool = True
    window: Optional[int] = Field(None, gt=0)


def mask_type(queries: TensorType, keys: TensorType) -> TensorType:
    """The mask of `queries` over `keys`: [batch, 1, queries' positions, keys' positions], booleans."""
    return TensorType((queries.dims[0], 1, queries.dims[-2], keys.dims[-2]), "bool")


def check_mask(mask: TensorType, queries: TensorType, keys: TensorType) -> None:
    """`mask` (an attention's input) is a mask of its queries over its keys."""
    expected = mask_type(queries, keys)
    if mask != expected:
        raise ShapeError(f"the attention mask {mask} must say which keys each query sees, {expected}: a stack's "
                         "attention_mask of the same sequence")


def check_reader(causal: bool, window: Optional[int], producers: dict[str, tuple[str, Attrs]]
                 ) -> list[tuple[str, str]]:
    """An attention of `causal` and `window` reads a mask of the same: what its cache keeps is its window's."""
    if PORT not in producers:
        return []
    op, attrs = producers[PORT]
    if not isinstance(attrs, AttentionMaskAttrs):
        return [(PORT, f"the attention mask must be an attention_mask's output (attention_mask(x, causal = ..., "
                       f"window = ...)), got {op}'s")]
    if (attrs.causal, attrs.window) != (causal, window):
        return [(PORT, f"the attention ({_seeing(causal, window)}) reads a mask made for "
                       f"{_seeing(attrs.causal, attrs.window)}: make its attention_mask of the attention's causality "
                       "and window")]
    return []


def _seeing(causal: bool, window: Optional[int]) -> str:
    """`causal = true, window = 4` in words: "causal, window 4"."""
    return ("causal" if causal else "not causal") + (f", window {window}" if window is not None else ", no window")


def _shape(shapes: Shapes, a: AttentionMaskAttrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input", min_rank=3)
    return mask_type(x, x), {}


def _module(a: AttentionMaskAttrs, i: Inferred, w: Written) -> pyast.expr:
    causal = {"causal": w.attr("causal")} if w.from_config("causal") or not a.causal else {}
    window = {"window": w.attr("window")} if a.window is not None or w.from_config("window") else {}
    return call("AttentionMask", **causal, **window)


def _details(a: AttentionMaskAttrs, i: Inferred) -> list[str]:
    sees = "each query sees the keys up to it" if a.causal else "each query sees every key"
    if a.window is not None:
        sees = f"each query sees its last {a.window} positions" if a.causal else \
            f"each query sees the keys fewer than {a.window} positions away"
    return [sees]


ATTENTION_MASK = OpDef(
    name="attention_mask",
    doc="which keys each query may see (causality, a sliding window, a padded row's padding, another packed "
        "document's positions), made once for the attentions of a stack",
    family=Family.POSITION, inputs=(Input("x"),), attrs=AttentionMaskAttrs, infer=_shape, params=lambda a, i: {},
    module=_module, call=lambda target, inputs, a, cache: call(
        f"self.{target}", inputs["x"], **({"cache": variable("cache")} if cache else {})),
    uses_cache=True, title="Attention Mask", details=_details,
)
