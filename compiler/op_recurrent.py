"""The op table's entries for the recurrent mixers of hybrid models (xspec/nn/convolution.py,
xspec/nn/delta_rule.py, xspec/nn/state_space.py): the short causal convolution on its own, Gated
DeltaNet (Yang et al., 2024; Qwen3-Next's linear attention) and Mamba-2's selective state space (Dao &
Gu, 2024; Bamba, Nemotron-H). Each maps [batch, len, d_model] to the same shape, keeps a state of fixed
size per sequence when decoding (the convolution's last inputs, and the mixers' recurrent state, in the
decoder cache), and the mixers compute a chunk of positions at a time in training."""

from __future__ import annotations

import ast as pyast
from typing import Optional

from pydantic import Field

from .opdef import Attrs, Family, Inferred, Input, OpDef, Shapes, Written, size
from .python_code import binary, call, constant, product, variable
from .shapes import TensorType, concrete_last, require


class GatedDeltaNetAttrs(Attrs):
    k_heads: int = Field(gt=0)  # query and key heads (linear_num_key_heads)
    v_heads: int = Field(gt=0)  # value heads, a multiple of k_heads (linear_num_value_heads)
    d_k: int = Field(gt=0)  # linear_key_head_dim
    d_v: int = Field(gt=0)  # linear_value_head_dim
    conv_kernel: int = Field(4, gt=0)  # the short causal convolution's positions (linear_conv_kernel_dim)
    norm_eps: float = Field(1e-6, gt=0)  # the gated output norm's
    chunk_size: int = Field(64, gt=0)  # positions computed together in training and prefill


class ShortConvolutionAttrs(Attrs):
    kernel: int = Field(4, gt=0)  # the positions each output reads: its own and the kernel - 1 before it
    bias: bool = False


class Mamba2Attrs(Attrs):
    heads: int = Field(gt=0)  # mamba_n_heads
    head_dim: int = Field(gt=0)  # mamba_d_head
    state_size: int = Field(gt=0)  # mamba_d_state: B's and C's features per group
    groups: int = Field(1, gt=0)  # mamba_n_groups, which divides heads
    conv_kernel: int = Field(4, gt=0)  # mamba_d_conv
    conv_bias: bool = True
    bias: bool = False  # the input and output projections' (mamba_proj_bias)
    dt_min: float = Field(0.0, ge=0)  # time_step_limit: dt clamped to [dt_min, dt_max]
    dt_max: Optional[float] = Field(None, gt=0)  # None: no upper limit
    chunk_size: int = Field(256, gt=0)  # mamba_chunk_size
    norm_eps: float = Field(1e-6, gt=0)


def _same_width(shapes: Shapes, a: Attrs) -> tuple[TensorType, Inferred]:
    x = require(shapes["x"], "the input", min_rank=2)
    return x, {"d_model": concrete_last(x, "the input")}


def _weights_read(shapes: dict[str, tuple[int, ...]]) -> int:
    """Multiply-adds a position spends in a mixer's projections and convolution: each weight element once
    (the norms' weights scale, they multiply no input)."""
    total = 0
    for name, shape in shapes.items():
        if name.endswith(".weight") and not name.startswith("norm."):
            count = 1
            for dim in shape:
                count *= dim
            total += count
    return total


def _call(target: str, inputs: dict[str, pyast.expr], attrs: Attrs, cache: bool) -> pyast.expr:
    return call(f"self.{target}", inputs["x"], **({"cache": variable("cache")} if cache else {}))


# --- the short causal convolution ----------------------------------------------------------------


def _short_convolution_module(a: ShortConvolutionAttrs, i: Inferred, w: Written) -> pyast.expr:
    return call("ShortConvolution", w.width("x"), w.attr("kernel"), bias=w.attr("bias"))


