"""`xspec sweep`: two small variants and their base (two seeds), trained a few steps on a small corpus:
the report's shape, the seeds' run directories, resuming, and the refusal to present models that did
not learn as a result. Then the noise band, the learning bar and the verdicts (Table 3, §6.2) on rows
with given figures."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from xspec.runtime.demo_data import generate_split

from xspec.cli import main
from xspec.commands import sweep as sweep_command
from xspec.plot import DEFAULT_SIZE, load_curves
from xspec.runtime.unigram import token_counts, unigram_perplexity
from xspec.sweep.report import render_csv, render_markdown
from xspec.sweep.rows import (DEFAULT_SEEDS, MIN_BLEU, Corpus, Row, Run, SweepConfig, learned, learning_threshold,
                             seed_runs)
from xspec.sweep.runner import find_variants, row_label
from xspec.sweep.verdicts import agreement, base_problem, compare, judge, noise_band

SPECS = Path(__file__).resolve().parent.parent / "specs"
NAMES = ("tiny", "A_heads2", "C_layers1")
RUNS = ("tiny", "tiny-seed2", "A_heads2", "C_layers1")


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


def sweep_args(variants: Path, corpus: Path, out: Path, steps: int = 3, seeds: int = 2,
               keep_going: bool = True) -> list[str]:
    """--keep-going: every row trains although base does not learn, so that every row's report can be checked."""
    return ["sweep", str(variants), "--base", str(SPECS / "tiny.xspec"), "--steps", str(steps),
            "--data", str(corpus), "--dev-lines", "6", "--width-divisor", "4", "--threads", "1", "--seeds", str(seeds),
            *(["--keep-going"] if keep_going else []),
            "--set", "vocab=120", "--set", "train.batch_tokens=400", "--set", "train.warmup_steps=4",
            "--out", str(out / "runs"), "--report", str(out / "report")]


@pytest.fixture(scope="module")
def swept(variants, corpus, tmp_path_factory) -> tuple[Path, str]:
    """The sweep's folder and its error: three steps teach nothing, so the command fails after the report."""
    out = tmp_path_factory.mktemp("sweep")
    capture = pytest.MonkeyPatch()
    errors: list[str] = []
    capture.setattr("sys.stderr", _Collect(errors))
    try:
        status = main(sweep_args(variants, corpus, out))
    finally:
        capture.undo()
    assert status == 1
    return out, "".join(errors)


class _Collect:
    def __init__(self, parts: list[str]) -> None:
        self.parts = parts

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def report_rows(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((out / "report" / "table3.csv").open(encoding="utf-8")))


# --- end to end ----------------------------------------------------------------------------------

def test_the_command_fails_after_writing_the_report_when_base_did_not_learn(swept):
    out, stderr = swept
    assert "Traceback" not in stderr
    error = next(line for line in stderr.splitlines() if line.startswith("xspec: error: "))
    assert error.startswith("xspec: error: the base model did not learn (tiny: dev PPL ")
    assert "tiny-seed2: dev PPL" in error and "dev BLEU" in error and "has no verdicts" in error
    assert (out / "report" / "table3.md").exists() and (out / "report" / "table3.csv").exists()


def test_report_has_a_row_per_model_with_the_varied_columns(swept):
    out, _ = swept
    rows = report_rows(out)
    assert [(r["row"], r["spec"]) for r in rows] == [("base", "tiny"), ("A", "A_heads2"), ("C", "C_layers1")]
    base, heads, layers = rows
    assert (base["heads"], base["d_k"], base["layers"]) == ("4", "32", "2")
    assert (heads["heads"], heads["d_k"], heads["d_v"]) == ("2", "64", "64")
    assert layers["layers"] == "1"
    # Trained at 1/4 of the widths: d_model 128 -> 32, d_k 32 -> 8 (64 -> 16 for two heads).
    assert (base["trained_d_model"], base["trained_d_k"], heads["trained_d_k"]) == ("32", "8", "16")
    assert [r["seeds"] for r in rows] == ["2", "1", "1"]          # only base has a second seed
    assert len(base["dev_ppl_runs"].split()) == 2
    for row in rows:
        assert row["train_steps"] == "3"
        assert float(row["dev_ppl"]) > float(row["unigram_ppl"]) ** 0.5 and float(row["dev_bleu"]) >= 0
        assert int(row["params_trained"]) < int(row["params_spec"])
        # Nothing learned: every row is marked, and no row is judged.
        assert row["learned"] == "no"
        assert row["ppl_verdict"] == row["bleu_verdict"] == row["ppl_vs_paper"] == ""


