"""The run directory: everything a training run leaves behind, and how to find it again.

    RUN/spec.xspec            the resolved spec (imports inlined, parameters as literals)
    RUN/run.json              the data files the run trains on (absolute paths)
    RUN/sentencepiece.model   the shared vocabulary, trained once and reused
    RUN/data/                 the demo task's generated splits (only when no data was given)
    RUN/checkpoints/          step-N.safetensors (+ step-N.state.pt for resuming), the last K kept
    RUN/metrics.jsonl         one line per step (loss, lr, tokens/s) and per validation
    RUN/metrics.json          the final figures (bleu, chrf, valid_loss, steps, train_tokens_per_s, wall_s)
    RUN/test.hyp              the final translations of the test split
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from xspec.errors import UserError

SPEC_FILE = "spec.xspec"
RUN_FILE = "run.json"
METRICS_LOG = "metrics.jsonl"
METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class Split:
    src: Path
    tgt: Path


@dataclass(frozen=True)
class DataFiles:
    """The corpus; `train is None` means the built-in demo task."""

    train: Split | None = None
    valid: Split | None = None
    test: Split | None = None

    def to_json(self) -> dict:
        return {name: None if split is None else {"src": str(split.src), "tgt": str(split.tgt)}
                for name, split in (("train", self.train), ("valid", self.valid), ("test", self.test))}

    @classmethod
    def from_json(cls, data: dict) -> "DataFiles":
        def split(entry):
            return None if entry is None else Split(Path(entry["src"]), Path(entry["tgt"]))
        return cls(split(data.get("train")), split(data.get("valid")), split(data.get("test")))


def default_run_dir(spec_name: str) -> Path:
    return Path("runs") / f"{spec_name}-{time.strftime('%Y%m%d-%H%M%S')}"


def read_run_data(run_dir: Path) -> DataFiles:
    path = run_dir / RUN_FILE
    try:
        return DataFiles.from_json(json.loads(path.read_text(encoding="utf-8"))["data"])
    except FileNotFoundError:
        raise UserError(f"{path}: missing; {run_dir} is not an xspec run directory") from None
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path}: unreadable run description ({error})") from None


def write_run_files(run_dir: Path, spec_source: str, data: DataFiles) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SPEC_FILE).write_text(spec_source, encoding="utf-8")
    (run_dir / RUN_FILE).write_text(json.dumps({"data": data.to_json()}, indent=2) + "\n", encoding="utf-8")


def append_metrics(run_dir: Path, record: dict) -> None:
    with open(run_dir / METRICS_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read_metrics_log(run_dir: Path) -> list[dict]:
    path = run_dir / METRICS_LOG
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
