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
from xspec.compiler.cost import example_flops, flops, memory
from xspec.stats.parameters import breakdown
from xspec.stats.train_cost import PAPER_RUNS, paper_run, train_cost

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
    """The convention of docs/stats.md: every op's output, plus what each attention's SDPA keeps: Q, K,
    V, the per-head context and a log-sum-exp per query and head."""
    tokens = B * n
    embed = 3 * tokens * d + n * d                    # embedding, + positions (no batch), dropout
    attention = tokens * d + tokens * h * (2 * dk + 2 * dv + 1)
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
    assert m.loss == 2 * 4 * (3 * 10) * 37000          # log-probabilities and their gradient, float32
    assert m.total == 16 * P + m.activations + m.loss


def test_activation_estimate_is_near_what_autograd_keeps():
    spec = xspec.compile(str(SPECS / "tiny.xspec"))
    model = spec.build(device="cpu").train()
    batch, n = 4, 20
    saved: dict = {}

    def keep(t):
        saved[(t.data_ptr(), tuple(t.shape), t.dtype)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):    # SDPA's kernels, as in training
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
    assert "train_cost" not in out                    # only when asked for
    plan = out["memory_plan"]                         # what `xspec train` would plan on this machine's CPU
    assert plan["fits"] and plan["plan"].startswith("update of 25,000 tokens ") and 20 <= plan["pass_tokens"] <= 25000


def test_cli_text_names_the_comparison_rows(capsys):
    assert main(["stats", str(SPECS / "tiny.xspec"), "--set", "layers=1", "-n", "16"]) == 0
    text = capsys.readouterr().out
    assert "Forward FLOPs per token at n = 16" in text
    assert "recurrent (comparison)" in text and "not layers of this spec" in text
    assert "Training cost" not in text
    assert "xspec train here (float32, n = 16): update of 4,096 tokens in one pass; estimated peak " in text


# --- parameters by component, and the paper's 65M / 213M (docs/stats.md) -------------------------

def hand_components(V, d, dff, h, dk, dv, N, **_):
    """Per layer: attention 2 d h d_k + 2 d h d_v weights (W^Q, W^K, W^V, W^O), 2 h d_k + h d_v + d biases;
    FFN 2 d d_ff weights, d_ff + d biases; a LayerNorm per sublayer, 2 d each. Encoder layers have one
    attention and two sublayers, decoder layers two and three."""
    attention_w, attention_b = 2 * d * h * dk + 2 * d * h * dv, 2 * h * dk + h * dv + d
    ffn_w, ffn_b, norm = 2 * d * dff, dff + d, 2 * d
    layers = {"attention weights": attention_w, "attention biases": attention_b, "feed-forward weights": ffn_w,
              "feed-forward biases": ffn_b}
    encoder = {k: N * v for k, v in layers.items()} | {"layer norms": N * 2 * norm}
    decoder = {k: N * v * (2 if k.startswith("attention") else 1) for k, v in layers.items()}
    return {"encoder": {"token embeddings": V * d, **encoder}, "decoder": {**decoder, "layer norms": N * 3 * norm}}


@pytest.mark.parametrize("spec_file, values, total", [("base.xspec", BASE, 63_082_496),
                                                      ("big.xspec", {**BASE, "d": 1024, "dff": 4096, "h": 16},
                                                       214_245_376)])
def test_parameter_breakdown_by_hand(spec_file, values, total):
    spec = xspec.compile(str(SPECS / spec_file))
    parts = breakdown(spec)
    assert parts == hand_components(**values)
    assert sum(sum(stack.values()) for stack in parts.values()) == spec.parameters == total
    V, d, dff, N = values["V"], values["d"], values["dff"], values["N"]
    assert V * d + N * (12 * d * d + 4 * d * dff + 2 * dff + 24 * d) == total      # docs/stats.md's formula


def test_parameter_breakdown_sums_to_the_compiled_count():
    for spec_file in ("table3/E_learned_positions.xspec", "table3/B_dk16.xspec", "lm.xspec", "parsing.xspec"):
        spec = xspec.compile(str(SPECS / spec_file))
        assert sum(sum(stack.values()) for stack in breakdown(spec).values()) == spec.parameters, spec_file
    learned = breakdown(xspec.compile(str(SPECS / "table3" / "E_learned_positions.xspec")))
    assert learned["decoder"]["positional embeddings"] == 1024 * 512


