"""Checkpoints: self-contained, written atomically, loaded without unpickling arbitrary objects.

A checkpoint `checkpoints/step-00001000.safetensors` holds the model's tensors, and in its metadata
the resolved spec, its parameters and the sentencepiece model, so `xspec translate` needs nothing
else. Beside it, `step-00001000.state.pt` holds what exact resumption needs (optimizer, scheduler,
RNG states, data position) as plain tensors and numbers (`torch.load(weights_only=True)`).
The state file is written first and the weights last: a checkpoint exists once its weights do.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from xspec.errors import UserError

CHECKPOINT_DIR = "checkpoints"
_STEP_FILE = re.compile(r"step-(\d+)\.safetensors$")


@dataclass
class Checkpoint:
    path: Path
    tensors: dict[str, torch.Tensor]
    spec_source: str
    params: dict
    vocab_proto: bytes
    step: int


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _metadata(spec_source: str, params: dict, vocab_proto: bytes, step: int) -> dict[str, str]:
    return {"xspec.spec": spec_source, "xspec.params": json.dumps(params, sort_keys=True),
            "xspec.sentencepiece": base64.b64encode(vocab_proto).decode("ascii"), "xspec.step": str(step)}


def save_weights(path: Path, tensors: dict[str, torch.Tensor], spec_source: str, params: dict,
                 vocab_proto: bytes, step: int) -> None:
    """`.safetensors` for checkpoints; any other name (e.g. `averaged.pt`) is a `torch.save` of plain data."""
    # Tied weights share storage; both formats want separate, contiguous CPU tensors.
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    metadata = _metadata(spec_source, params, vocab_proto, step)
    if path.suffix == ".safetensors":
        _atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    else:
        _atomic(path, lambda tmp: torch.save({"tensors": tensors, "metadata": metadata}, tmp))


def load_weights(path: Path) -> Checkpoint:
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint file")
    try:
        with open(path, "rb") as f:
            is_zip = f.read(2) == b"PK"          # torch.save writes a zip archive
        if is_zip:
            data = torch.load(path, map_location="cpu", weights_only=True)
            tensors, metadata = data["tensors"], data["metadata"]
        else:
            tensors = load_file(str(path))
            with safe_open(str(path), "pt") as f:
                metadata = f.metadata() or {}
        return Checkpoint(path, tensors, metadata["xspec.spec"], json.loads(metadata["xspec.params"]),
                          base64.b64decode(metadata["xspec.sentencepiece"]), int(metadata["xspec.step"]))
    except (SafetensorError, RuntimeError, KeyError, TypeError, ValueError, EOFError, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"{path}: corrupt or truncated checkpoint ({reason})") from None


def save_state(path: Path, state: dict) -> None:
    _atomic(path, lambda tmp: torch.save(state, tmp))


def load_state(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"{path}: missing (the training state written beside each checkpoint)") from None
    except Exception as error:   # torch raises several types for a damaged zip; all mean the same here
        raise UserError(f"{path}: corrupt or truncated training state ({str(error).splitlines()[0]})") from None


def state_path(weights: Path) -> Path:
    return weights.with_name(weights.name.replace(".safetensors", ".state.pt"))


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    directory = run_dir / CHECKPOINT_DIR
    found = [(int(m.group(1)), p) for p in directory.glob("step-*.safetensors") if (m := _STEP_FILE.search(p.name))]
    return [p for _, p in sorted(found)]


def resolve(run_or_checkpoint: Path) -> Path:
    """A run directory means its latest checkpoint."""
    if run_or_checkpoint.is_dir():
        found = list_checkpoints(run_or_checkpoint)
        if not found:
            raise UserError(f"{run_or_checkpoint}: no checkpoints in {run_or_checkpoint / CHECKPOINT_DIR}")
        return found[-1]
    if not run_or_checkpoint.exists():
        raise UserError(f"{run_or_checkpoint}: no such run directory or checkpoint")
    return run_or_checkpoint


def prune(run_dir: Path, keep: int) -> None:
    """Keeps the last `keep` checkpoints (§6.1 averages the last 5 or 20, so keep at least that many)."""
    for old in list_checkpoints(run_dir)[:-keep]:
        state_path(old).unlink(missing_ok=True)
        old.unlink(missing_ok=True)


def params_difference(saved: dict, current: dict) -> str | None:
    """A description of the first parameters that differ, or None when the spec matches."""
    differing = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if not differing:
        return None
    shown = ", ".join(f"{k}: checkpoint {saved.get(k, '(absent)')!r}, spec {current.get(k, '(absent)')!r}"
                      for k in differing[:3])
    more = f" (and {len(differing) - 3} more)" if len(differing) > 3 else ""
    return shown + more


def load_into(model: torch.nn.Module, checkpoint: Checkpoint) -> None:
    """Copies the tensors into `model`, naming the first tensor whose name or shape does not match."""
    expected = model.state_dict()
    for name, tensor in checkpoint.tensors.items():
        if name not in expected:
            raise UserError(f"{checkpoint.path}: tensor {name} is not in the model "
                            "(a checkpoint from a different spec)")
        if expected[name].shape != tensor.shape:
            raise UserError(f"{checkpoint.path}: tensor {name} has shape {tuple(tensor.shape)}, "
                            f"the model expects {tuple(expected[name].shape)} (a checkpoint from a different spec)")
    missing = [k for k in expected if k not in checkpoint.tensors]
    if missing:
        raise UserError(f"{checkpoint.path}: no tensor {missing[0]} (a checkpoint from a different spec)")
    model.load_state_dict(checkpoint.tensors)
