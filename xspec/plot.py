"""Training curves: one figure drawn from the metrics logs of one or more runs (`xspec plot`, the sweep's report).

One panel per quantity, each against steps or wall time, one colour per run:

    training loss           an exponential moving average, with the raw values faint behind it
    validation perplexity   exp(valid_loss), on a log scale
    validation BLEU         only when some run validated BLEU during training
    learning rate

Reading a log (`curves_from_records`) is apart from drawing (`draw`), so what a figure shows can be
checked without looking at its pixels. Logs written before records carried a "time" plot against
steps only. matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from xspec.base.errors import UserError
from xspec.base.files import write_bytes_atomically
from xspec.runtime.run_dir import METRICS_LOG, check_run_dir, is_number, is_step, read_metrics_log

if TYPE_CHECKING:
    from matplotlib.figure import Figure

X_AXES = ("steps", "time")
SMOOTHING = 0.9                 # the EMA's weight on the past: light, about ten records
DPI = 100
DEFAULT_SIZE = (1200, 800)      # pixels
# Formats matplotlib writes that are not pictures (raw pixel buffers) or need LaTeX (pgf).
_NOT_IMAGES = {"raw", "rgba", "pgf"}


@dataclass(frozen=True)
class Curve:
    """Points of one quantity of one run; x in steps, or in seconds since the run's first timed record."""

    x: tuple[float, ...] = ()
    y: tuple[float, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.x)


@dataclass(frozen=True)
class RunCurves:
    label: str                  # the run's name in the legend
    loss: Curve
    valid_ppl: Curve
    valid_bleu: Curve
    lr: Curve
    last_step: int = 0          # the last training step logged
    untimed: int = 0            # records left off a time axis because they have no "time"


@dataclass(frozen=True)
class Panel:
    field: str                  # the RunCurves attribute it draws
    title: str
    ylabel: str
    log_scale: bool = False


PANELS = (
    Panel("loss", "training loss", f"loss (EMA, weight {SMOOTHING}; raw: faint)"),
    Panel("valid_ppl", "validation perplexity", "perplexity, exp(valid_loss)", log_scale=True),
    Panel("valid_bleu", "validation BLEU", "BLEU"),
    Panel("lr", "learning rate", "learning rate"),
)


# --- reading ---------------------------------------------------------------------------------------

def read_run_log(run_dir: Path) -> list[dict]:
    """The records of `run_dir`'s metrics log, after checking that it is a run directory."""
    check_run_dir(run_dir)
    if not (run_dir / METRICS_LOG).exists():
        raise UserError(f"{run_dir}: no metrics yet ({METRICS_LOG} is written from the first training step)")
    return read_metrics_log(run_dir)


def curves_from_records(records: Sequence[dict], label: str, x: str = "steps",
                        source: str = METRICS_LOG) -> RunCurves:
    """The curves in a metrics log's records (`source` names the log in messages, with a line number).

    Step records carry "loss" and "lr"; validation records "valid_loss" and maybe "valid_bleu". With
    x="time", records without a "time" are left out (counted in `untimed`); a log with none is refused.
    """
    assert x in X_AXES, x
    points: dict[str, tuple[list[float], list[float]]] = {p.field: ([], []) for p in PANELS}
    start: float | None = None
    untimed = last_step = 0
    for line, record in enumerate(records, start=1):       # read_metrics_log: one record per line
        if not any(key in record for key in ("loss", "lr", "valid_loss", "valid_bleu")):
            continue                        # a kind of record this figure does not draw
        where = f"{source}:{line}"
        step = record.get("step")
        if not is_step(step):
            raise UserError(f"{where}: \"step\" is not a step number")
        if "loss" in record:
            last_step = max(last_step, step)
        values = _values(record, where)                 # checked whatever the axis
        if x == "steps":
            position = float(step)
        elif "time" in record and not math.isnan(seconds := _number(record, "time", where)):
            start = seconds if start is None else start
            position = seconds - start
        else:
            untimed += 1
            continue
        for field, value in values:
            points[field][0].append(position)
            points[field][1].append(value)
    if x == "time" and start is None and untimed:
        raise UserError(f"{source}: this run's log has no wall-clock times (\"time\", logged by newer versions "
                        "of xspec); plot it with --x steps")
    curves = {field: Curve(tuple(xs), tuple(ys)) for field, (xs, ys) in points.items()}
    return RunCurves(label=label, last_step=last_step, untimed=untimed, **curves)