# Table 3's "params x 10^6" column, as printed in the paper.
TABLE3_PARAMS = {"base.xspec": 65, "table3/B_dk16.xspec": 58, "table3/B_dk32.xspec": 60,
                 "table3/C_layers2.xspec": 36, "table3/C_layers4.xspec": 50, "table3/C_layers8.xspec": 80,
                 "table3/C_dmodel256.xspec": 28, "table3/C_dmodel1024.xspec": 168, "table3/C_dff1024.xspec": 53,
                 "table3/C_dff4096.xspec": 90}


@pytest.mark.parametrize("vocab", [40_932, 41_160])
def test_table3_params_fit_a_larger_vocabulary_except_big(vocab):
    """docs/stats.md: with a shared vocabulary of 40,932 to 41,160 every row of Table 3 but big rounds to the
    paper's figure; big does not, for any vocabulary (it is 50.36M above row C's d_model 1024 in any count)."""
    for spec_file, millions in TABLE3_PARAMS.items():
        assert round(xspec.compile(str(SPECS / spec_file), overrides={"vocab": vocab}).parameters / 1e6) == millions
    for vocab in (37_000, 41_000):
        big = xspec.compile(str(SPECS / "big.xspec"), overrides={"vocab": vocab}).parameters
        wide = xspec.compile(str(SPECS / "table3/C_dmodel1024.xspec"), overrides={"vocab": vocab}).parameters
        assert big - wide == 12 * (2 * 1024 * 2048 + 2048)     # d_ff 2048 -> 4096 in 12 layers
    assert round((168e6 + 50_356_224) / 1e6) == 218 != 213


def test_no_vocabulary_gives_both_65m_and_213m():
    """Tied three ways, parameters = vocab x d_model + the rest; solve each figure's rounding interval."""
    rest = {name: xspec.compile(str(SPECS / f"{name}.xspec")).parameters - 37_000 * d
            for name, d in (("base", 512), ("big", 1024))}
    base = ((65e6 - 0.5e6 - rest["base"]) / 512, (65e6 + 0.5e6 - rest["base"]) / 512)
    big = ((213e6 - 0.5e6 - rest["big"]) / 1024, (213e6 + 0.5e6 - rest["big"]) / 1024)
    assert (math.ceil(base[0]), math.floor(base[1])) == (39_769, 41_721)
    assert (math.ceil(big[0]), math.floor(big[1])) == (35_296, 36_272)
    assert big[1] < base[0]


# --- training cost (Table 2) ---------------------------------------------------------------------

def test_train_cost_by_hand(base):
    """Base at n = 25: 100,000 steps x 3 (forward + backward) x 25,000 tokens x the forward FLOPs per token."""
    encoder, decoder = hand_flops_per_token(25, **BASE)
    cost = train_cost(base)
    assert (cost.steps, cost.batch_tokens, cost.length) == (100_000, 25_000, 25)
    assert cost.forward_per_token == encoder + decoder == 126_889_984
    assert cost.forward_per_step == 25_000 * (encoder + decoder)
    assert cost.total == 100_000 * 3 * 25_000 * 126_889_984
    # a token costs the linear layers once, plus QK^T and AV over n keys in 18 attention layers
    assert cost.per_token_slope == 2 * 18 * 8 * (64 + 64)
    assert cost.per_token_fixed + cost.per_token_slope * 25 == cost.forward_per_token
    assert train_cost(base, steps=10, length=50).total == 10 * 3 * 25_000 * sum(hand_flops_per_token(50, **BASE))


def test_a_training_step_is_what_torch_counts_forward_and_backward():
    """backward = 2 x forward: torch's counter over a real forward and backward pass of tiny."""
    n, batch = 9, 2
    spec = xspec.compile(str(SPECS / "tiny.xspec"), overrides={"train.batch_tokens": n * batch})
    model = spec.build(device="cpu").train()
    src = torch.randint(4, spec.vocab_size, (batch, n))
    tgt = torch.randint(4, spec.vocab_size, (batch, n))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(src, tgt, torch.zeros(batch, n, dtype=torch.bool)).sum().backward()
    cost = train_cost(spec, steps=7, length=n)
    assert counter.get_total_flops() == cost.per_step and cost.total == 7 * cost.per_step


