"""A `save_pretrained` directory as untrusted input: config.json, the safetensors weights (one file, or
shards listed by model.safetensors.index.json), nothing else read, and nothing in it ever run or unpickled."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xspec.base.errors import UserError
from xspec.base.input_dir import InputDirectory
from xspec.base.text import printable, shown
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


def checkpoint_directory(path: Path) -> InputDirectory:
    """The checkpoint directory, its files read only from inside it (a Hugging Face cache snapshot's blobs
    included: xspec/base/input_dir.py)."""
    return InputDirectory.open(path, "a Hugging Face save_pretrained directory")


def read_config(path: Path) -> dict[str, Any]:
    directory = checkpoint_directory(path)
    if not directory.has(CONFIG):
        raise UserError(f"{shown(directory.file(CONFIG))}: missing")
    config = directory.read_json(CONFIG, MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise UserError(f"{shown(directory.file(CONFIG))}: not a JSON object")
    return config


def open_weights(path: Path, config: dict[str, Any]) -> CheckpointDir:
    """The weights' headers, checked, and their tensors by name (memory-mapped, nothing read yet)."""
    directory = checkpoint_directory(path)
    if directory.has(INDEX):
        return CheckpointDir(path, config, _sharded(directory))
    if directory.has(SINGLE):
        single = SafetensorsFile(directory.checked(SINGLE))
        return CheckpointDir(path, config, {name: single for name in single.names})
    for name in PICKLED:
        if directory.has(name):
            raise UserError(
                f"{shown(directory.file(name))}: a pickle (torch.save) checkpoint; xspec reads only safetensors, "
                "since unpickling runs code. Convert a checkpoint you trust first: "
                "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW_DIR) writes safetensors")
    raise UserError(f"{shown(path)}: no {SINGLE} or {INDEX} (the weights of a save_pretrained directory)")


def _sharded(directory: InputDirectory) -> dict[str, SafetensorsFile]:
    index_path = shown(directory.file(INDEX))
    index = directory.read_json(INDEX, MAX_INDEX_BYTES)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise UserError(f"{index_path}: no weight_map of tensor names to file names")
    opened: dict[str, SafetensorsFile] = {}
    for shard in sorted(set(weight_map.values())):
        # A shard name is a file in this directory, never a path that leaves it.
        if "/" in shard or "\\" in shard or shard in ("", ".", "..") or not shard.endswith(".safetensors"):
            raise UserError(f"{index_path}: shard {shard!r} is not a .safetensors file in {shown(directory.path)}")
        if not directory.has(shard):
            raise UserError(f"{shown(directory.file(shard))}: missing (listed in {INDEX})")
        opened[shard] = SafetensorsFile(directory.checked(shard))
    files: dict[str, SafetensorsFile] = {}
    for name, shard in weight_map.items():
        if name not in opened[shard].names:
            raise UserError(f"{shown(directory.file(shard))}: has no tensor {printable(name)}, which {INDEX} places "
                            "there")
        files[name] = opened[shard]
    for shard, file in opened.items():
        stray = [n for n in file.names if weight_map.get(n) != shard]
        if stray:
            raise UserError(f"{shown(directory.file(shard))}: tensor {printable(stray[0])} is not listed there in "
                            f"{INDEX}")
    return files