def test_markdown_report_says_at_the_top_that_it_is_no_result(swept):
    out, _ = swept
    text = (out / "report" / "table3.md").read_text(encoding="utf-8")
    assert text.splitlines()[2].startswith("**Not a result: the base model did not learn (tiny: dev PPL ")
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert not [line for line in table if "noise" in line or "agrees" in line or "cannot tell" in line]
    command = text.split("```")[1].strip()
    assert command.startswith("xspec sweep ") and "--steps 3" in command and "--width-divisor 4" in command
    assert "--seeds 2 --keep-going" in command
    assert "not the paper's numbers" in text
    header = next(line for line in text.splitlines() if line.startswith("| row |"))
    assert [c.strip() for c in header.strip("|").split("|")][:11] == [
        "row", "spec", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "positions"]
    heads_row = next(line for line in text.splitlines() if "| A_heads2 |" in line)
    cells = [c.strip() for c in heads_row.strip("|").split("|")]
    assert cells[2:11] == ["", "", "", "2", "64", "64", "", "", ""]   # blank: as base
    assert cells[11:14] == ["3", "1", "**did not learn**"]


def test_each_seed_is_a_run_directory_with_its_own_seed(swept):
    runs = swept[0] / "runs" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == sorted(RUNS)
    assert "seed = 1" in (runs / "tiny" / "spec.xspec").read_text()
    assert "seed = 2" in (runs / "tiny-seed2" / "spec.xspec").read_text()
    first, second = (load_curves([runs / name])[0].loss.y for name in ("tiny", "tiny-seed2"))
    assert first != second                                     # another initialisation and batch order


def test_report_has_the_training_curves_of_every_run(swept):
    out, _ = swept
    png = (out / "report" / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")   # the IHDR chunk
    assert (width, height) == DEFAULT_SIZE
    curves = load_curves([out / "runs" / "runs" / name for name in RUNS])
    assert [(c.label, c.last_step, len(c.loss.x)) for c in curves] == [(name, 3, 3) for name in RUNS]
    assert "![Training curves of every run](curves.png)" in (out / "report" / "table3.md").read_text()


def test_shared_vocabulary(swept):
    runs = swept[0] / "runs" / "runs"
    assert len({(runs / name / "sentencepiece.model").read_bytes() for name in RUNS}) == 1


def test_a_second_run_retrains_nothing(swept, variants, corpus, capsys):
    out, _ = swept
    finished = out / "runs" / "runs" / "tiny-seed2" / "metrics.json"
    before = finished.stat().st_mtime_ns
    capsys.readouterr()
    assert main(sweep_args(variants, corpus, out)) == 1
    captured = capsys.readouterr()
    assert captured.out.count("finished earlier, not retrained") == 4
    assert "the base model did not learn" in captured.err
    assert finished.stat().st_mtime_ns == before


def test_an_interrupted_seed_resumes_and_more_seeds_train_only_the_new_runs(swept, variants, corpus, capsys):
    """A run with checkpoints but no metrics.json resumes from them; --seeds 3 later adds tiny-seed3 only."""
    out, _ = swept
    runs = out / "runs" / "runs"
    (runs / "tiny-seed2" / "metrics.json").unlink()
    capsys.readouterr()
    assert main(sweep_args(variants, corpus, out, seeds=3)) == 1
    printed = capsys.readouterr().out
    assert printed.count("finished earlier, not retrained") == 3
    assert "tiny-seed2: training 3 steps, seed 2" in printed and "tiny-seed3: training 3 steps, seed 3" in printed
    assert "resuming" in (runs / "tiny-seed2" / "train.log").read_text()
    assert (runs / "tiny-seed2" / "metrics.json").exists() and (runs / "tiny-seed3" / "metrics.json").exists()
    assert report_rows(out)[0]["seeds"] == "3"


def test_without_keep_going_nothing_trains_after_a_base_run_that_did_not_learn(variants, corpus, tmp_path, capsys):
    assert main(sweep_args(variants, corpus, tmp_path, seeds=2, keep_going=False)) == 1
    captured = capsys.readouterr()
    assert "tiny did not learn: 3 runs not trained, since nothing could be compared with it" in captured.out
    assert "xspec: error: the base model did not learn (tiny: dev PPL " in captured.err
    assert sorted(p.name for p in (tmp_path / "runs" / "runs").iterdir()) == ["tiny"]
    rows = report_rows(tmp_path)
    assert [(r["spec"], r["train_steps"], r["learned"]) for r in rows] == [
        ("tiny", "3", "no"), ("A_heads2", "", ""), ("C_layers1", "", "")]
    text = (tmp_path / "report" / "table3.md").read_text(encoding="utf-8")
    assert text.splitlines()[2].startswith("**Not a result: the base model did not learn")
    assert cells_of(text, "A_heads2")[11:14] == ["(not yet)", "0/1", ""]


def test_an_interrupted_sweep_says_to_run_the_same_command_again(variants, corpus, tmp_path, capsys, monkeypatch):
    from xspec.runtime.train import Interrupted
    from xspec.sweep import runner

    def interrupted(spec, corpus, vocab_file, run_dir, config):
        raise Interrupted(7, run_dir / "checkpoints" / "step-00000007.safetensors", run_dir)

    monkeypatch.setattr(runner, "train_variant", interrupted)
    assert main(sweep_args(variants, corpus, tmp_path)) == 130
    error = capsys.readouterr().err
    assert "[1/4] tiny: interrupted at step 7; checkpoint " in error and "step-00000007.safetensors written" in error
    assert "continue with: the same command (xspec sweep " in error and "xspec train --resume" not in error


def test_a_different_budget_is_refused(swept, variants, corpus, capsys):
    assert main(sweep_args(variants, corpus, swept[0], steps=5)) == 1
    assert "holds a sweep with different settings (steps)" in capsys.readouterr().err


def test_variant_order_and_row_labels(tmp_path):
    for name in ("C_dmodel1024", "big", "A_heads16", "C_dmodel256", "A_heads4"):
        (tmp_path / f"{name}.xspec").write_text("")
    (tmp_path / "base.xspec").write_text("")
    found = [p.stem for p in find_variants(tmp_path, tmp_path / "base.xspec")]
    assert found == ["base", "A_heads4", "A_heads16", "C_dmodel256", "C_dmodel1024", "big"]
    assert [row_label(n, n == "base") for n in found] == ["base", "A", "A", "C", "C", "big"]


def test_missing_corpus_file_is_one_message_and_records_no_settings(variants, tmp_path, capsys):
    """A mistyped --data leaves nothing that would refuse the corrected command as another sweep's."""
    assert main(sweep_args(variants, tmp_path, tmp_path)) == 1
    err = capsys.readouterr().err
    assert err.startswith("xspec: error: ") and "train.en: missing" in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "sweep.json").exists()


