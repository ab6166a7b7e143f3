"""Checkpoints: self-contained, written atomically, read as untrusted data and never unpickled.

A checkpoint `checkpoints/step-00001000.safetensors` holds the model's tensors, and in its metadata
the resolved spec, its parameters, the sentencepiece model and the step, so `xspec translate` needs
nothing else. Beside it, `step-00001000.state.safetensors` holds what exact resumption needs (the
optimizer's and the scheduler's state dicts and the data position), stored by `nested_state`:
tensors as tensors, everything else as JSON in the metadata. The state file is written first and
the weights last: a checkpoint exists once its weights do.

A LoRA run's checkpoint holds only its adapters (`...q_proj.lora_A`, `lora_B`) and, under BASE_KEY, a
reference to the checkpoint they adapt: its path, its SHA-256 and the adapters' scale. `load_merged` reads
both, checks the base is the file the run started from, and returns the model's weights with the adapters
merged in, which is what decoding, averaging, export and a later --init use.

Both are safetensors whatever their name (an average written as `averaged.pt` is one too). A
`torch.save` file (a zip archive or a pickle) is refused, since loading one means unpickling it.
What is read is checked before it is used: the metadata must be what xspec writes, the tensors
must match the model in name, shape and kind, and the training state must have the form the
optimizer and the scheduler write.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from xspec.base.errors import UserError
from xspec.base.files import write_atomically_with
from xspec.base.text import shown
from . import nested_state
from .lora import ADAPTER_PARTS, BASE_FORMS, is_adapter, merged_weight
from .older_names import current_names
from .run_dir import MAX_SPEC_BYTES

CHECKPOINT_DIR = "checkpoints"
_STEP_FILE = re.compile(r"step-(\d+)\.safetensors")
SPEC_KEY, PARAMS_KEY, VOCAB_KEY, STEP_KEY = "xspec.spec", "xspec.params", "xspec.sentencepiece", "xspec.step"
STATE_KEY = "xspec.state"
# A checkpoint imported from Hugging Face keeps its own tokenizer under VOCAB_KEY (tokenizer.json or a
# sentencepiece tokenizer.model) and describes it here (kind, bos and eos ids); absent: xspec's vocabulary.
TOKENIZER_KEY = "xspec.tokenizer"
BASE_KEY = "xspec.lora_base"       # a LoRA run's checkpoint: the checkpoint its adapters adapt (BaseRef)
SCALER_KEY = "scaler"                     # the fp16 loss scaler's state, in the training state
MAX_VOCAB_BYTES = 64 << 20           # a 37000-piece sentencepiece model is under 1 MiB
_STEP = re.compile(r"[0-9]{1,15}")
_ZIP, _PICKLE = b"PK\x03\x04", b"\x80"   # torch.save's archive; a bare pickle (protocol 2 and later)


@dataclass(frozen=True)
class BaseRef:
    """The checkpoint a LoRA run's adapters adapt: where it is, its SHA-256 (so a file replaced since is
    refused), the adapters' scale, lora_alpha / lora_rank, and how the run kept the adapted weights
    (train.lora_base; merging rounds them alike)."""

    path: Path
    sha256: str
    scaling: float
    stored: str = "float32"

    @classmethod
    def of(cls, path: Path, scaling: float, stored: str = "float32") -> "BaseRef":
        return cls(path.resolve(), file_sha256(path), scaling, stored)

    def text(self) -> str:
        return json.dumps({"path": str(self.path), "sha256": self.sha256, "scaling": self.scaling,
                           "stored": self.stored}, sort_keys=True)

    @classmethod
    def parse(cls, where: Path, text: str) -> "BaseRef":
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):
            raise _bad(where, BASE_KEY, "not JSON") from None
        if not isinstance(record, dict) or not {"path", "sha256", "scaling"} <= set(record) \
                or not set(record) <= {"path", "sha256", "scaling", "stored"}:
            raise _bad(where, BASE_KEY, "expected path, sha256, scaling and stored")
        path, digest, scaling = record["path"], record["sha256"], record["scaling"]
        stored = record.get("stored", "float32")        # absent: a run from before train.lora_base
        if not isinstance(path, str) or not path or "\x00" in path:
            raise _bad(where, BASE_KEY, "path: expected a file's path")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _bad(where, BASE_KEY, "sha256: expected 64 hexadecimal digits")
        if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not math.isfinite(scaling) \
                or scaling <= 0:
            raise _bad(where, BASE_KEY, "scaling: expected a positive number")
        if stored not in BASE_FORMS:
            raise _bad(where, BASE_KEY, f"stored: expected one of {', '.join(BASE_FORMS)}")
        return cls(Path(path), digest, float(scaling), stored)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Checkpoint:
    path: Path
    tensors: dict[str, torch.Tensor]
    spec_source: str
    params: dict
    vocab_proto: bytes
    step: int
    tokenizer: str | None = None        # TOKENIZER_KEY's description, for an imported checkpoint's own tokenizer
    base: BaseRef | None = None         # a LoRA run's: `tensors` are adapters of this checkpoint's weights


# --- writing -----------------------------------------------------------------------------------

def save_weights(path: Path, tensors: dict[str, torch.Tensor], spec_source: str, params: dict,
                 vocab_proto: bytes, step: int, tokenizer: str | None = None, base: BaseRef | None = None) -> None:
    """A safetensors file, whatever `path`'s suffix (`tokenizer`: an imported checkpoint's description;
    `base`: the checkpoint that `tensors`, a LoRA run's adapters, adapt)."""
    # Tied weights share storage; safetensors wants separate, contiguous CPU tensors.
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    metadata = {SPEC_KEY: spec_source, PARAMS_KEY: json.dumps(params, sort_keys=True),
                VOCAB_KEY: base64.b64encode(vocab_proto).decode("ascii"), STEP_KEY: str(step)}
    if tokenizer is not None:
        metadata[TOKENIZER_KEY] = tokenizer
    if base is not None:
        metadata[BASE_KEY] = base.text()
    write_atomically_with(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def save_state(path: Path, state: dict) -> None:
    tensors, structure = nested_state.encode(state)
    write_atomically_with(path, lambda tmp: save_file(tensors, str(tmp), metadata={STATE_KEY: structure}))


# --- reading -----------------------------------------------------------------------------------

def load_weights(path: Path) -> Checkpoint:
    metadata, tensors = _read_safetensors(path, "checkpoint")
    missing = [key for key in (SPEC_KEY, PARAMS_KEY, VOCAB_KEY, STEP_KEY) if key not in metadata]
    if missing:
        raise UserError(f"{path}: not an xspec checkpoint (its metadata has no {missing[0]})")
    return Checkpoint(path, current_names(tensors), _spec_text(path, metadata[SPEC_KEY]),
                      _params(path, metadata[PARAMS_KEY]),
                      _vocab_bytes(path, metadata[VOCAB_KEY]), _step(path, metadata[STEP_KEY]),
                      _tokenizer(metadata.get(TOKENIZER_KEY)),
                      BaseRef.parse(path, metadata[BASE_KEY]) if BASE_KEY in metadata else None)


def load_merged(path: Path) -> Checkpoint:
    """The checkpoint at `path` with the model's weights whole: a LoRA run's adapters merged into the weights
    of the checkpoint they adapt."""
    return merged(load_weights(path))


def merged(checkpoint: Checkpoint) -> Checkpoint:
    """`checkpoint` itself, or, for a LoRA run's, a copy holding its base's weights with W + scaling * B A in
    place of each adapted W (and no base reference)."""
    if checkpoint.base is None:
        return checkpoint
    base, where = load_base(checkpoint), checkpoint.path
    tensors = dict(base.tensors)
    names = {name.rsplit(".", 1)[0] for name in checkpoint.tensors}
    for layer in sorted(names):
        a, b = (checkpoint.tensors.get(f"{layer}.{part}") for part in ADAPTER_PARTS)
        weight = tensors.get(f"{layer}.weight")
        if a is None or b is None:
            raise UserError(f"{where}: tensor {layer}.{'lora_B' if a is not None else 'lora_A'} is missing "
                            "(each adapted layer has lora_A and lora_B)")
        if weight is None:
            raise UserError(f"{where}: adapters of {layer}, which has no weight in {base.path}")
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != weight.shape:
            raise UserError(f"{where}: adapters of {layer} of shapes {tuple(a.shape)} and {tuple(b.shape)} do not "
                            f"fit its weight of shape {tuple(weight.shape)} in {base.path}")
        tensors[f"{layer}.weight"] = merged_weight(weight, a, b, checkpoint.base.scaling, checkpoint.base.stored)
    return replace(checkpoint, tensors=tensors, base=None)


def load_base(checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint a LoRA run's adapters adapt, checked to be the file the run started from; `checkpoint`
    must hold adapters alone."""
    assert checkpoint.base is not None
    where, ref = checkpoint.path, checkpoint.base
    other = [name for name in checkpoint.tensors if not is_adapter(name)]
    if other:
        raise UserError(f"{where}: tensor {other[0]} beside LoRA adapters (metadata {BASE_KEY}): a LoRA run's "
                        "checkpoint holds adapters only")
    if not ref.path.is_file():
        raise UserError(f"{where}: its adapters adapt {shown(ref.path)} (metadata {BASE_KEY}), which is gone; put "
                        "that checkpoint back where it was")
    if file_sha256(ref.path) != ref.sha256:
        raise UserError(f"{where}: its adapters adapt {shown(ref.path)} as it was when the run started (metadata "
                        f"{BASE_KEY}, sha256 {ref.sha256[:12]}...); that file has changed since")
    base = load_weights(ref.path)
    if base.base is not None:
        raise UserError(f"{ref.path}: holds LoRA adapters itself (metadata {BASE_KEY}); the base of adapters must "
                        "hold whole weights")
    return base


def load_state(path: Path) -> dict:
    """The training state written beside a checkpoint, as `save_state` was given it."""
    legacy = path.with_name(path.name.replace(".state.safetensors", ".state.pt"))
    if not path.exists() and legacy.exists():
        _refuse_pickle(legacy)
    if not path.exists():
        raise UserError(f"{path}: missing (the training state written beside each checkpoint)")
    metadata, tensors = _read_safetensors(path, "training state")
    if STATE_KEY not in metadata:
        raise UserError(f"{path}: not an xspec training state (its metadata has no {STATE_KEY})")
    try:
        return nested_state.decode(tensors, metadata[STATE_KEY])
    except nested_state.StateFormatError as error:
        raise UserError(f"{path}: unusable training state ({error})") from None


def _read_safetensors(path: Path, what: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors) of a safetensors file; `what` ("checkpoint") names it in errors."""
    if not path.exists():
        raise UserError(f"{path}: no such {what} file")
    if not path.is_file():
        raise UserError(f"{path}: not a regular file, so not a {what}")
    # safetensors first (reading one never runs code): its first 8 bytes are a header length, which may
    # well begin with a pickle's 0x80 (one file in 256). Only a file it cannot read is named a pickle.
    try:
        with safe_open(str(path), "pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        with open(path, "rb") as f:
            start = f.read(9)
        if _is_pickle(start):
            _refuse_pickle(path)
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"{path}: corrupt or truncated {what} ({reason})") from None
    return metadata, tensors


def _is_pickle(start: bytes) -> bool:
    """Whether a file's first 9 bytes are torch.save's archive or a pickle. A safetensors header (JSON)
    opens at byte 8, so a damaged safetensors file whose length begins with 0x80 is not named a pickle."""
    if start.startswith(_ZIP):
        return True
    return start.startswith(_PICKLE) and start[8:9] != b"{"


def _refuse_pickle(path: Path) -> None:
    raise UserError(f"{path}: a torch.save (pickle) file; xspec loads only safetensors and never unpickles "
                    "(unpickling can run any code). Convert a file you trust with safetensors.torch.save_file")


def _bad(path: Path, key: str, problem: str) -> UserError:
    return UserError(f"{path}: not a checkpoint xspec wrote (metadata {key}: {problem})")


def _spec_text(path: Path, text: str) -> str:
    if len(text.encode("utf-8")) > MAX_SPEC_BYTES:
        raise _bad(path, SPEC_KEY, f"a spec of more than {MAX_SPEC_BYTES // 1024} KiB")
    return text


def _params(path: Path, text: str) -> dict:
    try:
        params = json.loads(text)
    except (ValueError, RecursionError):
        raise _bad(path, PARAMS_KEY, "not JSON") from None
    if not isinstance(params, dict) or not all(_is_constant(v) for v in params.values()):
        raise _bad(path, PARAMS_KEY, "not an object of parameter values")
    return params


def _is_constant(value) -> bool:
    """A spec parameter's value: a number, true/false, a string, or a list of those."""
    if isinstance(value, list):
        return all(_is_constant(v) for v in value)
    return isinstance(value, (bool, int, float, str))


def _vocab_bytes(path: Path, text: str) -> bytes:
    if len(text) > MAX_VOCAB_BYTES // 3 * 4 + 4:
        raise _bad(path, VOCAB_KEY, f"a vocabulary of more than {MAX_VOCAB_BYTES >> 20} MiB")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(path, VOCAB_KEY, "not base64") from None


def _tokenizer(text: str | None) -> str | None:
    return None if text in (None, "null") else text


def _step(path: Path, text: str) -> int:
    if not _STEP.fullmatch(text):
        raise _bad(path, STEP_KEY, f"{text[:20]!r} is not a step number")
    return int(text)


# --- the run's checkpoints -----------------------------------------------------------------------

def state_path(weights: Path) -> Path:
    return weights.with_name(weights.name.removesuffix(".safetensors") + ".state.safetensors")


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    return checkpoints_in(run_dir / CHECKPOINT_DIR)


def checkpoints_in(directory: Path) -> list[Path]:
    """The step-N.safetensors files in `directory`, by step."""
    found = [(int(m.group(1)), p) for p in directory.glob("step-*.safetensors") if (m := _STEP_FILE.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def weights_file(directory: Path, step: int) -> Path:
    """The weights of `step` in `directory`: step-N.safetensors (N zero-padded, so names sort by step)."""
    return directory / f"step-{step:08d}.safetensors"


def step_of(path: Path) -> int:
    """The step in a checkpoint's file name (step-N.safetensors)."""
    match = _STEP_FILE.fullmatch(path.name)
    assert match is not None, f"not a checkpoint file name: {path.name}"
    return int(match.group(1))


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


# --- checking against the model ------------------------------------------------------------------

def params_difference(saved: dict, current: dict) -> str | None:
    """A description of the first parameters that differ, or None when the spec matches."""
    current = json.loads(json.dumps(current))       # as stored: tuples become lists
    differing = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if not differing:
        return None
    shown = ", ".join(f"{k}: checkpoint {saved.get(k, '(absent)')!r}, spec {current.get(k, '(absent)')!r}"
                      for k in differing[:3])
    more = f" (and {len(differing) - 3} more)" if len(differing) > 3 else ""
    return shown + more


def load_into(model: torch.nn.Module, checkpoint: Checkpoint,
              load: Callable[[dict[str, torch.Tensor]], None] | None = None) -> None:
    """Copies the tensors into `model` (through `load`, for a model sharded over processes), naming the
    first tensor whose name, shape or kind does not match, or that holds NaN or an infinity (a model computes
    nothing with it)."""
    expected = model.state_dict()
    check_tensors(checkpoint, {name: tuple(tensor.shape) for name, tensor in expected.items()}, "the model",
                  "a checkpoint from a different spec")
    for name, tensor in checkpoint.tensors.items():
        if not _same_kind(expected[name].dtype, tensor.dtype):
            raise UserError(f"{checkpoint.path}: tensor {name} holds {tensor.dtype}, "
                            f"the model expects {expected[name].dtype}")
        check_finite(checkpoint.path, name, tensor)
    (load or model.load_state_dict)(checkpoint.tensors)


# NaN and infinities are looked for this many elements at a time: no second copy of a large tensor.
FINITE_CHUNK = 1 << 24


def check_finite(where: object, name: str, tensor: torch.Tensor) -> None:
    """Refuses a weight holding NaN or an infinity, naming the file (`where`), the tensor and the place."""
    found = first_non_finite(tensor)
    if found is not None:
        raise UserError(f"{where}: tensor {name} holds {found[1]} at {found[0]}: weights must be finite numbers")


def first_non_finite(tensor: torch.Tensor) -> tuple[list[int], float] | None:
    """Where a floating-point tensor first holds NaN or an infinity, and that value; None where nowhere."""
    if not tensor.is_floating_point():
        return None
    flat = tensor.reshape(-1)
    for start in range(0, flat.numel(), FINITE_CHUNK):
        bad = (~torch.isfinite(flat[start:start + FINITE_CHUNK])).nonzero()
        if len(bad):
            index = start + int(bad[0])
            at = [int(i) for i in torch.unravel_index(torch.tensor(index), tensor.shape)] if tensor.dim() else []
            return at, float(flat[index])
    return None


def check_tensors(checkpoint: Checkpoint, expected: dict[str, tuple[int, ...]], model: str, why: str) -> None:
    """The checkpoint's tensors are `expected`'s (the names and shapes of `model`, as a message names it),
    name for name and shape for shape; the first that differs is named, with `why` it matters."""
    for name, tensor in checkpoint.tensors.items():
        if name not in expected:
            raise UserError(f"{checkpoint.path}: tensor {name} is not in {model} ({why})")
        if tuple(tensor.shape) != tuple(expected[name]):
            raise UserError(f"{checkpoint.path}: tensor {name} has shape {tuple(tensor.shape)}; {model} has "
                            f"{tuple(expected[name])} ({why})")
    missing = [name for name in expected if name not in checkpoint.tensors]
    if missing:
        raise UserError(f"{checkpoint.path}: no tensor {missing[0]}, which {model} has ({why})")


def _same_kind(expected: torch.dtype, found: torch.dtype) -> bool:
    """Floating-point tensors may change precision (a bf16 average loads into a float32 model);
    anything else must match exactly."""
    return found.is_floating_point if expected.is_floating_point else found == expected


def restore_training_state(path: Path, state, optimizer: torch.optim.Optimizer, scheduler,
                           load_optimizer: Callable[[dict], None] | None = None,
                           scaler: torch.amp.GradScaler | None = None) -> dict:
    """Loads the optimizer's (through `load_optimizer`, for sharded parameters), the scheduler's and the
    fp16 loss scaler's state from `state` (read by `load_state(path)`) and returns its progress record. A
    state of another form is refused before anything is loaded. A saved loss scale is ignored by a run
    without a scaler (resumed in another precision); a run with one, resumed from a state without, starts
    from the scaler's initial scale, as a new run does."""
    problem = _state_problem(state, optimizer, scheduler, scaler)
    if problem:
        raise UserError(f"{path}: unusable training state ({problem})")
    try:
        (load_optimizer or optimizer.load_state_dict)(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and SCALER_KEY in state:
            scaler.load_state_dict(state[SCALER_KEY])
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise UserError(f"{path}: unusable training state ({error})") from None
    return state["progress"]


def _state_problem(state, optimizer: torch.optim.Optimizer, scheduler, scaler) -> str | None:
    if not isinstance(state, dict) or not {"optimizer", "scheduler", "progress"} <= set(state) <= \
            {"optimizer", "scheduler", "progress", SCALER_KEY}:
        return "expected the optimizer's, the scheduler's and the progress record (and the loss scaler's)"
    if not isinstance(state["progress"], dict):
        return "progress: expected a dict"
    return _optimizer_problem(optimizer, state["optimizer"]) or \
        nested_state.mismatch(scheduler.state_dict(), state["scheduler"], ("scheduler",)) or \
        (_scaler_problem(scaler, state[SCALER_KEY]) if scaler is not None and SCALER_KEY in state else None)


def _scaler_problem(scaler: torch.amp.GradScaler, saved) -> str | None:
    problem = nested_state.mismatch(scaler.state_dict(), saved, (SCALER_KEY,))
    if problem:
        return problem
    if not all(math.isfinite(v) and v >= 0 for v in saved.values()) or saved["scale"] <= 0:
        return f"{SCALER_KEY}: expected a positive, finite scale and finite, non-negative settings"
    return None


def _optimizer_problem(optimizer: torch.optim.Optimizer, saved) -> str | None:
    """The groups must have the form of this optimizer's, and each parameter's state tensors the
    parameter's shape (or be single numbers, such as Adam's step)."""
    if not isinstance(saved, dict) or set(saved) != {"state", "param_groups"}:
        return "optimizer: expected its state and param_groups"
    problem = nested_state.mismatch(optimizer.state_dict()["param_groups"], saved["param_groups"],
                                    ("optimizer", "param_groups"))
    if problem:
        return problem
    if not isinstance(saved["state"], dict):
        return "optimizer/state: expected a dict"
    saved_ids = chain.from_iterable(group["params"] for group in saved["param_groups"])
    parameters = dict(zip(saved_ids, chain.from_iterable(group["params"] for group in optimizer.param_groups)))
    for index, values in saved["state"].items():
        where = f"optimizer/state/{index}"
        if index not in parameters or not isinstance(values, dict):
            return f"{where}: not the state of one of the optimizer's parameters"
        for name, value in values.items():
            shape = parameters[index].shape
            if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
                return f"{where}/{name}: expected a floating-point tensor"
            if value.dim() > 0 and value.shape != shape:
                return f"{where}/{name}: shape {tuple(value.shape)}, the parameter's is {tuple(shape)}"
    return None
