"""Checkpoint averaging (§6.1: "averaging the last 5 checkpoints" for base models, the last 20 for big)."""

from __future__ import annotations

from pathlib import Path

import torch

from xspec.errors import UserError
from xspec.runtime import checkpoint as ckpt


def average_checkpoints(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the checkpoints' tensors (accumulated in float64, stored as saved)."""
    first = ckpt.load_weights(paths[0])
    sums = {k: v.double() for k, v in first.tensors.items()}
    for path in paths[1:]:
        other = ckpt.load_weights(path)
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


def average_run(run_dir: Path, last: int, output: Path) -> list[Path]:
    """Writes the average of the run's last `last` checkpoints to `output` (safetensors, whatever its
    name); returns the checkpoints averaged."""
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    found = ckpt.list_checkpoints(run_dir)
    if not found:
        raise UserError(f"{run_dir}: no checkpoints in {run_dir / ckpt.CHECKPOINT_DIR}")
    if last > len(found):
        raise UserError(f"{run_dir}: --last {last}, but the run kept only {len(found)} checkpoints")
    if output.resolve() in {p.resolve() for p in found}:
        raise UserError(f"--output {output}: is one of the run's checkpoints; write the average elsewhere")
    chosen = found[-last:]
    newest = ckpt.load_weights(chosen[-1])
    tensors = average_checkpoints(chosen)
    ckpt.save_weights(output, tensors, newest.spec_source, newest.params, newest.vocab_proto, newest.step)
    return chosen
