"""Checkpoint averaging (§6.1: "averaging the last 5 checkpoints" for base models, the last 20 for big), or
of the best-validated checkpoints a run kept (train.keep_best)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from xspec.base.errors import UserError
from . import checkpoint as ckpt
from .best import Criterion, best_dir
from .run_dir import METRICS_LOG, check_directory, read_metrics_log


def average_checkpoints(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the checkpoints' tensors (accumulated in float64, stored as saved); a LoRA run's
    are averaged with their adapters merged, so the average holds whole weights."""
    first = ckpt.load_merged(paths[0])
    sums = {k: v.double() for k, v in first.tensors.items()}
    for path in paths[1:]:
        other = ckpt.load_merged(path)
        difference = ckpt.params_difference(first.params, other.params)
        if difference or other.tensors.keys() != sums.keys():
            detail = f" ({difference})" if difference else ""
            raise UserError(f"{path}: not from the same spec as {paths[0]}{detail}")
        for k, v in other.tensors.items():
            if v.shape != sums[k].shape:
                raise UserError(f"{path}: tensor {k} has shape {tuple(v.shape)}, but {tuple(sums[k].shape)} "
                                f"in {paths[0]}")
            sums[k] += v.double()
    return {k: (v / len(paths)).to(first.tensors[k].dtype) for k, v in sums.items()}


def average_run(run_dir: Path, output: Path, last: Optional[int] = None, best: Optional[int] = None) -> list[Path]:
    """Writes the average of the run's `last` latest checkpoints (None: its spec's train.average_last), or
    of its `best` best-validated ones (RUN/checkpoints/best/, ranked by what the run logged), to `output`
    (safetensors, whatever its name); returns the checkpoints averaged."""
    assert last is None or best is None, "average the last N or the best N"
    check_directory(run_dir)
    if best is not None:
        found = best_checkpoints(run_dir)
        if best > len(found):
            raise UserError(f"{run_dir}: --best {best}, but the run kept the best {len(found)} "
                            f"(train.keep_best) in {best_dir(run_dir)}")
        chosen = found[:best]
    else:
        found = ckpt.list_checkpoints(run_dir)
        if not found:
            raise UserError(f"{run_dir}: no checkpoints in {run_dir / ckpt.CHECKPOINT_DIR}")
        if last is None:        # the spec's train.average_last (§6.1: 5 base, 20 big)
            from .inference import compile_checkpoint_spec

            last = compile_checkpoint_spec(ckpt.load_weights(found[-1])).train.average_last
        if last > len(found):
            raise UserError(f"{run_dir}: --last {last}, but the run kept only {len(found)} checkpoints")
        chosen = found[-last:]
    if output.resolve() in {p.resolve() for p in found}:
        raise UserError(f"--output {output}: is one of the run's checkpoints; write the average elsewhere")
    newest = ckpt.load_weights(max(chosen, key=ckpt.step_of))
    tensors = average_checkpoints(chosen)
    ckpt.save_weights(output, tensors, newest.spec_source, newest.params, newest.vocab_proto, newest.step,
                      newest.tokenizer)
    return chosen


def best_checkpoints(run_dir: Path) -> list[Path]:
    """The run's best-validated checkpoints, best first: ranked by the validation figure metrics.jsonl
    logged at their step (BLEU when the run validated it, else the loss)."""
    kept = {ckpt.step_of(p): p for p in ckpt.checkpoints_in(best_dir(run_dir))}
    logged = {r["step"]: r for r in read_metrics_log(run_dir) if "valid_loss" in r}
    missing = sorted(step for step in kept if step not in logged)
    if missing:
        raise UserError(f"{kept[missing[0]]}: {run_dir / METRICS_LOG} logged no validation at step {missing[0]}")
    criterion = Criterion.of(validate_bleu=any("valid_bleu" in logged[step] for step in kept))
    sign = -1.0 if criterion.higher_is_better else 1.0
    return [kept[step] for step in sorted(kept, key=lambda s: (sign * logged[s][criterion.metric], s))]
