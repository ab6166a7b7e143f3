"""`xspec plot`: the curves read from synthetic metrics logs (no training), the figure drawn from them,
the image written, and each kind of bad input refused with one message."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from xspec.cli import main
from xspec.base.errors import UserError
from xspec.plot import (check_image_format, curves_from_records, draw, load_curves, panels_for, plot_runs,
                        run_labels, smooth, time_unit)

ROOT = Path(__file__).resolve().parents[1]
START = 1_700_000_000.0         # a Unix time


def step_record(step: int, timed: bool = True) -> dict:
    record = {"step": step, "loss": 5.0 / step, "lr": 1e-4 * step, "target_tokens": 400, "tokens_per_s": 900.0}
    if timed:
        record.update(time=START + 30.0 * step, grad_norm=0.5)
    return record


def valid_record(step: int, timed: bool = True, bleu: float | None = None) -> dict:
    record: dict = {"step": step, "valid_loss": 1.0 + 1.0 / step}
    if timed:
        record["time"] = START + 30.0 * step + 5.0
    if bleu is not None:
        record["valid_bleu"] = bleu
    return record


def make_run(path: Path, records: list[dict]) -> Path:
    """A run directory as far as plotting is concerned: run.json and the metrics log."""
    path.mkdir(parents=True)
    (path / "run.json").write_text("{}\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def six_steps(timed: bool = True, bleu: bool = False) -> list[dict]:
    records = []
    for step in range(1, 7):
        records.append(step_record(step, timed))
        if step % 3 == 0:
            records.append(valid_record(step, timed, bleu=10.0 * step if bleu else None))
    return records


# --- the curves ------------------------------------------------------------------------------------

def test_curves_against_steps():
    run = curves_from_records(six_steps(bleu=True), "tiny")
    assert run.loss.x == (1, 2, 3, 4, 5, 6) and run.loss.y == pytest.approx([5.0 / s for s in range(1, 7)])
    assert run.lr.y == pytest.approx([1e-4 * s for s in range(1, 7)])
    assert run.valid_ppl.x == (3, 6)
    assert run.valid_ppl.y == pytest.approx([math.exp(1 + 1 / 3), math.exp(1 + 1 / 6)])
    assert run.valid_bleu.y == (30.0, 60.0)
    assert (run.label, run.last_step, run.untimed) == ("tiny", 6, 0)


def test_curves_against_wall_time_start_at_the_first_record():
    run = curves_from_records(six_steps(), "tiny", x="time")
    assert run.loss.x == pytest.approx([30.0 * s for s in range(6)])
    assert run.valid_ppl.x == pytest.approx([65.0, 155.0])


def test_records_without_time_are_left_off_a_time_axis():
    """A run resumed by a newer xspec: its first records have no time."""
    records = six_steps(timed=False)[:4] + six_steps()[4:]
    run = curves_from_records(records, "resumed", x="time")
    assert run.untimed == 4 and run.loss.x == pytest.approx([0.0, 30.0, 60.0])


def test_a_log_without_times_cannot_be_drawn_against_time():
    with pytest.raises(UserError, match=r"log has no wall-clock times .* --x steps"):
        curves_from_records(six_steps(timed=False), "old", x="time")


@pytest.mark.parametrize("record, problem", [
    ({"step": "3", "loss": 1.0}, '"step" is not a step number'),
    ({"loss": 1.0}, '"step" is not a step number'),
    ({"step": 3, "loss": "high"}, '"loss" is not a number'),
    ({"step": 3, "valid_loss": None}, '"valid_loss" is not a number'),
    ({"step": 3, "loss": 1.0, "time": True}, '"time" is not a number'),
])
def test_a_record_with_a_bad_value_is_named_by_line(record, problem):
    with pytest.raises(UserError) as error:
        curves_from_records([step_record(1), record], "x", x="time", source="run/metrics.jsonl")
    assert str(error.value) == f"run/metrics.jsonl:2: {problem}"


def test_non_finite_values_are_gaps_and_other_records_are_ignored():
    records = [step_record(1), {"step": 2, "loss": float("inf"), "lr": 1e-4}, {"step": 2, "note": "other"},
               {"step": 3, "valid_loss": 1000.0}]
    run = curves_from_records(records, "x")
    assert run.loss.x == (1, 2) and math.isnan(run.loss.y[1])
    assert math.isnan(run.valid_ppl.y[0])             # exp(1000) is past a float


def test_smoothing_is_a_debiased_moving_average_that_keeps_gaps():
    assert smooth([4.0, 4.0, 4.0]) == pytest.approx([4.0, 4.0, 4.0])    # no pull towards zero at the start
    smoothed = smooth([0.0, 10.0, math.nan, 10.0], weight=0.5)
    assert smoothed[:2] == pytest.approx([0.0, 10 * 0.5 / 0.75]) and math.isnan(smoothed[2])
    assert smoothed[3] == pytest.approx((0.5 * 5 + 0.5 * 10) / (1 - 0.5**3))         # the gap is skipped


def test_labels_are_folder_names_with_as_much_path_as_tells_them_apart(tmp_path):
    dirs = [tmp_path / "a" / "tiny", tmp_path / "b" / "tiny", tmp_path / "b" / "base"]
    assert run_labels(dirs) == ["a/tiny", "b/tiny", "base"]
    assert run_labels([Path("runs/x/../y")]) == ["y"]


def test_bleu_panel_only_when_some_run_has_it_and_time_units():
    plain, with_bleu = curves_from_records(six_steps(), "a"), curves_from_records(six_steps(bleu=True), "b")
    assert [p.field for p in panels_for([plain])] == ["loss", "valid_ppl", "lr"]
    assert [p.field for p in panels_for([plain, with_bleu])] == ["loss", "valid_ppl", "valid_bleu", "lr"]
    assert time_unit([curves_from_records(six_steps(), "a", x="time")]) == (60.0, "minutes")   # 150 s


# --- the figure and the file -----------------------------------------------------------------------

def test_two_runs_overlaid_one_colour_each_with_both_names_in_the_legend(tmp_path):
    runs = [make_run(tmp_path / "a" / "tiny", six_steps()), make_run(tmp_path / "b" / "tiny", six_steps(bleu=True))]
    curves = load_curves(runs)
    figure = draw(curves, title="two runs")
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert titles == ["training loss", "validation perplexity", "validation BLEU", "learning rate"]
    legend_names = [t.get_text() for t in figure.legends[0].get_texts()]
    assert legend_names == ["a/tiny", "b/tiny"]
    loss_axes = figure.axes[0]
    assert "EMA" in loss_axes.get_ylabel()
    named = [line for line in loss_axes.get_lines() if not line.get_label().startswith("_")]
    assert [line.get_label() for line in named] == ["a/tiny", "b/tiny"]
    assert named[0].get_color() != named[1].get_color()
    assert list(named[0].get_ydata()) == pytest.approx(smooth(curves[0].loss.y))
    bleu_axes = figure.axes[2]
    assert [list(line.get_ydata()) for line in bleu_axes.get_lines()] == [[], [30.0, 60.0]]
    assert figure.axes[1].get_yscale() == "log"


def test_png_of_the_requested_size_written_atomically(tmp_path):
    import matplotlib.image

    run = make_run(tmp_path / "tiny", six_steps())
    output = tmp_path / "out" / "curves.png"
    plot_runs([run], output, size=(640, 480))
    assert matplotlib.image.imread(output).shape[:2] == (480, 640)
    assert sorted(p.name for p in output.parent.iterdir()) == ["curves.png"]   # no temporary file left


def test_the_suffix_chooses_the_format(tmp_path):
    run = make_run(tmp_path / "tiny", six_steps())
    plot_runs([run], tmp_path / "c.svg", size=(400, 300))
    plot_runs([run], tmp_path / "c.pdf", size=(400, 300))
    assert b"<svg" in (tmp_path / "c.svg").read_bytes()[:500]
    assert (tmp_path / "c.pdf").read_bytes().startswith(b"%PDF")
    with pytest.raises(UserError, match=r"c\.txt: '\.txt' is not an image format; use \.png, \.svg or \.pdf"):
        check_image_format(tmp_path / "c.txt")


def test_the_sweep_skips_runs_that_have_not_started(tmp_path):
    started = make_run(tmp_path / "base", six_steps())
    curves = load_curves([started, tmp_path / "A_heads1"], skip_empty=True)
    assert [c.label for c in curves] == ["base"]
    assert plot_runs([tmp_path / "B_dk16"], tmp_path / "none.png", skip_empty=True) == []
    assert not (tmp_path / "none.png").exists()


# --- the command -----------------------------------------------------------------------------------

def test_command_writes_the_image(tmp_path, capsys):
    run = make_run(tmp_path / "tiny", six_steps())
    output = tmp_path / "curves.png"
    assert main(["plot", str(run), "-o", str(output), "--x", "time", "--title", "tiny", "--size", "400x300"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {output}: tiny (to step 6)"
    assert output.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_time_axis_without_times_is_refused_by_the_command(tmp_path):
    run = make_run(tmp_path / "old", six_steps(timed=False))
    output = tmp_path / "curves.png"
    result = subprocess.run([sys.executable, "-m", "xspec", "plot", str(run), "-o", str(output), "--x", "time"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (f"xspec: error: {run / 'metrics.jsonl'}: this run's log has no wall-clock "
                                     "times (\"time\", logged by newer versions of xspec); plot it with --x steps")
    assert not output.exists()


def error_of(argv: list[str], capsys) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("xspec: error: ") and "Traceback" not in err
    return err.strip().removeprefix("xspec: error: ")


def test_bad_runs_are_refused_with_their_path(tmp_path, capsys):
    output = str(tmp_path / "curves.png")
    make_run(tmp_path / "runs" / "tiny", six_steps())
    assert error_of(["plot", str(tmp_path / "runs"), "-o", output], capsys) == (
        f"{tmp_path / 'runs'}: not an xspec run directory (no run.json); it holds run directories (tiny)")
    (tmp_path / "empty").mkdir()
    assert error_of(["plot", str(tmp_path / "empty"), "-o", output], capsys) == (
        f"{tmp_path / 'empty'}: not an xspec run directory (no run.json)")
    assert error_of(["plot", str(tmp_path / "missing"), "-o", output], capsys) == (
        f"{tmp_path / 'missing'}: no such run directory")
    assert error_of(["plot", str(tmp_path / "runs" / "tiny" / "run.json"), "-o", output], capsys).startswith(
        f"{tmp_path / 'runs' / 'tiny' / 'run.json'}: not a directory")
    assert not Path(output).exists()
    # show and average say the same of what they are given
    file = tmp_path / "runs" / "tiny" / "run.json"
    for argv in (["show", str(file)], ["average", str(file), "-o", output]):
        assert error_of(argv, capsys) == f"{file}: not a directory; give a run directory (what `xspec train` writes)"
    assert error_of(["show", str(tmp_path / "runs")], capsys).endswith("it holds run directories (tiny)")


def test_runs_without_metrics_and_corrupt_logs_are_refused(tmp_path, capsys):
    output = str(tmp_path / "curves.png")
    fresh = make_run(tmp_path / "fresh", [])
    assert error_of(["plot", str(fresh), "-o", output], capsys) == (
        f"{fresh}: no metrics yet (metrics.jsonl holds no training step)")
    (fresh / "metrics.jsonl").unlink()
    assert error_of(["plot", str(fresh), "-o", output], capsys).startswith(f"{fresh}: no metrics yet")
    corrupt = make_run(tmp_path / "corrupt", six_steps())
    with open(corrupt / "metrics.jsonl", "a") as log:
        log.write("{not json\n")
    assert error_of(["plot", str(corrupt), "-o", output], capsys) == (
        f"{corrupt / 'metrics.jsonl'}:9: not a metrics record xspec wrote")
    assert error_of(["plot", str(corrupt), str(corrupt) + "/", "-o", output], capsys) == f"{corrupt}: given twice"


def test_bad_options_are_refused_by_argparse(tmp_path, capsys):
    run = str(make_run(tmp_path / "tiny", six_steps()))
    for argv, message in ((["--x", "tokens"], "argument --x: invalid choice: 'tokens'"),
                          (["--size", "big"], "argument --size: expected WIDTHxHEIGHT in pixels"),
                          (["--size", "50x50"], "argument --size: width and height must be 200 to 10,000 pixels")):
        with pytest.raises(SystemExit) as exit_:
            main(["plot", run, "-o", str(tmp_path / "c.png"), *argv])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert error_of(["plot", run, "-o", str(tmp_path / "c.txt")], capsys).startswith(f"{tmp_path / 'c.txt'}: '.txt'")


def test_help_imports_no_matplotlib():
    code = ("import sys\nfrom xspec.cli import build_parser\ntry:\n    build_parser().parse_args(['plot', '--help'])\n"
            "except SystemExit:\n    pass\nprint('matplotlib' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "metrics.jsonl" in result.stdout and result.stdout.strip().endswith("False")
