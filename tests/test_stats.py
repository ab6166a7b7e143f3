"""`xspec stats` against counts derived here by hand from the paper's formulas, and against what
PyTorch itself counts on the built model (torch's FLOP counter, autograd's saved tensors)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import xspec
from xspec.cli import main
from xspec.stats import compute
from xspec.stats.cost import example_flops, flops, memory

SPECS = Path(__file__).resolve().parent.parent / "specs"
BASE = dict(V=37000, d=512, dff=2048, h=8, dk=64, dv=64, N=6)


@pytest.fixture(scope="module")
def base():
    return xspec.compile(str(SPECS / "base.xspec"))


# --- parameters ----------------------------------------------------------------------------------

def hand_parameters(V, d, dff, h, dk, dv, N, **_):
    """§3: attention has W^Q, W^K (d x h d_k), W^V (d x h d_v), W^O (h d_v x d), with biases; the FFN
    two linears; each sublayer a LayerNorm (2d); one embedding matrix shared three ways (§3.4)."""
    attention = 2 * (d * h * dk + h * dk) + (d * h * dv + h * dv) + (h * dv * d + d)
    ffn = (d * dff + dff) + (dff * d + d)
    encoder_layer = attention + ffn + 2 * (2 * d)
    decoder_layer = 2 * attention + ffn + 3 * (2 * d)
    return V * d, N * encoder_layer, N * decoder_layer


def test_base_parameters_by_hand(base):
    embedding, encoder_layers, decoder_layers = hand_parameters(**BASE)
    stats = compute(base).to_json()["parameters"]
    assert stats["total"] == embedding + encoder_layers + decoder_layers == 63_082_496
    assert stats["blocks"]["encoder.embedding"] == embedding
    assert stats["blocks"]["encoder.layers"] == encoder_layers
    assert stats["blocks"]["decoder.layers"] == decoder_layers
    assert set(stats["tied"]) == {"decoder.embedding", "decoder.generator"}


@pytest.mark.parametrize("row, change", [("B_dk16", {"dk": 16}), ("A_heads32", {"h": 32, "dk": 16, "dv": 16}),
                                         ("C_dff4096", {"dff": 4096}), ("C_layers2", {"N": 2})])
def test_variant_parameters_by_hand(row, change):
    spec = xspec.compile(str(SPECS / "table3" / f"{row}.xspec"))
    assert compute(spec).parameters == sum(hand_parameters(**{**BASE, **change}))


def test_parameters_match_the_built_model():
    spec = xspec.compile(str(SPECS / "table3" / "E_learned_positions.xspec"),
                         overrides={"vocab": 300, "d_model": 64, "d_ff": 128, "layers": 2, "max_len": 50})
    model = spec.build(device="cpu")
    assert compute(spec).parameters == sum(p.numel() for p in model.parameters())   # shared tensors once


# --- FLOPs ---------------------------------------------------------------------------------------

def hand_flops_per_token(n, V, d, dff, h, dk, dv, N, **_):
    """2 FLOPs per multiply-add. Per target token (with its source token, n each): every linear once;
    each attention's QK^T and AV against n keys."""
    projections = d * h * dk * 2 + d * h * dv + h * dv * d
    scores_and_values = n * h * (dk + dv)
    ffn = 2 * d * dff
    encoder = N * (projections + scores_and_values + ffn)
    decoder = N * (2 * projections + 2 * scores_and_values + ffn) + d * V
    return 2 * encoder, 2 * decoder


@pytest.mark.parametrize("n", [1, 25, 256])
def test_base_flops_by_hand(base, n):
    encoder, decoder = hand_flops_per_token(n, **BASE)
    f = flops(base, n)
    assert f.by_stack == {"encoder": encoder, "decoder": decoder}
    assert f.per_token == encoder + decoder
    assert f.by_category["generator"] == 2 * 512 * 37000
    assert f.by_category["attention_scores"] == 2 * 18 * n * 8 * 64      # 18 attention layers


@pytest.mark.parametrize("spec_file, overrides", [
    ("tiny.xspec", {}),
    ("table3/B_dk16.xspec", {"vocab": 200, "d_model": 64, "d_ff": 96, "layers": 2}),
    ("table3/E_learned_positions.xspec", {"vocab": 200, "d_model": 32, "d_ff": 64, "layers": 1, "heads": 2}),
])
def test_flops_match_torchs_flop_counter(spec_file, overrides):
    """torch counts the matrix products the built model really runs (the math attention kernel, so
    that QK^T and AV are visible to the counter)."""
    spec = xspec.compile(str(SPECS / spec_file), overrides=overrides)
    model = spec.build(device="cpu").eval()
    n, batch = 9, 2
    src = torch.randint(4, spec.vocab_size, (batch, n))
    tgt = torch.randint(4, spec.vocab_size, (batch, n))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(src, tgt, torch.zeros(batch, n, dtype=torch.bool))
    assert counter.get_total_flops() == batch * flops(spec, n).total


