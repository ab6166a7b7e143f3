"""Shared fixtures: a small corpus from the demo generator, and the toy spec of toy_spec.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from xspec.runtime.demo_data import generate_split  # noqa: E402
from xspec.runtime.run_dir import DataFiles, Split  # noqa: E402


def write_pairs(directory: Path, name: str, pairs: list[tuple[str, str]]) -> Split:
    directory.mkdir(parents=True, exist_ok=True)
    src, tgt = directory / f"{name}.src", directory / f"{name}.tgt"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return Split(src, tgt)


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: a second intra-op thread only adds synchronisation, and on a busy
    2-core machine spinning threads slow them down several times."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> DataFiles:
    directory = tmp_path_factory.mktemp("corpus")
    return DataFiles(write_pairs(directory, "train", generate_split("train", 400)),
                     write_pairs(directory, "valid", generate_split("valid", 20)),
                     write_pairs(directory, "test", generate_split("test", 8)))
