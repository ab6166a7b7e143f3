"""Where compiling is chosen, and where torch.compile keeps its code between runs (runtime/compile_choice.py)."""

from __future__ import annotations

import os

import torch

from xspec.runtime.compile_choice import CACHE_VARIABLE, keep_compiled_code, use_compile


def test_auto_compiles_on_cuda_and_not_on_a_cpu():
    assert use_compile("auto", torch.device("cuda")) and not use_compile("auto", torch.device("cpu"))
    assert use_compile("on", torch.device("cpu")) and not use_compile("off", torch.device("cuda"))


def test_compiled_code_is_kept_in_the_user_s_cache_unless_the_user_chose_a_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = keep_compiled_code()
    assert folder == tmp_path / "cache" / "xspec" / "torch-compile" and folder.is_dir()
    assert os.environ[CACHE_VARIABLE] == str(folder)      # where torch's inductor reads it
    assert folder.stat().st_mode & 0o077 == 0             # code that runs: no one else's to write

    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "mine"))
    assert keep_compiled_code() == tmp_path / "mine"      # the user's choice stands
    assert os.environ[CACHE_VARIABLE] == str(tmp_path / "mine")


def test_without_a_usable_cache_folder_torch_keeps_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_VARIABLE, raising=False)
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))      # a file where the folder would go
    assert keep_compiled_code() is None and CACHE_VARIABLE not in os.environ


def test_a_relative_xdg_cache_home_is_ignored_as_the_standard_says(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert keep_compiled_code() == tmp_path / "home" / ".cache" / "xspec" / "torch-compile"