def _values(record: dict, where: str) -> list[tuple[str, float]]:
    values = []
    if "loss" in record:
        values.append(("loss", _number(record, "loss", where)))
    if "lr" in record:
        values.append(("lr", _number(record, "lr", where)))
    if "valid_loss" in record:
        loss = _number(record, "valid_loss", where)
        values.append(("valid_ppl", math.exp(loss) if loss < 700 else math.nan))   # exp overflows past ~709
    if "valid_bleu" in record:
        values.append(("valid_bleu", _number(record, "valid_bleu", where)))
    return values


def _number(record: dict, key: str, where: str) -> float:
    value = record[key]
    if not is_number(value):
        raise UserError(f"{where}: \"{key}\" is not a number")
    # NaN and infinities (JSON allows them) are drawn as gaps, not as lines off the axis.
    return float(value) if math.isfinite(value) else math.nan


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Each run's folder name; where two runs share one, enough of their paths to tell them apart."""
    paths = [Path(os.path.abspath(d)) for d in run_dirs]       # lexical: "runs/x/.." is "runs"
    labels = []
    for path in paths:
        depth = 1
        while depth < len(path.parts) and any(
                other != path and other.parts[-depth:] == path.parts[-depth:] for other in paths):
            depth += 1
        labels.append("/".join(path.parts[-depth:]))
    return labels


def load_curves(run_dirs: Sequence[Path], x: str = "steps", skip_empty: bool = False) -> list[RunCurves]:
    """The curves of each run. A run with no training steps logged yet is refused, or left out with
    `skip_empty` (the sweep draws the runs that have started)."""
    if x not in X_AXES:
        raise UserError(f"unknown x axis {x!r}; choose from {', '.join(X_AXES)}")
    seen: set[str] = set()
    for run_dir in run_dirs:
        key = os.path.abspath(run_dir)
        if key in seen:
            raise UserError(f"{run_dir}: given twice")
        seen.add(key)
    curves = []
    for run_dir, label in zip(run_dirs, run_labels(run_dirs)):
        if skip_empty and not (run_dir / METRICS_LOG).exists():
            continue
        records = read_run_log(run_dir)
        if not any("loss" in record for record in records):
            if skip_empty:
                continue
            raise UserError(f"{run_dir}: no metrics yet ({METRICS_LOG} holds no training step)")
        curves.append(curves_from_records(records, label, x, source=str(run_dir / METRICS_LOG)))
    return curves


# --- drawing ---------------------------------------------------------------------------------------

def smooth(values: Sequence[float], weight: float = SMOOTHING) -> list[float]:
    """An exponential moving average, corrected for its start at zero so that the first points are not
    pulled down; NaNs stay gaps and do not reset it."""
    average, total, smoothed = 0.0, 0.0, []
    for value in values:
        if math.isnan(value):
            smoothed.append(math.nan)
            continue
        average = weight * average + (1 - weight) * value
        total = weight * total + (1 - weight)
        smoothed.append(average / total)
    return smoothed


def panels_for(curves: Sequence[RunCurves]) -> list[Panel]:
    """Every panel but BLEU, which appears when some run validated BLEU."""
    return [p for p in PANELS if p.field != "valid_bleu" or any(run.valid_bleu for run in curves)]


def time_unit(curves: Sequence[RunCurves]) -> tuple[float, str]:
    """(seconds per unit, unit name) for a time axis: the longest run decides."""
    span = max((max(c.x) for run in curves for c in (run.loss, run.valid_ppl, run.lr) if c), default=0.0)
    if span <= 120:
        return 1.0, "seconds"
    if span <= 2 * 3600:
        return 60.0, "minutes"
    return 3600.0, "hours"


def check_image_format(path: Path) -> str:
    """The format matplotlib writes for `path`'s suffix; anything else is refused before any work."""
    from matplotlib.figure import Figure

    formats = sorted(set(Figure().canvas.get_supported_filetypes()) - _NOT_IMAGES)
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in formats:
        shown = f"'.{suffix}'" if suffix else "no suffix"
        raise UserError(f"{path}: {shown} is not an image format; use .png, .svg or .pdf "
                        f"(or {', '.join('.' + f for f in formats if f not in ('png', 'svg', 'pdf'))})")
    return suffix


