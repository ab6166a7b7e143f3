"""`xspec sweep`: two small variants and their base, trained a few steps on a small corpus; the
report's shape; a second run retrains nothing; a different budget is refused."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from xspec.runtime.demo_data import generate_split

from xspec.cli import main
from xspec.plot import DEFAULT_SIZE, load_curves
from xspec.sweep import find_variants, row_label

SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A folder laid out like Multi30k: train.en/.de and val.en/.de (the demo language pair)."""
    folder = tmp_path_factory.mktemp("corpus")
    for split, name, size in (("train", "train", 300), ("valid", "val", 12)):
        pairs = generate_split(split, size)
        (folder / f"{name}.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (folder / f"{name}.de").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("variants")
    tiny = (SPECS / "tiny.xspec").as_posix()
    (folder / "A_heads2.xspec").write_text(
        f'import "{tiny}"\nmodel A_heads2 extends transformer_tiny {{ set heads = 2 }}\n')
    (folder / "C_layers1.xspec").write_text(
        f'import "{tiny}"\nmodel C_layers1 extends transformer_tiny {{ set layers = 1 }}\n')
    return folder


def sweep_args(variants: Path, corpus: Path, out: Path, steps: int = 3) -> list[str]:
    return ["sweep", str(variants), "--base", str(SPECS / "tiny.xspec"), "--steps", str(steps),
            "--data", str(corpus), "--dev-lines", "6", "--width-divisor", "4", "--threads", "1",
            "--set", "vocab=120", "--set", "train.batch_tokens=400", "--set", "train.warmup_steps=4",
            "--out", str(out / "runs"), "--report", str(out / "report")]


@pytest.fixture(scope="module")
def swept(variants, corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    assert main(sweep_args(variants, corpus, out)) == 0
    return out


def test_report_has_a_row_per_model_with_the_varied_columns(swept):
    rows = list(csv.DictReader((swept / "report" / "table3.csv").open(encoding="utf-8")))
    assert [(r["row"], r["spec"]) for r in rows] == [("base", "tiny"), ("A", "A_heads2"), ("C", "C_layers1")]
    base, heads, layers = rows
    assert (base["heads"], base["d_k"], base["layers"]) == ("4", "32", "2")
    assert (heads["heads"], heads["d_k"], heads["d_v"]) == ("2", "64", "64")
    assert layers["layers"] == "1"
    # Trained at 1/4 of the widths: d_model 128 -> 32, d_k 32 -> 8 (64 -> 16 for two heads).
    assert (base["trained_d_model"], base["trained_d_k"], heads["trained_d_k"]) == ("32", "8", "16")
    for row in rows:
        assert row["train_steps"] == "3"
        assert float(row["dev_ppl"]) > 1 and float(row["dev_bleu"]) >= 0
        assert int(row["params_trained"]) < int(row["params_spec"])


def test_markdown_report_starts_with_its_command(swept):
    text = (swept / "report" / "table3.md").read_text(encoding="utf-8")
    command = text.split("```")[1].strip()
    assert command.startswith("xspec sweep ") and "--steps 3" in command and "--width-divisor 4" in command
    assert "not the paper's numbers" in text
    header = next(line for line in text.splitlines() if line.startswith("| row |"))
    assert [c.strip() for c in header.strip("|").split("|")][:11] == [
        "row", "spec", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "positions"]
    heads_row = next(line for line in text.splitlines() if "| A_heads2 |" in line)
    cells = [c.strip() for c in heads_row.strip("|").split("|")]
    assert cells[2:11] == ["", "", "", "2", "64", "64", "", "", ""]   # blank: as base


def test_report_has_the_training_curves_of_every_run(swept):
    png = (swept / "report" / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")   # the IHDR chunk
    assert (width, height) == DEFAULT_SIZE
    names = ("tiny", "A_heads2", "C_layers1")
    curves = load_curves([swept / "runs" / "runs" / name for name in names])
    assert [(c.label, c.last_step, len(c.loss.x)) for c in curves] == [(name, 3, 3) for name in names]
    assert "![Training curves of every run](curves.png)" in (swept / "report" / "table3.md").read_text()


def test_a_second_run_retrains_nothing(swept, variants, corpus, capsys):
    finished = swept / "runs" / "runs" / "A_heads2" / "metrics.json"
    before = finished.stat().st_mtime_ns
    capsys.readouterr()
    assert main(sweep_args(variants, corpus, swept)) == 0
    out = capsys.readouterr().out
    assert out.count("finished earlier, not retrained") == 3
    assert finished.stat().st_mtime_ns == before


def test_a_different_budget_is_refused(swept, variants, corpus, capsys):
    assert main(sweep_args(variants, corpus, swept, steps=5)) == 1
    assert "holds a sweep with different settings (steps)" in capsys.readouterr().err


def test_shared_vocabulary(swept):
    runs = swept / "runs" / "runs"
    models = {(runs / name / "sentencepiece.model").read_bytes() for name in ("tiny", "A_heads2", "C_layers1")}
    assert len(models) == 1


def test_variant_order_and_row_labels(tmp_path):
    for name in ("C_dmodel1024", "big", "A_heads16", "C_dmodel256", "A_heads4"):
        (tmp_path / f"{name}.xspec").write_text("")
    (tmp_path / "base.xspec").write_text("")
    found = [p.stem for p in find_variants(tmp_path, tmp_path / "base.xspec")]
    assert found == ["base", "A_heads4", "A_heads16", "C_dmodel256", "C_dmodel1024", "big"]
    assert [row_label(n, n == "base") for n in found] == ["base", "A", "A", "C", "C", "big"]


def test_missing_corpus_file_is_one_message(variants, tmp_path, capsys):
    assert main(sweep_args(variants, tmp_path, tmp_path)) == 1
    err = capsys.readouterr().err
    assert err.startswith("xspec: error: ") and "train.en: missing" in err and "Traceback" not in err


def test_the_committed_report_is_complete():
    """docs/table3 holds the sweep over every Table 3 row, with the command that made it."""
    report = SPECS.parent / "docs" / "table3"
    rows = list(csv.DictReader((report / "table3.csv").open(encoding="utf-8")))
    names = {p.stem for p in (SPECS / "table3").glob("*.xspec")}
    assert {r["spec"] for r in rows} == names | {"base"}
    assert all(r["dev_ppl"] for r in rows)
    text = (report / "table3.md").read_text(encoding="utf-8")
    assert "xspec sweep specs/table3/" in text.split("```")[1]
    base_row = next(line for line in text.splitlines() if line.startswith("| base | base |"))
    assert base_row.rstrip(" |").endswith("| 4.92 | 25.8")          # the paper's figures beside ours
    assert len({r["train_steps"] for r in rows}) == 1             # the same budget for every model
