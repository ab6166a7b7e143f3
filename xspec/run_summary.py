"""What a run directory holds, in one page (`xspec show RUN`): the spec, the data, how far training went and
why it stopped, the best validation, the test scores, the checkpoints, and the commands that go on from
there. Everything is read from the run's own files (runtime/run_dir.py); nothing is loaded onto a device.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from xspec.base.errors import UserError
from xspec.base.text import printable
from xspec.base.files import read_regular_file
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.best import best_dir
from xspec.runtime.run_dir import (DATA_DIR, METRICS_FILE, SPEC_FILE, RunRecord, Split, check_run_dir, is_number,
                                   is_step, read_metrics_log, read_run_record, read_run_spec)

_STOPS = {"max_steps": "reached train.max_steps", "max_minutes": "reached train.max_minutes",
          "patience": "early stopping (train.patience)", "interrupted": "interrupted (Ctrl-C or SIGTERM)",
          "diverged": "the loss diverged"}


@dataclass
class RunSummary:
    run_dir: Path
    spec: dict[str, Any]
    data: dict[str, Optional[list[str]]]
    demo: bool
    training: dict[str, Any]
    stopped: Optional[dict[str, Any]]
    validation: dict[str, Any]
    test: dict[str, Any]
    checkpoints: dict[str, Any]
    commands: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"run": str(self.run_dir), "spec": self.spec, "data": self.data, "demo_data": self.demo,
                "training": self.training, "stopped": self.stopped, "validation": self.validation,
                "test": self.test, "checkpoints": self.checkpoints, "commands": self.commands}


def summarize(run_dir: Path) -> RunSummary:
    check_run_dir(run_dir)
    import xspec

    spec = xspec.compile_source(read_run_spec(run_dir), name=str(run_dir / SPEC_FILE), allow_imports=False)
    record = read_run_record(run_dir)
    kind = _kind(spec)
    data = {name: None if split is None else [str(f) for f in split.files]
            for name, split in record.data.splits().items()}
    train = record.data.train          # prepared directories (--data) are never the demo's
    demo = isinstance(train, Split) and train.src.resolve().parent == (run_dir / DATA_DIR).resolve()
    records = read_metrics_log(run_dir)
    final = _final_metrics(run_dir)
    steps = [r for r in records if "loss" in r]
    valids = [r for r in records if "valid_loss" in r]
    times = [r["time"] for r in records if isinstance(r.get("time"), (int, float))]
    training: dict[str, Any] = {"steps": steps[-1]["step"] if steps else 0}
    if steps:
        training["last_loss"] = steps[-1]["loss"]
    if times:
        training["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(min(times)))
        training["wall_seconds"] = round(max(times) - min(times), 1)
    for key in ("train_seconds", "train_tokens_per_s"):
        if key in final:
            training[key] = final[key]
    validation: dict[str, Any] = {}
    if valids:
        validation["last"] = {k: v for k, v in valids[-1].items() if k != "time"}
    if "best" in final:
        validation["best"] = final["best"]
    if isinstance(final.get("valid_loss"), (int, float)):
        validation["final"] = {"valid_loss": final["valid_loss"], "step": final.get("steps")}
    # The final scores: of the test split, or of the validation split where the run had no test split.
    scored = {k: v for k, v in final.items() if k.startswith(("test_", "validation_"))
              or k in ("bleu", "chrf", "unigram_perplexity")}
    test = scored if final.get("scored_on", "test") == "test" else {}
    if not test and scored:
        validation["scored"] = scored
    kept = ckpt.list_checkpoints(run_dir)
    best = ckpt.checkpoints_in(best_dir(run_dir))
    checkpoints = {"kept": [p.name for p in kept], "best": [str(p.relative_to(run_dir)) for p in best]}
    summary = RunSummary(run_dir, {"name": spec.name, "parameters": spec.parameters,
                                   "kind": kind,
                                   "params": spec.params},
                         data, demo, training, record.stopped, validation, test, checkpoints)
    summary.commands = _commands(run_dir, spec, record, kind, best)
    return summary


def _kind(spec) -> str:
    """What the run's model does, as its task names it."""
    if spec.masked_lm:
        return "masked language model"
    if spec.classes is not None:
        return "classifier"
    return "translation" if spec.has_encoder else "language model"


def _final_metrics(run_dir: Path) -> dict[str, Any]:
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return {}
    try:
        value = json.loads(read_regular_file(path, 1 << 20).decode("utf-8"))
    except (ValueError, RecursionError):
        raise UserError(f"{path}: not the final figures xspec writes (not JSON)") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: not the final figures xspec writes")
    best = value.get("best", {})
    for key, figure in [*value.items(), *(best.items() if isinstance(best, dict) else [])]:
        number = key in FINAL_NUMBERS or key.startswith(("test_", "validation_"))
        if key in ("steps", "step") and not is_step(figure) or number and figure is not None and not is_number(figure):
            raise UserError(f"{path}: not the final figures xspec writes ({key} {printable(json.dumps(figure))[:40]})")
    if not isinstance(best, dict):
        raise UserError(f"{path}: not the final figures xspec writes (best is not a record)")
    return value


# The final figures (metrics.json) that are numbers where given (None: not measured, a run without
# validation's valid_loss), besides the test and validation scores.
FINAL_NUMBERS = ("valid_loss", "valid_bleu", "train_seconds", "train_tokens_per_s", "bleu", "chrf",
                 "unigram_perplexity", "wall_s")


