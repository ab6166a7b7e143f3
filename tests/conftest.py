"""Every command a test runs uses one thread (below).

The hostile-input suites never reach the command line's last resort: every case they try must end in a
message about the input (exit status 1 or 2) or succeed, never in "internal error" (status 70).

A suite is one of hostile_suites.py's (a test file's name, or a folder); for each of its tests, the CLI's
internal-error message is watched, and a test during which it was written fails naming what it said."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# One intra-op thread in the commands the tests run (the models are tiny), without measuring the machine's
# load (xspec/base/threads.py); also in those they run as processes.
os.environ["XSPEC_THREADS"] = "1"

from hostile_suites import is_hostile_suite


@pytest.fixture(autouse=True)
def never_an_internal_error(request, monkeypatch):
    if not is_hostile_suite(Path(str(request.node.fspath))):
        yield
        return
    from xspec import cli

    said: list[str] = []
    original = cli.internal_error_message

    def watched(*args, **kwargs) -> str:
        said.append(original(*args, **kwargs))
        return said[-1]

    monkeypatch.setattr(cli, "internal_error_message", watched)
    yield
    assert not said, f"a hostile input reached the CLI's last resort: {said[0]}"
