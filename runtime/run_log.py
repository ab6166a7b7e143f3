"""What a training run reports, and where: one owner for every figure and message of a run.

    RUN/metrics.jsonl     every update and every validation, one JSON record each (for programs)
    RUN/train.log         timestamped lines (for people): messages, and every `train.report_every_steps`
                          updates (and at least every REPORT_SECONDS, from the first update on) their
                          mean loss, perplexity, learning rate, tokens/s, time per update, gradient
                          norm, memory and the time left
    RUN/tensorboard/      the same scalars as TensorBoard event files (`tensorboard --logdir runs`)
    the terminal          a progress bar when stderr is a terminal; otherwise (a redirected log, a
                          batch job) the train.log lines, without carriage returns

Messages are printed at once but reach train.log only once `open()` is called: a command refused
before the run directory is (re)written leaves no log behind. Only the main process reports.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TextIO

import torch
from tqdm import tqdm

from .run_dir import append_metrics

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: at run time only when asked

TRAIN_LOG = "train.log"
TENSORBOARD_DIR = "tensorboard"
# A report line at least this often, whatever train.report_every_steps says: a large model on a small
# machine takes minutes an update, and its user should not wait for the 100th to learn the pace.
REPORT_SECONDS = 60.0


@dataclass(frozen=True)
class StepFigures:
    """One update, read back from the device."""

    step: int
    loss: float                 # per target token, label-smoothed as trained
    lr: float
    tokens: int                 # target tokens of the update, over all processes
    tokens_per_s: float
    grad_norm: float            # before clipping
    # The model's own losses, per target token (unweighted): a mixture of experts' load balancing
    # ("aux_loss"), multi-token prediction's mean over its depths ("mtp_loss").
    sides: dict[str, float] = field(default_factory=dict)


class RunLog:
    def __init__(self, enabled: bool, bar: bool = False, tensorboard: bool = False, report_every: int = 100) -> None:
        self.enabled, self.want_bar, self.want_tensorboard = enabled, bar, tensorboard
        self.report_every = report_every
        self.run_dir: Optional[Path] = None
        self._file: Optional[TextIO] = None
        self._buffered: list[str] = []
        self._writer: Optional[SummaryWriter] = None
        self._bar: Optional[tqdm] = None
        self._window: list[StepFigures] = []
        self._max_steps = 0
        self._last_report: Optional[float] = None      # None: no report yet in this sitting

    # --- lifetime -----------------------------------------------------------------------------------
    def open(self, run_dir: Path, step: int, max_steps: int, resumed: bool) -> None:
        """Starts writing into `run_dir` (appending to its train.log; TensorBoard events after `step` that
        a resumed run will redo are dropped) and the progress bar at `step` of `max_steps`."""
        if not self.enabled:
            return
        self.run_dir, self._max_steps = run_dir, max_steps
        self._file = open(run_dir / TRAIN_LOG, "a" if resumed else "w", encoding="utf-8")
        for line in self._buffered:
            self._file.write(line)
        self._buffered.clear()
        self._file.flush()
        if self.want_tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when asked

            self._writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=step + 1 if resumed else None)
        if self.want_bar:
            self._bar = tqdm(total=max_steps, initial=step, dynamic_ncols=True, file=sys.stderr,
                             bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._file is not None:
            self._file.close()
            self._file = None

    # --- what is reported ---------------------------------------------------------------------------
    def message(self, text: str) -> None:
        """A line for people: on the terminal (above the bar) and, timestamped, in train.log."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)
        self._log_line(text)

    def steps(self, figures: list[StepFigures], eta_seconds: float) -> None:
        """Updates just read back: each into metrics.jsonl and TensorBoard; a train.log line (and, without
        a bar, a terminal line) for every `report_every` of them, for the first one, and after
        REPORT_SECONDS without one."""
        if not self.enabled or not figures:
            return
        now = time.time()
        for f in figures:
            aux = {name: round(value, 5) for name, value in f.sides.items()}
            self._record({"step": f.step, "loss": round(f.loss, 5), **aux, "lr": f.lr, "target_tokens": f.tokens,
                          "tokens_per_s": round(f.tokens_per_s, 1), "grad_norm": round(f.grad_norm, 4),
                          "time": round(now, 3)})
            self._scalars(f.step, {"train/loss": f.loss, "train/lr": f.lr, "train/tokens_per_s": f.tokens_per_s,
                                   "train/grad_norm": f.grad_norm, **{f"train/{k}": v for k, v in aux.items()}})
            self._window.append(f)
            if f.step % self.report_every == 0 or self._last_report is None or \
                    now - self._last_report >= REPORT_SECONDS:
                self._report(eta_seconds)
                self._last_report = now
        last = figures[-1]
        if self._bar is not None:
            self._bar.set_postfix_str(f"loss={last.loss:.3f} lr={last.lr:.2e} tok/s={last.tokens_per_s:,.0f} "
                                      f"eta={_duration(eta_seconds)}", refresh=False)
            self._bar.update(last.step - self._bar.n)

    def validation(self, step: int, figures: dict[str, float], note: str = "") -> None:
        """Validation figures (valid_loss, and valid_bleu when measured) at `step`."""
        if not self.enabled:
            return
        self._record({"step": step, **figures, "time": round(time.time(), 3)})
        scalars = {f"valid/{k.removeprefix('valid_')}": v for k, v in figures.items()}
        if "valid_loss" in figures:
            scalars["valid/perplexity"] = math.exp(min(figures["valid_loss"], 700.0))
        self._scalars(step, scalars)
        parts = [f"valid loss {figures['valid_loss']:.4f} (ppl {math.exp(min(figures['valid_loss'], 700.0)):.2f})"]
        if "valid_bleu" in figures:
            parts.append(f"BLEU {figures['valid_bleu']:.2f}")
        self.message(f"step {step}: {', '.join(parts)}{note}")

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Final figures (test BLEU, perplexity) into TensorBoard."""
        if self.enabled:
            self._scalars(step, values)

    # --- where it goes ------------------------------------------------------------------------------
    def _report(self, eta_seconds: float) -> None:
        window, self._window = self._window, []
        tokens = sum(f.tokens for f in window)
        loss = sum(f.loss * f.tokens for f in window) / max(tokens, 1)
        last = window[-1]
        seconds = sum(f.tokens / max(f.tokens_per_s, 1e-9) for f in window) / len(window)
        names = dict.fromkeys(name for f in window for name in f.sides)
        aux_text = "".join(f"{name.replace('_', ' ')} {mean:.4f} " for name in names
                           if (mean := _mean([f.sides[name] for f in window if name in f.sides])) is not None)
        line = (f"step {last.step}/{self._max_steps}: loss {loss:.4f} ppl {math.exp(min(loss, 700.0)):.2f} "
                f"{aux_text}lr {last.lr:.3e} {sum(f.tokens_per_s for f in window) / len(window):,.0f} tok/s "
                f"{_per_update(seconds)} grad norm {sum(f.grad_norm for f in window) / len(window):.3f} "
                f"memory {memory_mib():,.0f} MiB eta {_duration(eta_seconds)}")
        if self._bar is None:
            print(line, flush=True)
        self._log_line(line)

    def _log_line(self, text: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n"
        if self._file is None:
            self._buffered.append(line)
        else:
            self._file.write(line)
            self._file.flush()

    def _record(self, record: dict) -> None:
        assert self.run_dir is not None, "open() the log before reporting figures"
        append_metrics(self.run_dir, record)

    def _scalars(self, step: int, values: dict[str, float]) -> None:
        if self._writer is not None:
            for name, value in values.items():
                self._writer.add_scalar(name, value, step)


def memory_mib() -> float:
    """The most memory the run has held: the GPU's allocations on CUDA, else the process's peak RSS."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def _per_update(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms/update" if seconds < 1 else f"{seconds:.1f} s/update"


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