def test_example_flops_with_a_source_and_target_of_their_own_lengths():
    """A padded batch's rows: source and target lengths differ, and every term follows its own."""
    spec = xspec.compile(str(SPECS / "tiny.xspec"))
    model = spec.build(device="cpu").eval()
    batch, src_len, tgt_len = 3, 11, 5
    src = torch.randint(4, spec.vocab_size, (batch, src_len))
    tgt = torch.randint(4, spec.vocab_size, (batch, tgt_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(src, tgt, torch.zeros(batch, src_len, dtype=torch.bool))
    assert counter.get_total_flops() == batch * example_flops(spec, {"src_len": src_len, "tgt_len": tgt_len})
    assert example_flops(spec, {"src_len": 7, "tgt_len": 7}) == flops(spec, 7).total


# --- memory --------------------------------------------------------------------------------------

def hand_activations(B, n, V, d, dff, h, dk, dv, N, **_):
    """The convention of docs/stats.md: every op's output, plus each attention's Q, K, V, softmax
    probabilities and per-head context."""
    tokens = B * n
    embed = 3 * tokens * d + n * d                    # embedding, + positions (no batch), dropout
    attention = tokens * d + tokens * h * (2 * dk + 2 * dv) + B * h * n * n
    sublayer = 3 * tokens * d                         # dropout, residual add, LayerNorm
    ffn = 2 * tokens * dff + tokens * d               # w_1, relu, w_2
    encoder_layer = attention + ffn + 2 * sublayer
    decoder_layer = 2 * attention + ffn + 3 * sublayer
    return 2 * embed + N * (encoder_layer + decoder_layer) + tokens * V


def test_base_memory_by_hand(base):
    m = memory(base, batch=3, length=10)
    P = 63_082_496
    assert (m.weights, m.gradients, m.adam) == (4 * P, 4 * P, 8 * P)     # float32; Adam: 2 moments
    assert m.activations == 4 * hand_activations(B=3, n=10, **BASE)
    assert m.total == 16 * P + m.activations


def test_activation_estimate_is_near_what_autograd_keeps():
    spec = xspec.compile(str(SPECS / "tiny.xspec"))
    model = spec.build(device="cpu").train()
    batch, n = 4, 20
    saved: dict = {}

    def keep(t):
        saved[(t.data_ptr(), tuple(t.shape), t.dtype)] = t.numel() * t.element_size()
        return t

    with sdpa_kernel(SDPBackend.MATH), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(torch.randint(4, 1000, (batch, n)), torch.randint(4, 1000, (batch, n)),
              torch.zeros(batch, n, dtype=torch.bool))
    weights = {p.data_ptr() for p in model.parameters()}
    measured = sum(size for (ptr, _, _), size in saved.items() if ptr not in weights)
    assert 0.7 * measured <= memory(spec, batch, n).activations <= 1.5 * measured


# --- Table 1 -------------------------------------------------------------------------------------

def test_table1_at_the_specs_n_and_d(base):
    n, d = 40, 512
    rows = {r.layer: r for r in compute(base, length=n, kernel=3, neighbourhood=8).table1}
    assert {k: v.in_spec for k, v in rows.items() if v.in_spec} == {
        "self-attention": 6, "self-attention (masked)": 6, "encoder-decoder attention": 6}
    for kind in ("self-attention", "self-attention (masked)", "encoder-decoder attention"):
        assert (rows[kind].complexity, rows[kind].sequential, rows[kind].path_length) == (n * n * d, 1, 1)
        assert rows[kind].multiply_adds == n * n * 8 * (64 + 64)
    recurrent = rows["recurrent (comparison)"]
    assert (recurrent.complexity, recurrent.sequential, recurrent.path_length) == (n * d * d, n, n)
    conv = rows["convolutional, k=3 (comparison)"]
    assert conv.complexity == 3 * n * d * d and conv.path_length == pytest.approx(math.log(n) / math.log(3))
    restricted = rows["self-attention restricted, r=8 (comparison)"]
    assert (restricted.complexity, restricted.path_length) == (8 * n * d, n / 8)


def test_defaults_follow_the_spec(base):
    stats = compute(base)
    assert stats.flops.length == 256                  # data.max_tokens, within max_len 1024
    assert stats.memory.batch == 25000 // 256         # train.batch_tokens per pass
    assert stats.d == 512


# --- the command ---------------------------------------------------------------------------------

def test_cli_json(capsys):
    assert main(["stats", str(SPECS / "table3" / "C_dmodel256.xspec"), "--length", "20", "--batch", "8",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["architecture"]["d_model"] == 256 and out["architecture"]["d_k"] == 32
    encoder, decoder = hand_flops_per_token(20, **{**BASE, "d": 256, "dk": 32, "dv": 32})
    assert out["flops"]["forward_per_token"] == encoder + decoder
    assert out["memory_bytes"]["batch"] == 8
    assert out["table1"]["d"] == 256 and out["table1"]["n"] == 20


def test_cli_text_names_the_comparison_rows(capsys):
    assert main(["stats", str(SPECS / "tiny.xspec"), "--set", "layers=1", "-n", "16"]) == 0
    text = capsys.readouterr().out
    assert "Forward FLOPs per token at n = 16" in text
    assert "recurrent (comparison)" in text and "not layers of this spec" in text
