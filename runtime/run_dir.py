"""The run directory: everything a training run leaves behind, and how to find it again.

    RUN/spec.xspec            the resolved spec (imports inlined, parameters as literals)
    RUN/model.xspec           an imported run's spec (`xspec import`), which extends its family's
    RUN/run.json              what else decides the training data and the model (see `RunRecord`),
                              and why the run last stopped
    RUN/sentencepiece.model   the shared vocabulary, trained once and reused
    RUN/data/                 the demo task's generated splits (only when no data was given)
    RUN/samples.txt           a language model's continuations of a few prompts, when a run finishes
    RUN/checkpoints/          step-N.safetensors (+ step-N.state.safetensors for resuming), the last K kept
    RUN/checkpoints/best/     step-N.safetensors of the best validations (train.keep_best of them)
    RUN/metrics.jsonl         one line per step (loss, lr, tokens/s, grad norm, time) and per validation
    RUN/train.log             the same for people: timestamped messages, a line every train.report_every_steps
    RUN/tensorboard/          TensorBoard event files
    RUN/metrics.json          the final figures (bleu and chrf, or test_loss and test_perplexity, or
                              validation_loss and validation_perplexity without a test split, as scored_on
                              says; valid_loss, best, steps, train_tokens_per_s, wall_s, stopped), written
                              when a run finishes
    RUN/test.hyp              the final translations of the test split

`run.json` stores data files (and prepared data directories) as absolute paths, except files inside the run
directory itself (the demo task's), which are stored relative to it so that a run directory can be moved or copied.
Every file here is written atomically (`xspec.base.files`), except `metrics.jsonl`, a log appended
line by line (and rewritten atomically when a resumed run drops the steps it will redo).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from xspec.base.errors import UserError
from xspec.base.files import read_regular_file, write_atomically
from xspec.base.text import printable, shown

SPEC_FILE = "spec.xspec"
IMPORTED_SPEC_FILE = "model.xspec"   # an imported run's spec, which extends its family's (`xspec import`)
RUN_FILE = "run.json"
METRICS_LOG = "metrics.jsonl"
METRICS_FILE = "metrics.json"
DATA_DIR = "data"
TEST_OUTPUT = "test.hyp"
SAMPLES = "samples.txt"
MAX_SPEC_BYTES = 1 << 20            # a resolved spec (here or in a checkpoint) is a few KiB
MAX_RUN_FILE_BYTES = 1 << 20        # run.json is a few hundred bytes
# run.json's layout; files without "format" stored relative paths relative to the working directory.
RUN_FORMAT = 2
SPLITS = ("train", "valid", "test")
STOP_REASONS = ("max_steps", "max_minutes", "patience", "interrupted", "diverged")


@dataclass(frozen=True)
class Split:
    """A split's files: aligned source and target for translation; for a language model, one text file
    (`src`, with `tgt` None); for a classifier, the texts and their labels (`tgt`), and for sentence pairs
    the second text of each, aligned (`pair`)."""

    src: Path
    tgt: Path | None = None
    pair: Path | None = None

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(f for f in (self.src, self.tgt, self.pair) if f is not None)

    def describe(self) -> str:
        return ", ".join(str(f) for f in self.files)

    def to_json(self, run_dir: Path) -> dict[str, str]:
        if self.tgt is None:
            return {"text": _stored(self.src, run_dir)}
        pair = {"pair": _stored(self.pair, run_dir)} if self.pair is not None else {}
        return {"src": _stored(self.src, run_dir), "tgt": _stored(self.tgt, run_dir), **pair}


@dataclass(frozen=True)
class PreparedSplit:
    """A split read from prepared data directories (`xspec data prepare`), several mixed by weight."""

    dirs: tuple[Path, ...]
    weights: tuple[float, ...]

    @property
    def files(self) -> tuple[Path, ...]:
        return self.dirs

    def describe(self) -> str:
        if len(self.dirs) == 1:
            return str(self.dirs[0])
        return ",".join(f"{d}:{w:g}" for d, w in zip(self.dirs, self.weights))

    def to_json(self, run_dir: Path) -> dict[str, list]:
        return {"prepared": [_stored(d, run_dir) for d in self.dirs], "weights": list(self.weights)}


@dataclass(frozen=True)
class DataFiles:
    """The corpus; a split that is None was not given (for `train`: the built-in demo task)."""

    train: Split | PreparedSplit | None = None
    valid: Split | PreparedSplit | None = None
    test: Split | PreparedSplit | None = None

    def splits(self) -> dict[str, Split | PreparedSplit | None]:
        return {"train": self.train, "valid": self.valid, "test": self.test}


@dataclass(frozen=True)
class RunRecord:
    """run.json: what the spec does not say but the training data depends on, and the last stop.

    `truncate` is None for run directories written before it was recorded. `stopped` is
    {"reason": one of STOP_REASONS, "step": N} once the run has stopped, None while it runs.
    """

    data: DataFiles
    truncate: bool | None
    stopped: dict[str, Any] | None = None

    def to_json(self, run_dir: Path) -> dict[str, Any]:
        data = {name: None if split is None else split.to_json(run_dir) for name, split in self.data.splits().items()}
        return {"format": RUN_FORMAT, "data": data, "truncate": self.truncate, "stopped": self.stopped}


def _stored(path: Path, run_dir: Path) -> str:
    absolute = path.resolve()
    try:
        return absolute.relative_to(run_dir.resolve()).as_posix()
    except ValueError:
        return str(absolute)


def default_run_dir(spec_name: str) -> Path:
    return Path("runs") / f"{spec_name}-{time.strftime('%Y%m%d-%H%M%S')}"


# --- reading -----------------------------------------------------------------------------------

def check_run_dir(run_dir: Path) -> None:
    """Refuses a path that is not a run directory (one holding run.json), saying what it is instead."""
    check_directory(run_dir)
    if not (run_dir / RUN_FILE).is_file():
        raise UserError(f"{shown(run_dir)}: not an xspec run directory (no {RUN_FILE}){_runs_inside(run_dir)}")


def check_directory(run_dir: Path) -> None:
    """Refuses a path that is no directory, where a run directory is asked for."""
    if not run_dir.exists():
        raise UserError(f"{shown(run_dir)}: no such run directory")
    if not run_dir.is_dir():
        raise UserError(f"{shown(run_dir)}: not a directory; give a run directory (what `xspec train` writes)")


def _runs_inside(folder: Path) -> str:
    """A hint for a folder of runs given as one (`runs/` for `runs/*`)."""
    try:
        inside = sorted(printable(d.name) for d in folder.iterdir() if (d / RUN_FILE).is_file())
    except OSError:
        return ""
    if not inside:
        return ""
    return f"; it holds run directories ({', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''})"


def read_run_record(run_dir: Path) -> RunRecord:
    path = run_dir / RUN_FILE
    if not path.exists():
        raise UserError(f"{path}: missing; {run_dir} is not an xspec run directory")
    try:
        record = json.loads(read_regular_file(path, MAX_RUN_FILE_BYTES).decode("utf-8"))
    except (ValueError, RecursionError):        # bad JSON or bad UTF-8
        raise UserError(f"{path}: not a run description xspec wrote (not JSON)") from None
    problem = _record_problem(record)
    if problem:
        raise UserError(f"{path}: not a run description xspec wrote ({problem})")
    base = run_dir if "format" in record else Path.cwd()
    data = DataFiles(**{name: _split(record["data"].get(name), base) for name in SPLITS})
    return RunRecord(data, record.get("truncate"), record.get("stopped"))


def _record_problem(record: Any) -> str | None:
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
        return "no data files"
    for name in SPLITS:
        entry = record["data"].get(name)
        if entry is not None and not (isinstance(entry, dict) and set(entry) in _SPLIT_KEYS and
                                      all(_is_path(v) for v in entry.values()) or _is_prepared(entry)):
            return f"data.{name} is not a pair of file names, a text file name or prepared directories"
    if record["data"].get("train") is None:
        return "no training files"
    if record.get("truncate") not in (None, True, False):
        return "truncate is not true or false"
    stopped = record.get("stopped")
    if stopped is not None and not (isinstance(stopped, dict) and stopped.get("reason") in STOP_REASONS
                                    and is_step(stopped.get("step"))):
        return "stopped is not a stop record"
    return None


def is_step(value: object) -> TypeGuard[int]:
    """A step number as xspec writes one: a whole number, at least 0."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_number(value: object) -> TypeGuard[int | float]:
    """A figure as xspec writes one (NaN and infinities included: JSON's readers allow them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The figures of a metrics log's records, each a number where a record has it.
LOGGED_NUMBERS = ("loss", "lr", "valid_loss", "valid_bleu", "time")


def _logged_problem(record: dict) -> str | None:
    if "step" in record and not is_step(record["step"]):
        return '"step" is not a step number'
    wrong = next((key for key in LOGGED_NUMBERS if key in record and not is_number(record[key])), None)
    return None if wrong is None else f'"{wrong}" is not a number'


_SPLIT_KEYS = ({"src", "tgt"}, {"text"}, {"src", "tgt", "pair"})


def _is_path(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and "\0" not in value


def _is_prepared(entry: Any) -> bool:
    if not (isinstance(entry, dict) and set(entry) == {"prepared", "weights"}):
        return False
    dirs, weights = entry["prepared"], entry["weights"]
    return isinstance(dirs, list) and isinstance(weights, list) and 1 <= len(dirs) == len(weights) <= 64 and \
        all(_is_path(d) for d in dirs) and \
        all(isinstance(w, (int, float)) and not isinstance(w, bool) and 0 < w < float("inf") for w in weights)


def _split(entry: dict | None, base: Path) -> Split | PreparedSplit | None:
    if entry is None:
        return None
    if "prepared" in entry:
        return PreparedSplit(tuple(base / d for d in entry["prepared"]), tuple(float(w) for w in entry["weights"]))
    if "text" in entry:
        return Split(base / entry["text"])
    return Split(base / entry["src"], base / entry["tgt"], base / entry["pair"] if "pair" in entry else None)


def read_run_spec(run_dir: Path) -> str:
    """The run's resolved spec text (compiled by the caller like any spec file, imports refused)."""
    path = run_dir / SPEC_FILE
    try:
        return read_regular_file(path, MAX_SPEC_BYTES).decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: invalid UTF-8 (byte {error.start})") from None


