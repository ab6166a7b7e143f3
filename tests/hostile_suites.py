"""The hostile-input suites: the test files (and folders) whose cases are inputs built to break xspec."""

from __future__ import annotations

from pathlib import Path

HOSTILE_SUITES = ("test_hostile_input.py", "test_hf_hostile.py", "test_hf_hostile_files.py", "test_output_dir.py",
                  "test_prepared_hostile.py", "test_prepare_formats.py", "test_tokenizer_hostile.py", "fuzz")


def is_hostile_suite(path: Path) -> bool:
    return path.name in HOSTILE_SUITES or any(part in HOSTILE_SUITES for part in path.parent.parts)
