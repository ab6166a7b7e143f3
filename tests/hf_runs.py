"""What a family's import tests share: random checkpoints made once per test process, by index, written by
transformers' save_pretrained (`saved`), and imported (`imported`)."""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable


class Checkpoints:
    """`reference(index)`: the model to save; `name(index)`: its directory's name under `root`."""

    def __init__(self, prefix: str, reference: Callable[[int], Any], name: Callable[[int], str]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self.reference, self.name = reference, name

    @functools.cache
    def saved(self, index: int) -> Path:
        path = self.root / self.name(index)
        self.reference(index).save_pretrained(path)
        return path

    @functools.cache
    def imported(self, index: int) -> Path:
        from xspec.hf.importer import import_checkpoint

        run = self.root / f"run-{index}"
        import_checkpoint(self.saved(index), run, say=lambda line: None)
        return run

    def with_config(self, index: int, directory: Path, change: dict) -> Path:
        """Checkpoint `index` with its config.json changed by `change`, in `directory` (beside a copy of its
        weights)."""
        directory.mkdir()
        config = json.loads((self.saved(index) / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, **change}))
        shutil.copy(self.saved(index) / "model.safetensors", directory / "model.safetensors")
        return directory


def read_alike(ours, theirs, lines: list[str]) -> list[list[int]]:
    """Asserts that an import's tokenizer (`ours`) encodes `lines` as a source into the ids transformers'
    tokenizer (`theirs`) makes of them, and decodes those ids into its texts; returns the ids."""
    ids = theirs(lines)["input_ids"]
    assert ours.encode_sources(lines) == ids
    assert [ours.decode(i) for i in ids] == theirs.batch_decode(ids, skip_special_tokens=True)
    return ids