# --- writing -----------------------------------------------------------------------------------

def write_run_files(run_dir: Path, spec_source: str, record: RunRecord) -> None:
    """spec.xspec, then run.json; called only once everything they describe has been checked."""
    write_atomically(run_dir / SPEC_FILE, spec_source)
    write_run_record(run_dir, record)


def write_run_record(run_dir: Path, record: RunRecord) -> None:
    write_atomically(run_dir / RUN_FILE, json.dumps(record.to_json(run_dir), indent=2) + "\n")


def write_final_metrics(run_dir: Path, metrics: dict) -> None:
    write_atomically(run_dir / METRICS_FILE, json.dumps(metrics, indent=2) + "\n")


def append_metrics(run_dir: Path, record: dict) -> None:
    with open(run_dir / METRICS_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read_metrics_log(run_dir: Path) -> list[dict]:
    """The log's records. A last line without its newline (the process died mid-write) is dropped."""
    path = run_dir / METRICS_LOG
    if not path.exists():
        return []
    text = read_regular_file(path).decode("utf-8", errors="replace")
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines[:-1], start=1):       # lines[-1]: after the last newline
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number}: not a metrics record xspec wrote")
        problem = _logged_problem(record)
        if problem is not None:
            raise UserError(f"{path}:{number}: {problem}")
        records.append(record)
    return records


def rewrite_metrics_log(run_dir: Path, records: list[dict]) -> None:
    write_atomically(run_dir / METRICS_LOG, "".join(json.dumps(r) + "\n" for r in records))