def test_the_command_and_the_sweep_default_to_the_same_seeds():
    assert sweep_command.DEFAULT_SEEDS == DEFAULT_SEEDS == 3


# --- seeds, the learning bar, the noise band and the verdicts, on given figures ------------------

UNIGRAM = 400.0                         # so a run learned at dev PPL <= 20 and BLEU >= 5


def run(name: str, seed: int, ppl: float, bleu: float, unigram: float | None = UNIGRAM) -> Run:
    return Run(name, seed, {"steps": 1000, "valid_loss": math.log(ppl), "bleu": bleu}, unigram_ppl=unigram)


def row(name: str, *figures: tuple[float, float]) -> Row:
    """A row with one finished run per (PPL, BLEU); none: a row that has not trained."""
    runs = [run(r.name, r.seed, ppl, bleu) for r, (ppl, bleu) in zip(seed_runs(name, 1, len(figures)), figures)]
    return Row(name=name, row=row_label(name, name == "base"), columns={}, trained_columns={},
               spec_parameters=1, trained_parameters=1, runs=runs or seed_runs(name, 1, 1))


BASE = ((8.0, 30.0), (8.4, 31.0), (8.2, 32.0))      # PPL 8.2 ± 0.4, BLEU 31 ± 2


def test_seed_runs_name_the_first_after_the_row_and_count_seeds_from_the_specs():
    assert [(r.name, r.seed) for r in seed_runs("base", 1, 3)] == [("base", 1), ("base-seed2", 2), ("base-seed3", 3)]
    assert [(r.name, r.seed) for r in seed_runs("A_heads1", 7, 2)] == [("A_heads1", 7), ("A_heads1-seed2", 8)]