def _commands(run_dir: Path, spec, record: RunRecord, kind: str, best: list[Path]) -> dict[str, str]:
    run = shlex.quote(str(run_dir))
    commands = {"resume": f"xspec train --resume {run}"}
    reason, cfg = (record.stopped or {}).get("reason", ""), spec.train
    further = {"max_steps": f"train.max_steps={2 * cfg.max_steps}",
               "max_minutes": f"train.max_minutes={2 * (cfg.max_minutes or 0):g}",
               "patience": f"train.patience={2 * (cfg.patience or 0)}"}.get(reason)
    if further is not None:     # the limit it stopped at would stop a resumed run at once
        commands["resume"] += f" --set {further}"
    test = record.data.test
    test = test if isinstance(test, Split) else None      # prepared directories: eval reads text files
    text = shlex.quote(str(test.src)) if test else "TEST.txt"
    if kind == "language model":
        commands["generate"] = f"xspec generate {run} --prompt 'a beginning'"
        commands["evaluate"] = f"xspec eval {run} --text {text}"
    elif kind == "masked language model":
        commands["fill"] = f"xspec fill {run} --text 'A TEXT WITH ITS MASK TOKEN'"
        commands["evaluate"] = f"xspec eval {run} --text {text}"
    elif kind == "classifier":
        train = record.data.train
        pairs = isinstance(train, Split) and train.pair is not None     # a sentence-pair classifier's run
        commands["classify"] = f"xspec classify {run} < texts.txt" if not pairs else \
            f"xspec classify {run} -i texts.txt --input-pair pairs.txt"
        labels = shlex.quote(str(test.tgt)) if test is not None and test.tgt is not None else "TEST.labels"
        commands["evaluate"] = f"xspec eval {run} --text {text} --labels {labels}"
        if pairs:
            pair = shlex.quote(str(test.pair)) if test is not None and test.pair is not None else "TEST.pair"
            commands["evaluate"] += f" --text-pair {pair}"
    else:
        commands["translate"] = f"xspec translate {run} < input.txt > output.txt"
        if test is not None and test.tgt is not None:
            commands["evaluate"] = (f"xspec eval {run} --src {shlex.quote(str(test.src))} "
                                    f"--ref {shlex.quote(str(test.tgt))}")
        else:
            commands["evaluate"] = f"xspec eval {run} --src TEST.src --ref TEST.tgt"
    averaged = shlex.quote(str(run_dir / "averaged.safetensors"))
    last = min(spec.train.average_last, len(ckpt.list_checkpoints(run_dir))) or spec.train.average_last
    commands["average"] = f"xspec average {run} --last {last} -o {averaged}"
    if len(best) > 1:
        commands["average"] += f"   # or --best {len(best)}"
    commands["plot"] = f"xspec plot {run} -o {shlex.quote(str(run_dir / 'curves.png'))}"
    return commands


def render(summary: RunSummary) -> str:
    s = summary
    lines = [f"run {s.run_dir}"]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<12}{text}")

    row("spec", f"{s.spec['name']} ({s.spec['kind']}), {s.spec['parameters']:,} parameters")
    settings = [f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in s.spec["params"].items()]
    line = ""
    for setting in settings:        # a line of whole settings, at most ~100 characters
        if line and len(line) + len(setting) > 96:
            row("", line + ",")
            line = ""
        line = f"{line}, {setting}" if line else setting
    if line:
        row("", line)
    for name, files in s.data.items():
        if files is not None:
            row("data" if name == "train" else "", f"{name}: {', '.join(files)}" +
                (" (the built-in demo task)" if s.demo and name == "train" else ""))
    t = s.training
    text = f"{t['steps']:,} steps"
    if "train_seconds" in t:
        text += f", {t['train_seconds']:,.0f} s of training ({t.get('train_tokens_per_s', 0):,.0f} target tokens/s)"
    if "started" in t:
        text += f"; started {t['started']}, {t['wall_seconds'] / 60:,.1f} min of wall time logged"
    row("training", text)
    if s.stopped is not None:
        row("stopped", f"{_STOPS.get(s.stopped['reason'], s.stopped['reason'])} at step "
                       f"{s.stopped.get('step')}")
    else:
        row("stopped", "not yet (running, or killed without a checkpoint's notice)")
    if "last" in s.validation:
        row("validation", "last: " + _validation_text(s.validation["last"]))
    elif "final" in s.validation:
        row("validation", f"at the end: {_validation_text(s.validation['final'])}")
    if "best" in s.validation:
        best = dict(s.validation["best"])
        where = best.pop("checkpoint", None)
        row("", "best: " + _validation_text(best) + (f" ({where})" if where else ""))
    if "scored" in s.validation:
        row("", "at the end, scored (no test split): " + ", ".join(
            f"{k} {v}" for k, v in s.validation["scored"].items() if not isinstance(v, str)))
    if s.test:
        row("test", ", ".join(f"{k} {v}" for k, v in s.test.items() if not isinstance(v, str)))
    kept = s.checkpoints["kept"]
    row("checkpoints", f"{len(kept)} kept" + (f": {kept[0]} ... {kept[-1]}" if len(kept) > 1 else
                                              f": {kept[0]}" if kept else "") +
        (f"; best: {', '.join(s.checkpoints['best'])}" if s.checkpoints["best"] else ""))
    lines.append("commands")
    for name, command in s.commands.items():
        row(name, command)
    return "\n".join(printable(line) for line in lines) + "\n"    # values come from files: escaped


def _validation_text(record: dict[str, Any]) -> str:
    parts = []
    if "valid_loss" in record:
        loss = record["valid_loss"]
        parts.append(f"loss {loss} (ppl {math.exp(min(loss, 700.0)):.2f})")
    if "valid_bleu" in record:
        parts.append(f"BLEU {record['valid_bleu']}")
    return ", ".join(parts) + f" at step {record.get('step')}"