SHORT_CONVOLUTION = OpDef(
    name="short_convolution",
    doc="SiLU of a causal depthwise convolution over the last `kernel` positions (H3's and Mamba's short "
        "convolution)",
    family=Family.RECURRENT, inputs=(Input("x"),), attrs=ShortConvolutionAttrs, infer=_same_width,
    params=lambda a, i: {"conv1d.weight": (size(i, "d_model"), 1, a.kernel),
                         **({"conv1d.bias": (size(i, "d_model"),)} if a.bias else {})},
    module=_short_convolution_module, call=_call, uses_cache=True, title="Short Convolution",
    details=lambda a, i: [f"causal, depthwise, over {a.kernel} positions; SiLU"],
    flops=lambda a, i, n, n_in: {"recurrent": 2 * n * size(i, "d_model") * a.kernel},
    recurrent_state=lambda a, i: (a.kernel - 1) * size(i, "d_model"),
)


# --- Gated DeltaNet ------------------------------------------------------------------------------


def _delta_sizes(a: GatedDeltaNetAttrs, d: int) -> dict[str, tuple[int, ...]]:
    group = a.v_heads // a.k_heads
    channels = 2 * a.k_heads * a.d_k + a.v_heads * a.d_v  # q, k and v, convolved
    return {"in_proj_qkvz.weight": (a.k_heads * (2 * a.d_k + 2 * group * a.d_v), d),
            "in_proj_ba.weight": (2 * a.v_heads, d), "conv1d.weight": (channels, 1, a.conv_kernel),
            "dt_bias": (a.v_heads,), "A_log": (a.v_heads,), "norm.weight": (a.d_v,),
            "out_proj.weight": (d, a.v_heads * a.d_v)}


def _delta_check(a: GatedDeltaNetAttrs) -> list[tuple[str, str]]:
    if a.v_heads % a.k_heads:
        return [("v_heads", f"v_heads = {a.v_heads} must be a multiple of k_heads = {a.k_heads}: each query/key "
                            "head serves a group of value heads")]
    return []


def _delta_module(a: GatedDeltaNetAttrs, i: Inferred, w: Written) -> pyast.expr:
    return call("GatedDeltaNet", w.width("x"), w.attr("k_heads"), w.attr("v_heads"), w.attr("d_k"), w.attr("d_v"),
                conv_kernel=w.attr("conv_kernel"), eps=w.attr("norm_eps"), chunk_size=w.attr("chunk_size"))


def _delta_flops(a: GatedDeltaNetAttrs, i: Inferred, n: int, n_in: dict[str, int]) -> dict[str, int]:
    """The projections and convolution, and per position and value head the state's four products
    (k^T S, its correction, q^T S, the decay's scaling): what the recurrent form does; the chunked form
    computes the same state in more but larger products."""
    weights = _weights_read(_delta_sizes(a, size(i, "d_model")))
    return {"recurrent": 2 * n * (weights + 4 * a.v_heads * a.d_k * a.d_v)}


GATED_DELTA_NET = OpDef(
    name="gated_delta_net",
    doc="Gated DeltaNet: linear attention whose per-head state decays and is written by the delta rule "
        "(Yang et al., 2024; Qwen3-Next)",
    family=Family.RECURRENT, inputs=(Input("x"),), attrs=GatedDeltaNetAttrs, infer=_same_width,
    params=lambda a, i: _delta_sizes(a, size(i, "d_model")), check=_delta_check,
    module=_delta_module, call=_call, uses_cache=True, title="Gated DeltaNet",
    details=lambda a, i: [f"{a.k_heads} query/key heads of {a.d_k}, {a.v_heads} value heads of {a.d_v}",
                          f"convolution over {a.conv_kernel} positions; state {a.v_heads} x {a.d_k} x {a.d_v}"],
    flops=_delta_flops, output_weight="out_proj.weight",
    recurrent_state=lambda a, i: a.v_heads * a.d_k * a.d_v + (a.conv_kernel - 1) * (
        2 * a.k_heads * a.d_k + a.v_heads * a.d_v),
)


# --- Mamba-2 -------------------------------------------------------------------------------------