def draw(curves: Sequence[RunCurves], x: str = "steps", title: str | None = None,
         size: tuple[int, int] = DEFAULT_SIZE) -> Figure:
    """The figure: panels in two columns; the legend in the spare cell, or below the panels."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    assert curves, "nothing to draw"
    panels = panels_for(curves)
    unit, unit_name = (1.0, "") if x == "steps" else time_unit(curves)
    xlabel = "step" if x == "steps" else f"wall time ({unit_name} since the run's first record)"
    # A bare Figure draws with the Agg backend without touching pyplot's global state.
    figure = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI, layout="constrained")
    grid = figure.add_gridspec(math.ceil(len(panels) / 2), 2)
    colours = _colours(len(curves))
    handles, first = [], None
    for index, panel in enumerate(panels):
        # One x range for every panel, so that a step (or a time) lines up across them.
        ax = figure.add_subplot(grid[index // 2, index % 2], sharex=first)
        first = first or ax
        for run, colour in zip(curves, colours):
            line = _draw_curve(ax, panel, getattr(run, panel.field), unit, colour, run.label)
            if index == 0:
                handles.append(line)
        ax.set_title(panel.title, fontsize=11)
        ax.set_ylabel(panel.ylabel, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if not any(getattr(run, panel.field) for run in curves):
            # Say why the panel is empty (e.g. runs too short to have validated) rather than draw bare axes.
            ax.text(0.5, 0.5, f"no {panel.title} logged", transform=ax.transAxes, ha="center", va="center",
                    color="grey")
            ax.set_yticks([])
        elif panel.log_scale:
            ax.set_yscale("log")
        if x == "steps":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))
        if panel.field == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    labels = [run.label for run in curves]
    if len(panels) % 2:
        spare = figure.add_subplot(grid[len(panels) // 2, 1])
        spare.axis("off")
        spare.legend(handles, labels, loc="center", title="runs", fontsize=9, ncols=1 if len(labels) <= 12 else 2)
    else:
        figure.legend(handles, labels, loc="outside lower center", fontsize=9, ncols=min(len(labels), 4))
    if title:
        figure.suptitle(title, fontsize=12)
    return figure


def _draw_curve(ax, panel: Panel, curve: Curve, unit: float, colour, label: str):
    xs = [value / unit for value in curve.x]
    if panel.field == "loss":
        ax.plot(xs, curve.y, color=colour, alpha=0.25, linewidth=0.8, label="_nolegend_")
        (line,) = ax.plot(xs, smooth(curve.y), color=colour, linewidth=1.6, label=label)
    elif panel.field == "lr":
        (line,) = ax.plot(xs, curve.y, color=colour, linewidth=1.4, label=label)
    else:                                   # validation: sparse points, each marked
        (line,) = ax.plot(xs, curve.y, color=colour, linewidth=1.4, marker="o", markersize=3, label=label)
    return line


def _colours(count: int) -> list[Any]:
    from matplotlib import colormaps

    if count <= 10:
        return [colormaps["tab10"](i) for i in range(count)]
    if count <= 20:
        return [colormaps["tab20"](i) for i in range(count)]
    return [colormaps["turbo"](i / (count - 1)) for i in range(count)]


def write_figure(figure: Figure, path: Path) -> Path:
    """Renders `figure` in the format of `path`'s suffix and writes it atomically."""
    image_format = check_image_format(path)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=image_format, dpi=DPI)
    return write_bytes_atomically(path, buffer.getvalue())


def plot_runs(run_dirs: Sequence[Path], output: Path, x: str = "steps", title: str | None = None,
              size: tuple[int, int] = DEFAULT_SIZE, skip_empty: bool = False) -> list[RunCurves]:
    """Draws the runs' curves into `output` (.png, .svg, .pdf, ...); returns what was drawn. With
    `skip_empty`, runs without steps yet are left out, and nothing is written when none has any."""
    check_image_format(output)
    curves = load_curves(run_dirs, x, skip_empty)
    if curves:
        write_figure(draw(curves, x, title, size), output)
    return curves