def test_unigram_perplexity_is_of_the_training_frequencies_add_one_smoothed():
    # Counts 0: 3, 1: 1 over a vocabulary of 4 -> p(0) = 4/8, p(1) = 2/8.
    assert unigram_perplexity(token_counts([[0, 0, 1], [0]]), [[0]], 4) == pytest.approx(2.0)
    assert unigram_perplexity(token_counts([[0, 0, 1], [0]]), [[0], [1]], 4) == pytest.approx(math.sqrt(2 * 4))
    assert unigram_perplexity(token_counts([[0]]), [[3]], 4) == pytest.approx(5.0)        # unseen: one count in 1 + 4


def test_learned_is_half_the_unigram_cross_entropy_and_some_bleu():
    assert learning_threshold(UNIGRAM) == pytest.approx(20.0)
    assert learned(19.9, MIN_BLEU, UNIGRAM) and learned(20.0, 30.0, UNIGRAM)
    assert not learned(20.1, 30.0, UNIGRAM)               # above the bar
    assert not learned(10.0, 4.9, UNIGRAM)                # low perplexity, no translation
    assert not run("x", 1, 10.0, 30.0, unigram=None).learned   # no vocabulary to judge it by


def test_noise_band_is_mean_plus_minus_two_sample_standard_deviations():
    band = noise_band([8.0, 8.4, 8.2])
    assert band.mean == pytest.approx(8.2) and band.half_width == pytest.approx(0.4)
    assert noise_band([30.0, 31.0]).half_width == pytest.approx(2 * math.sqrt(0.5))
    assert noise_band([8.0]) is None and noise_band([]) is None


def test_comparisons_by_metric_direction_and_band():
    band = noise_band([8.0, 8.4, 8.2])                    # ± 0.4
    worse = compare("ppl", 9.0, 8.2, band, "worse")
    assert worse.above_noise and worse.ours == "worse" and worse.verdict == "above noise"
    assert worse.agreement == "agrees"
    assert compare("ppl", 7.0, 8.2, band, "worse").agreement == "disagrees"        # lower PPL is better
    quiet = compare("ppl", 8.5, 8.2, band, "worse")
    assert (quiet.verdict, quiet.ours, quiet.agreement) == ("within noise", None, "cannot tell")
    assert compare("ppl", 8.5, 8.2, band, "same").agreement == "agrees"
    assert compare("ppl", 9.0, 8.2, band, "same").agreement == "disagrees"
    bleu = compare("bleu", 34.0, 31.0, noise_band([30.0, 31.0, 32.0]), "better")   # higher BLEU is better
    assert (bleu.ours, bleu.agreement) == ("better", "agrees")
    lone = compare("bleu", 34.0, 31.0, None, "better")                             # one base seed
    assert (lone.verdict, lone.agreement) == ("no noise band", "cannot tell")
    assert compare("bleu", 34.0, 31.0, None, None).agreement == "-"                 # not a Table 3 row
    assert agreement("worse", True, "worse") == "agrees" and agreement("worse", False, None) == "cannot tell"


def test_judge_compares_learned_rows_with_the_base_mean():
    rows = [row("base", *BASE),
            row("A_heads1", (9.5, 27.0)),                 # paper: worse / worse
            row("E_learned_positions", (8.3, 30.5)),      # paper: same / same
            row("C_layers8", (8.1, 31.5)),                # paper: better / better
            row("D_ls0", (7.0, 33.5)),                    # paper: PPL better, BLEU worse
            row("B_dk16", (25.0, 12.0)),                  # did not learn: PPL above 20
            row("B_dk32"),                                # not trained yet
            row("big_enfr", (8.2, 40.0))]                 # not a row of Table 3
    judgement = judge(rows)
    assert judgement.base_learned and base_problem(rows) is None
    assert judgement.bands["ppl"].mean == pytest.approx(8.2) and judgement.bands["bleu"].half_width == pytest.approx(2)
    verdicts = {name: tuple((c.verdict, c.agreement) for c in metrics.values())
                for name, metrics in judgement.comparisons.items()}
    assert verdicts == {
        "A_heads1": (("above noise", "agrees"), ("above noise", "agrees")),
        "E_learned_positions": (("within noise", "agrees"), ("within noise", "agrees")),
        "C_layers8": (("within noise", "cannot tell"), ("within noise", "cannot tell")),
        "D_ls0": (("above noise", "agrees"), ("above noise", "disagrees")),
        "big_enfr": (("within noise", "-"), ("above noise", "-")),
    }
    assert judgement.comparisons["A_heads1"]["ppl"].difference == pytest.approx(1.3)