def test_the_papers_estimates_reproduced():
    """Footnote 5: hours x 8 GPUs x 9.5 TFLOPS (P100); 12 hours for base, 3.5 days for big (§5.2)."""
    base_run, big_run = PAPER_RUNS
    assert base_run.estimate == pytest.approx(12 * 3600 * 8 * 9.5e12) == pytest.approx(3.2832e18)
    assert big_run.estimate == pytest.approx(84 * 3600 * 8 * 9.5e12) == pytest.approx(2.29824e19)
    assert float(f"{base_run.estimate:.1e}") == base_run.table2 == 3.3e18
    assert float(f"{big_run.estimate:.1e}") == big_run.table2 == 2.3e19


def test_specs_are_matched_to_the_papers_models(base):
    assert paper_run(base).model == "base"
    assert paper_run(xspec.compile(str(SPECS / "big.xspec"))).model == "big"
    assert paper_run(xspec.compile(str(SPECS / "table3" / "big_enfr.xspec"))).model == "big"
    assert paper_run(xspec.compile(str(SPECS / "table3" / "A_heads16.xspec"))) is None
    assert paper_run(xspec.compile(str(SPECS / "tiny.xspec"))) is None


def test_cli_train_cost(capsys):
    assert main(["stats", str(SPECS / "base.xspec"), "--train-cost"]) == 0
    text = capsys.readouterr().out
    assert "Forward FLOPs per token at n = 256" in text           # the usual report, unchanged, first
    assert "Training cost (Table 2): 100,000 steps x 25,000 target tokens" in text
    assert "forward, per token = 125,968,384 + 36,864 n  126,889,984" in text
    assert "total, 100,000 steps                           9.517e+17" in text
    assert "12 h x 8 P100     3.283e+18  3.3e+18   9.517e+17   0.29" in text
    assert "84 h x 8 P100     2.298e+19  2.3e+19           -      -" in text

    assert main(["stats", str(SPECS / "big.xspec"), "--train-cost", "--steps", "1000", "-n", "40", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)["train_cost"]
    assert (cost["steps"], cost["length"], cost["paper_model"]) == (1000, 40, "big")
    big = xspec.compile(str(SPECS / "big.xspec"))
    assert cost["total"] == 1000 * 3 * flops(big, 40).total * 25_000 // 40
    assert cost["ratio_to_table2"] == cost["total"] / 2.3e19
    assert [run["estimate"] for run in cost["paper"]] == [pytest.approx(3.2832e18), pytest.approx(2.29824e19)]


def test_cli_steps_needs_train_cost(capsys):
    assert main(["stats", str(SPECS / "tiny.xspec"), "--steps", "10"]) == xspec.UserError.exit_code
    assert "--steps is the schedule of --train-cost" in capsys.readouterr().err


def test_the_decoding_cache_per_position_is_read_off_the_spec():
    """Keys and values per self-attention layer (kv_heads x (d_k + d_v)); a sliding window caps its layers;
    latent attention keeps its latent and rotary key; attention over the encoder output is left out."""
    from xspec.stats import decoding_cache

    base = decoding_cache(xspec.compile("specs/base.xspec"), 256)
    assert (base.layers, base.per_position, base.windowed, base.at_length) == (6, 6 * 8 * 128, 0, 6 * 8 * 128 * 256)
    llama = decoding_cache(xspec.compile("specs/modern/llama.xspec"), 100)
    assert (llama.per_position, llama.at_length) == (2 * 2 * (32 + 32), 2 * 2 * 64 * 100)
    mistral = xspec.compile("specs/modern/mistral.xspec", overrides={"sliding_window": 10})
    windowed = decoding_cache(mistral, 100)
    per_layer = mistral.params["kv_heads"] * 2 * mistral.params["head_dim"]
    assert windowed.per_position == 0 and windowed.windowed == mistral.params["layers"] * per_layer
    assert windowed.at_length == windowed.windowed * 10
    latent = decoding_cache(xspec.compile("specs/modern/deepseek_v3.xspec"), 50)
    assert (latent.per_position, latent.at_length) == (2 * (32 + 8), 2 * 40 * 50)