def _mamba_sizes(a: Mamba2Attrs, d: int) -> dict[str, tuple[int, ...]]:
    inner = a.heads * a.head_dim
    channels = inner + 2 * a.groups * a.state_size  # x, B and C, convolved
    sizes: dict[str, tuple[int, ...]] = {"in_proj.weight": (inner + channels + a.heads, d),
                                         "conv1d.weight": (channels, 1, a.conv_kernel), "dt_bias": (a.heads,),
                                         "A_log": (a.heads,), "D": (a.heads,), "norm.weight": (inner,),
                                         "out_proj.weight": (d, inner)}
    if a.bias:
        sizes |= {"in_proj.bias": (inner + channels + a.heads,), "out_proj.bias": (d,)}
    if a.conv_bias:
        sizes["conv1d.bias"] = (channels,)
    return sizes


def _mamba_check(a: Mamba2Attrs) -> list[tuple[str, str]]:
    problems = []
    if a.heads % a.groups:
        problems.append(("groups", f"groups = {a.groups} must divide heads = {a.heads}: each group of B and C "
                                   "serves whole heads"))
    if a.dt_max is not None and a.dt_max < a.dt_min:
        problems.append(("dt_max", f"dt_max = {a.dt_max} is below dt_min = {a.dt_min}"))
    return problems


def _mamba_module(a: Mamba2Attrs, i: Inferred, w: Written) -> pyast.expr:
    """Mamba2Mixer(d_model, heads, head_dim, state_size, groups, ...), its gated norm over each group's
    features (heads * head_dim / groups)."""
    inner = product(w.attr("heads"), w.attr("head_dim")) if w.from_config("heads") or w.from_config("head_dim") \
        else constant(a.heads * a.head_dim)
    group = binary(inner, pyast.FloorDiv(), w.attr("groups")) if isinstance(inner, pyast.BinOp) \
        or w.from_config("groups") else constant(a.heads * a.head_dim // a.groups)
    norm = call("GroupRMSNorm", inner, group, w.attr("norm_eps"))
    limit = pyast.Tuple([w.attr("dt_min"), w.attr("dt_max")], pyast.Load())
    return call("Mamba2Mixer", w.width("x"), w.attr("heads"), w.attr("head_dim"), w.attr("state_size"),
                w.attr("groups"), conv_kernel=w.attr("conv_kernel"), conv_bias=w.attr("conv_bias"),
                bias=w.attr("bias"), dt_limit=limit, chunk_size=w.attr("chunk_size"), norm=norm)


def _mamba_flops(a: Mamba2Attrs, i: Inferred, n: int, n_in: dict[str, int]) -> dict[str, int]:
    """The projections and convolution, and per position and head the state's products (the write
    x B^T, the read h C): what the recurrent form does."""
    weights = _weights_read(_mamba_sizes(a, size(i, "d_model")))
    return {"recurrent": 2 * n * (weights + 2 * a.heads * a.head_dim * a.state_size)}


MAMBA2 = OpDef(
    name="mamba2",
    doc="Mamba-2's selective state space mixer, SSD (Dao & Gu, 2024; Bamba, Nemotron-H)",
    family=Family.RECURRENT, inputs=(Input("x"),), attrs=Mamba2Attrs, infer=_same_width,
    params=lambda a, i: _mamba_sizes(a, size(i, "d_model")), check=_mamba_check,
    module=_mamba_module, call=_call, uses_cache=True, title="Mamba-2",
    details=lambda a, i: [f"{a.heads} heads of {a.head_dim}, state {a.state_size} in {a.groups} group(s)",
                          f"convolution over {a.conv_kernel} positions"],
    flops=_mamba_flops, output_weight="out_proj.weight",
    recurrent_state=lambda a, i: a.heads * a.head_dim * a.state_size + (a.conv_kernel - 1) * (
        a.heads * a.head_dim + 2 * a.groups * a.state_size),
)