def test_a_row_learned_only_when_every_seed_did():
    mixed = row("A_heads1", (9.0, 27.0), (30.0, 2.0))
    assert not mixed.outcome().learned
    assert "A_heads1" not in judge([row("base", *BASE), mixed]).comparisons
    partial = row("A_heads1", (9.0, 27.0), (9.4, 27.0))
    partial.runs[1].metrics = {}                          # the second seed has not finished
    assert partial.outcome().ppls == pytest.approx((9.0,)) and partial.outcome().learned and not partial.finished


def test_no_verdicts_at_all_when_base_did_not_learn():
    rows = [row("base", (8.0, 30.0), (60.0, 1.0)), row("A_heads1", (9.5, 27.0))]
    judgement = judge(rows)
    assert not judgement.base_learned and judgement.comparisons == {} and judgement.bands == {}
    assert base_problem(rows) == ("the base model did not learn (base-seed2: dev PPL 60.00, needs <= 20.00; "
                                  "dev BLEU 1.00, needs >= 5)")
    failed = row("base")
    failed.runs[0].error = "diverged at step 12"
    assert base_problem([failed]) == "the base model failed (base: diverged at step 12)"
    assert base_problem([row("base")]) == "the base model has not trained yet"


def report_config(tmp_path: Path, seeds: int = 3) -> tuple[SweepConfig, Corpus]:
    config = SweepConfig(variants=(), steps=1000, overrides={}, width_divisor=2, data="corpus", src_lang="en",
                         tgt_lang="de", dev_lines=None, out_dir=tmp_path, report_dir=tmp_path,
                         command="xspec sweep specs/table3/ --steps 1000", seeds=seeds)
    return config, Corpus(*(tmp_path / n for n in ("a", "b", "c", "d")), description="a corpus")


def report_row(name: str, *figures: tuple[float, float]) -> Row:
    made = row(name, *figures)
    made.columns = made.trained_columns = {"layers": 6, "d_model": 512, "d_ff": 2048, "heads": 8, "d_k": 64,
                                           "d_v": 64, "dropout": 0.1, "label_smoothing": 0.1,
                                           "positions": "sinusoidal"}
    return made


def cells_of(text: str, name: str) -> list[str]:
    line = next(line for line in text.splitlines() if f"| {name} |" in line)
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_report_shows_the_band_the_verdicts_and_the_papers_direction(tmp_path):
    rows = [report_row("base", *BASE), report_row("A_heads1", (9.5, 27.0)), report_row("B_dk16", (25.0, 12.0))]
    config, corpus = report_config(tmp_path)
    text = render_markdown(rows, config, corpus)
    assert "Not a result" not in text
    assert "This sweep: PPL 8.20 ± 0.40 (runs: 8.00, 8.40, 8.20); BLEU 31.00 ± 2.00" in text
    assert cells_of(text, "base")[11:20] == ["1000", "3", "yes", "8.20", "", "", "31.00", "", ""]
    assert cells_of(text, "A_heads1")[11:22] == ["1000", "1", "yes", "9.50", "+1.30", "above noise", "27.00",
                                                 "-4.00", "above noise", "worse/worse", "agrees / agrees"]
    assert cells_of(text, "B_dk16")[13:22] == ["**did not learn**", "25.00", "", "", "12.00", "", "",
                                               "worse/worse", ""]
    table = {r["spec"]: r for r in csv.DictReader(render_csv(rows).splitlines())}
    assert (table["A_heads1"]["ppl_verdict"], table["A_heads1"]["bleu_vs_paper"]) == ("above noise", "agrees")
    assert (table["base"]["dev_ppl_runs"], table["base"]["seeds"]) == ("8.00 8.40 8.20", "3")
    assert (table["B_dk16"]["learned"], table["B_dk16"]["ppl_verdict"]) == ("no", "")


def test_the_report_of_an_unlearned_base_leads_with_it_in_bold(tmp_path):
    rows = [report_row("base", (60.0, 1.0), (61.0, 1.2)), report_row("A_heads1", (9.5, 27.0))]
    config, corpus = report_config(tmp_path, seeds=2)
    text = render_markdown(rows, config, corpus)
    assert text.splitlines()[2].startswith("**Not a result: the base model did not learn (base: dev PPL 60.00")
    assert "(No band: base has not learned.)" in text
    assert cells_of(text, "A_heads1")[13:22] == ["yes", "9.50", "", "", "27.00", "", "", "worse/worse", ""]
