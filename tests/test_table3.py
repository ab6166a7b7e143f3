"""The paper's model variations (Table 3, §6.1, §6.3) as specs: each compiles, and each differs from
the base model in exactly what its row names. The comparison reads the compiled graphs (and the
train/decode sections), not the spec files."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

import xspec

SPECS = Path(__file__).resolve().parent.parent / "specs"

# Each row's changes from the base model, in the paper's terms (PAPER.md, Table 3 and §6.3).
ROWS: dict[str, dict[str, object]] = {
    # (A) heads at constant computation: h * d_k = h * d_v = d_model.
    "A_heads1": {"heads": 1, "d_k": 512, "d_v": 512},
    "A_heads4": {"heads": 4, "d_k": 128, "d_v": 128},
    "A_heads16": {"heads": 16, "d_k": 32, "d_v": 32},
    "A_heads32": {"heads": 32, "d_k": 16, "d_v": 16},
    # (B) the key size only.
    "B_dk16": {"d_k": 16},
    "B_dk32": {"d_k": 32},
    # (C) model size.
    "C_layers2": {"layers": 2},
    "C_layers4": {"layers": 4},
    "C_layers8": {"layers": 8},
    "C_dmodel256": {"d_model": 256, "d_k": 32, "d_v": 32},
    "C_dmodel1024": {"d_model": 1024, "d_k": 128, "d_v": 128},
    "C_dff1024": {"d_ff": 1024},
    "C_dff4096": {"d_ff": 4096},
    # (D) regularization (§5.4).
    "D_drop0": {"dropout": 0.0},
    "D_drop02": {"dropout": 0.2},
    "D_ls0": {"label_smoothing": 0.0},
    "D_ls02": {"label_smoothing": 0.2},
    # (E) learned positional embeddings.
    "E_learned_positions": {"positions": "learned_positions"},
    # big: N 6, d_model 1024, d_ff 4096, h 16 (so d_k = d_v = 64, as base), P_drop 0.3, 300K steps;
    # §6.1: the last 20 checkpoints are averaged.
    "big": {"d_model": 1024, "d_ff": 4096, "heads": 16, "dropout": 0.3, "train.max_steps": 300_000,
            "train.average_last": 20},
    # EN-FR big: P_drop 0.1 (base's value) and the 32000 word-piece vocabulary (§5.1).
    "big_enfr": {"d_model": 1024, "d_ff": 4096, "heads": 16, "vocab": 32000, "train.max_steps": 300_000,
                 "train.average_last": 20},
}

PARSING = {"layers": 4, "d_model": 1024, "d_k": 128, "d_v": 128, "vocab": 16000,
           "decode.beam": 21, "decode.length_penalty": 0.3, "decode.max_len_b": 300}


@cache
def compiled(path: Path):
    return xspec.compile(str(path))


def base():
    return compiled(SPECS / "base.xspec")


def one(values: set):
    assert len(values) == 1, f"expected one value across the graph, got {sorted(values, key=str)}"
    return next(iter(values))


def graph_facts(spec) -> dict[str, object]:
    """What a row can change, read from the graph by node names and shapes (docs/graph.md)."""
    g = spec.graph
    nodes = dict(g.nodes(data=True))
    attention = [d for d in nodes.values() if d["node"].op == "attention"]
    layers_per_stack = {stack: len({n.split(".")[2] for n in nodes if n.startswith(f"{stack}.layers.")})
                        for stack in ("encoder", "decoder")}
    return {
        "layers": one(set(layers_per_stack.values())),
        "d_model": nodes["output.memory"]["node"].shape.dims[-1],
        "d_ff": one({d["node"].shape.dims[-1] for n, d in nodes.items() if n.endswith(".ffn.w_1")}),
        "heads": one({d["node"].attrs.heads for d in attention}),
        "d_k": one({d["node"].attrs.d_k for d in attention}),
        "d_v": one({d["node"].attrs.d_v for d in attention}),
        "dropout": one({d["node"].attrs.p for d in nodes.values() if d["node"].op == "dropout"}),
        "positions": one({d["node"].op for n, d in nodes.items() if n.endswith(".embedding.positions")}),
        "vocab": nodes["output.logits"]["node"].shape.dims[-1],
        "label_smoothing": spec.train.label_smoothing,
        "train.max_steps": spec.train.max_steps,
        "train.average_last": spec.train.average_last,
        "decode.beam": spec.decode.beam,
        "decode.length_penalty": spec.decode.length_penalty,
        "decode.max_len_b": spec.decode.max_len_b,
    }


def differences(spec) -> dict[str, object]:
    ours, theirs = graph_facts(spec), graph_facts(base())
    return {k: v for k, v in ours.items() if v != theirs[k]}


def test_base_facts_are_the_papers():
    assert {k: v for k, v in graph_facts(base()).items() if not k.startswith(("train.", "decode."))} == {
        "layers": 6, "d_model": 512, "d_ff": 2048, "heads": 8, "d_k": 64, "d_v": 64, "dropout": 0.1,
        "positions": "sinusoidal_positions", "vocab": 37000, "label_smoothing": 0.1}


def test_every_row_has_a_file_and_every_file_a_row():
    assert {p.stem for p in (SPECS / "table3").glob("*.xspec")} == set(ROWS)


@pytest.mark.parametrize("row", sorted(ROWS))
def test_variant_differs_from_base_in_exactly_its_row(row):
    spec = compiled(SPECS / "table3" / f"{row}.xspec")
    assert spec.name == row
    assert differences(spec) == ROWS[row]


def test_parsing_model_is_section_6_3():
    spec = compiled(SPECS / "parsing.xspec")
    assert differences(spec) == PARSING
    assert spec.decode.max_len_a == 1.0          # output length up to input length + 300


@pytest.mark.parametrize("row", ["A_heads1", "A_heads4", "A_heads16", "A_heads32", "B_dk16", "B_dk32",
                                 "D_drop0", "D_drop02", "D_ls0", "D_ls02", "E_learned_positions"])
def test_same_size_rows_change_only_the_named_op_attributes(row):
    """Rows A, B, D and E keep the graph's structure: same nodes and edges; only the named attributes
    of attention, dropout or position ops change."""
    spec, reference = compiled(SPECS / "table3" / f"{row}.xspec"), base()
    assert set(spec.graph.nodes) == set(reference.graph.nodes)
    assert set(spec.graph.edges) == set(reference.graph.edges)
    changed = set()
    for node, data in spec.graph.nodes(data=True):
        other = reference.graph.nodes[node]
        if data["node"].op != other["node"].op:
            changed.add((other["node"].op, "op"))
            continue
        mine, theirs = data["node"].attrs.model_dump(), other["node"].attrs.model_dump()
        changed |= {(data["node"].op, key) for key in mine if mine[key] != theirs[key]}
    expected = {
        "A": {("attention", "heads"), ("attention", "d_k"), ("attention", "d_v")},
        "B": {("attention", "d_k")},
        "D_drop": {("dropout", "p")},
        "D_ls": set(),
        "E": {("sinusoidal_positions", "op")},
    }
    assert changed == next(v for k, v in expected.items() if row.startswith(k))


@pytest.mark.parametrize("row, layers", [("C_layers2", 2), ("C_layers4", 4), ("C_layers8", 8)])
def test_layer_rows_repeat_the_base_layer(row, layers):
    """Row C's N: the same layer, repeated N times; every layer's ops are the base layer's."""
    spec, reference = compiled(SPECS / "table3" / f"{row}.xspec"), base()

    def layer_ops(graph, stack, index):
        prefix = f"{stack}.layers.{index}."
        return sorted((n[len(prefix):], d["node"].op, str(d["node"].attrs)) for n, d in graph.nodes(data=True)
                      if n.startswith(prefix))

    for stack in ("encoder", "decoder"):
        for index in range(layers):
            assert layer_ops(spec.graph, stack, index) == layer_ops(reference.graph, stack, 0)
        assert layer_ops(spec.graph, stack, layers) == []


