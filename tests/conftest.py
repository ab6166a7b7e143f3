"""Every command a test runs uses one thread (below); under pytest-xdist (`-n auto`, pyproject.toml), each
worker's own torch work shares the cores with the others.

The hostile-input suites never reach the command line's last resort: every case they try must end in a
message about the input (exit status 1 or 2) or succeed, never in "internal error" (status 70).

A suite is one of hostile_suites.py's (a test file's name, or a folder); for each of its tests, the CLI's
internal-error message is watched, and a test during which it was written fails naming what it said.

`pytest -m "not slow"` is the fast subset: the suites SLOW_SUITES names are marked slow.

After the tests, how many fuzz cases ran and what share compiled (tests/fuzz/tally.py): each worker
counts its own and hands them to the controller when it finishes, which prints them all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# One intra-op thread in the commands the tests run (the models are tiny), without measuring the machine's
# load (xspec/base/threads.py); also in those they run as processes.
os.environ["XSPEC_THREADS"] = "1"
# torch.compile's code where torch keeps it by default (the temporary directory), not in the user's cache
# where xspec keeps it (runtime/compile_choice.py): the tests write nothing under the home directory.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = default_cache_dir()

from hostile_suites import is_hostile_suite

TESTS = Path(__file__).parent
# What `pytest -m "not slow"` leaves out, for an edit-test loop (README): the fuzzers, the runs against
# transformers' classes, training and decoding runs, torch.compile, several processes, and the builds of
# every shipped spec (initialization, edited configs).
SLOW_SUITES = ("fuzz", "test_distributed.py", "test_compiled_step.py", "test_export.py", "test_prepared_data.py",
               "test_runtime_cli.py", "test_readme.py", "test_sweep.py", "test_families.py", "test_hf_import.py",
               "test_hf_export.py", "test_hf_finetune.py", "test_hf_multi_token.py", "test_hybrid.py",
               "test_language_model.py", "test_training.py", "test_hybrid_training.py", "test_ensemble.py",
               "test_experts_training.py", "test_readable_code.py", "test_run_log.py", "test_memory_plan.py",
               "test_multi_token.py", "test_equivalence.py", "test_table3.py", "test_plot.py", "test_hf_generation.py",
               "test_hf_chat.py", "test_lora.py", "test_initialize.py", "test_config_truth.py",
               "test_compiled_decoding.py")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(part in SLOW_SUITES for part in Path(str(item.fspath)).relative_to(TESTS).parts):
            item.add_marker(pytest.mark.slow)


def pytest_configure(config):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:       # a worker: the cores shared out, rather than each worker spinning threads on all
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:        # a worker: its fuzz counts go to the controller
        from fuzz.tally import tallies

        workeroutput["fuzz_tally"] = tallies()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from fuzz.tally import merge

    merge(getattr(node, "workeroutput", {}).get("fuzz_tally"))


def pytest_terminal_summary(terminalreporter):
    from fuzz.tally import summary

    lines = summary()
    if lines:
        terminalreporter.section("spec fuzzing")
        for line in lines:
            terminalreporter.write_line(line)


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

