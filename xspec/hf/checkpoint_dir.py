"""A `save_pretrained` directory as untrusted input: config.json, the safetensors weights (one file, or
shards listed by model.safetensors.index.json), nothing else read, and nothing in it ever run or unpickled."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xspec.base.errors import UserError
from xspec.base.files import read_regular_file
from xspec.hf.safetensors_file import SafetensorsFile

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.bin")
MAX_CONFIG_BYTES = 1 << 20      # a real config.json is a few KiB
MAX_INDEX_BYTES = 64 << 20      # an index names every tensor once: a few MiB for the largest models


@dataclass
class CheckpointDir:
    path: Path
    config: dict[str, Any]
    files: dict[str, SafetensorsFile]      # tensor name -> the file holding it

    def shape(self, name: str) -> tuple[int, ...]:
        return self.files[name].shape(name)

    def tensor(self, name: str) -> torch.Tensor:
        return self.files[name].tensor(name)

    @property
    def weight_bytes(self) -> int:
        return sum(f.dtype(n).itemsize * _count(f.shape(n)) for n, f in self.files.items())


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


def read_json(path: Path, limit: int) -> Any:
    if not path.exists():
        raise UserError(f"{path}: missing")
    try:
        return json.loads(read_regular_file(path, limit).decode("utf-8"), parse_constant=_not_a_number)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise UserError(f"{path}: not JSON ({str(error).splitlines()[0]})") from None


def _not_a_number(word: str) -> None:
    raise ValueError(f"{word} is not a JSON number")


def read_config(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise UserError(f"{directory}: not a directory (a Hugging Face save_pretrained directory is expected)")
    config = read_json(directory / CONFIG, MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise UserError(f"{directory / CONFIG}: not a JSON object")
    return config


def open_weights(directory: Path, config: dict[str, Any]) -> CheckpointDir:
    """The weights' headers, checked, and their tensors by name (memory-mapped, nothing read yet)."""
    if (directory / INDEX).exists():
        return CheckpointDir(directory, config, _sharded(directory))
    if (directory / SINGLE).exists():
        single = SafetensorsFile(directory / SINGLE)
        return CheckpointDir(directory, config, {name: single for name in single.names})
    for name in PICKLED:
        if (directory / name).exists():
            raise UserError(
                f"{directory / name}: a pickle (torch.save) checkpoint; xspec reads only safetensors, since "
                "unpickling runs code. Convert a checkpoint you trust first: "
                "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW_DIR) writes safetensors")
    raise UserError(f"{directory}: no {SINGLE} or {INDEX} (the weights of a save_pretrained directory)")


def _sharded(directory: Path) -> dict[str, SafetensorsFile]:
    index_path = directory / INDEX
    index = read_json(index_path, MAX_INDEX_BYTES)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise UserError(f"{index_path}: no weight_map of tensor names to file names")
    opened: dict[str, SafetensorsFile] = {}
    for shard in sorted(set(weight_map.values())):
        # A shard name is a file in this directory, never a path that leaves it.
        if "/" in shard or "\\" in shard or shard in ("", ".", "..") or not shard.endswith(".safetensors"):
            raise UserError(f"{index_path}: shard {shard!r} is not a .safetensors file in {directory}")
        if not (directory / shard).is_file():
            raise UserError(f"{directory / shard}: missing (listed in {INDEX})")
        opened[shard] = SafetensorsFile(directory / shard)
    files: dict[str, SafetensorsFile] = {}
    for name, shard in weight_map.items():
        if name not in opened[shard].names:
            raise UserError(f"{directory / shard}: has no tensor {name}, which {INDEX} places there")
        files[name] = opened[shard]
    for shard, file in opened.items():
        stray = [n for n in file.names if weight_map.get(n) != shard]
        if stray:
            raise UserError(f"{directory / shard}: tensor {stray[0]} is not listed there in {INDEX}")
    return files