@pytest.mark.parametrize("path", sorted((SPECS / "table3").glob("*.xspec")) + [SPECS / "parsing.xspec"],
                         ids=lambda p: p.stem)
def test_variant_files_are_a_few_lines(path):
    """The product's promise: a variation is an import and the values its row changes."""
    code = [line for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 12
    assert re.match(r'import "\.\./(base|big)\.xspec"|import "base\.xspec"', code[0])


# --- the sweep's view of Table 3 (xspec/sweep/) and its committed page (docs/table3/) ------------

ROOT = SPECS.parent
PAGE = ROOT / "docs" / "table3"


def test_every_table3_row_has_the_papers_numbers_and_direction():
    """big_enfr is §6.1's EN-FR model, not a row of Table 3: it is trained but not judged."""
    from xspec.sweep.paper import PAPER_DIRECTIONS, PAPER_TABLE3

    assert set(PAPER_TABLE3) == set(ROWS) - {"big_enfr"} | {"base"}
    assert set(PAPER_DIRECTIONS) == set(PAPER_TABLE3) - {"base"}
    assert all(set(d) <= {"better", "worse", "same"} for d in PAPER_DIRECTIONS.values())
    # §6.2 and §5.4 in words: one head worse, smaller d_k worse, bigger better, no dropout worse, label
    # smoothing hurts perplexity but helps BLEU, learned positions the same.
    assert PAPER_DIRECTIONS["A_heads1"] == PAPER_DIRECTIONS["B_dk16"] == PAPER_DIRECTIONS["D_drop0"] == ("worse",) * 2
    assert PAPER_DIRECTIONS["C_dmodel1024"] == PAPER_DIRECTIONS["C_layers8"] == ("better",) * 2
    assert PAPER_DIRECTIONS["D_ls0"] == ("better", "worse")
    assert PAPER_DIRECTIONS["E_learned_positions"] == PAPER_DIRECTIONS["A_heads16"] == ("same",) * 2


@pytest.mark.parametrize("path", [SPECS / "base.xspec", *sorted((SPECS / "table3").glob("*.xspec"))],
                         ids=lambda p: p.stem)
def test_every_row_trains_at_half_width(path):
    """bench/table3.sh trains every row at --width-divisor 2: each width must halve (A_heads32: d_k 16 -> 8)."""
    from xspec.sweep.runner import shrink

    assert "--width-divisor \"$DIVISOR\"" in (ROOT / "bench" / "table3.sh").read_text()
    shrunk = shrink(path, {}, 2)
    assert shrunk["d_model"] == compiled(path).params["d_model"] // 2


def test_the_committed_page_publishes_no_unlearned_numbers():
    """Until the sweep has run at a scale at which its models learn, docs/table3 gives the command, explains the
    verdicts and keeps the paper's Table 3: no table, CSV or curves from models that did not learn."""
    from xspec.sweep.paper import PAPER_TABLE3

    assert sorted(p.name for p in PAGE.iterdir()) == ["table3.md"]
    text = (PAGE / "table3.md").read_text(encoding="utf-8")
    assert "has not been run at a scale at which its models learn" in text
    assert "bench/table3.sh" in text.split("```")[1]
    for phrase in ("noise band", "above noise", "within noise", "did not learn", "agrees", "disagrees", "cannot tell"):
        assert phrase in text.lower()
    for name, (ppl, bleu) in PAPER_TABLE3.items():        # the paper's table, for reference
        assert re.search(rf"\| {ppl:.2f} \| {bleu:.1f} \|", text), name
