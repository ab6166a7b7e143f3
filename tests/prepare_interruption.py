"""A text prepare stopped partway, as by Ctrl-C, for the tests of its resume."""

from __future__ import annotations

import pytest

from xspec.runtime.prepared import prepare as prepare_module


def stop_after(patch: pytest.MonkeyPatch, chunks: int) -> None:
    """Makes the next text prepare write chunks of 16 lines, record its progress after each, and stop with
    KeyboardInterrupt once it has written `chunks` of them (the last one written but not recorded)."""
    patch.setattr(prepare_module, "CHUNK_LINES", 16)
    patch.setattr(prepare_module, "CHECKPOINT_SECONDS", 0.0)
    original = prepare_module._TextWriter.add

    def add(self, encoded):
        original(self, encoded)
        self.chunks_written = getattr(self, "chunks_written", 0) + 1
        if self.chunks_written == chunks:
            raise KeyboardInterrupt

    patch.setattr(prepare_module._TextWriter, "add", add)
