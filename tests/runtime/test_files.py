"""xspec/base/files.py: atomic writes with the umask's permissions, output paths checked early, and
inputs read only from regular files."""

from __future__ import annotations

import os
import signal
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest

from xspec.base.errors import UserError
from xspec.base.files import (check_output_dir, check_output_file, link_atomically, read_regular_file,
                              write_atomically, write_atomically_with, write_bytes_atomically)


@contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_get_the_umask_permissions(tmp_path, mask, mode):
    with umask(mask):
        text = write_atomically(tmp_path / "a.txt", "héllo\n")
        data = write_bytes_atomically(tmp_path / "b.bin", b"\x00\x01")
        # safetensors' save_file (like mkstemp) creates its file 0o600 whatever the umask
        called = write_atomically_with(tmp_path / "c.bin", lambda tmp: os.chmod(tmp, 0o600))
    assert [_mode(p) for p in (text, data, called)] == [mode] * 3
    assert text.read_text(encoding="utf-8") == "héllo\n" and data.read_bytes() == b"\x00\x01"


def test_a_write_replaces_the_file_and_creates_its_folders(tmp_path):
    path = tmp_path / "new" / "folder" / "out.txt"
    write_atomically(path, "first")
    write_atomically(path, "second")
    assert path.read_text() == "second"
    assert _leftovers(path.parent) == []


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = write_atomically(tmp_path / "out.txt", "kept")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically_with(path, fail)
    with pytest.raises(KeyboardInterrupt):
        write_atomically_with(path, lambda tmp: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert path.read_text() == "kept"
    assert _leftovers(tmp_path) == []


def test_a_link_names_the_same_file_and_outlives_its_source(tmp_path, monkeypatch):
    source = write_atomically(tmp_path / "a" / "source", "weights")
    write_atomically(tmp_path / "b" / "linked", "older")
    linked = link_atomically(source, tmp_path / "b" / "linked")
    assert linked.samefile(source)
    source.unlink()
    assert linked.read_text() == "weights"
    assert _leftovers(tmp_path / "b") == []
    # where the filesystem refuses hard links, a copy
    monkeypatch.setattr(os, "link", lambda *_: (_ for _ in ()).throw(OSError("not supported")))
    copied = link_atomically(linked, tmp_path / "c" / "copied")
    assert copied.read_text() == "weights" and not copied.samefile(linked)


def test_writing_over_a_directory_fails_and_cleans_up(tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(OSError):
        write_atomically(tmp_path / "folder", "x")
    assert _leftovers(tmp_path) == []


# --- output paths --------------------------------------------------------------------------------

def test_output_file_checks(tmp_path):
    path = tmp_path / "new" / "deeper" / "out.txt"
    assert check_output_file(path, "--output") == path
    assert not (tmp_path / "new").exists()             # checked, not created
    with pytest.raises(UserError, match=r"^--output .*: is a directory; give a file name$"):
        check_output_file(tmp_path, "--output")
    (tmp_path / "file.txt").write_text("")
    with pytest.raises(UserError, match=r"^--output .*file\.txt/x/out\.txt: .*file\.txt is not a directory$"):
        check_output_file(tmp_path / "file.txt" / "x" / "out.txt", "--output")
    with pytest.raises(UserError, match="^--output .*: a path cannot contain a NUL byte$"):
        check_output_file(Path(str(tmp_path) + "/a\0b/out.txt"), "--output")


def test_output_dir_checks(tmp_path):
    check_output_dir(tmp_path / "runs" / "new", "--out")
    check_output_dir(tmp_path, "--out")
    (tmp_path / "file.txt").write_text("")
    with pytest.raises(UserError, match=r"^--out .*file\.txt: .*file\.txt is not a directory$"):
        check_output_dir(tmp_path / "file.txt", "--out")


def test_output_in_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        with pytest.raises(UserError, match="cannot write in"):
            check_output_file(folder / "out.txt", "--output")
    finally:
        folder.chmod(0o755)


# --- inputs: regular files only ------------------------------------------------------------------

@contextmanager
def _fails_after(seconds: int):
    """A read that blocks would hang the suite; fail it instead."""
    def alarm(signum, frame):
        raise TimeoutError("the read blocked")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "train.en"
    os.mkfifo(fifo)
    with _fails_after(5), pytest.raises(UserError, match=r"train\.en: is a FIFO; only regular files are read"):
        read_regular_file(fifo)


def test_a_character_device_is_refused():
    with pytest.raises(UserError, match="/dev/zero: is a character device; only regular files are read"):
        read_regular_file(Path("/dev/zero"))


def test_symlink_loop_nul_byte_and_directory(tmp_path):
    loop = tmp_path / "loop.en"
    loop.symlink_to(loop)
    with pytest.raises(UserError, match=r"loop\.en: cannot read: Too many levels of symbolic links"):
        read_regular_file(loop)
    with pytest.raises(UserError, match="a path cannot contain a NUL byte"):
        read_regular_file(Path(str(tmp_path / "a\0b")))
    with pytest.raises(UserError, match="is a directory, not a text file"):
        read_regular_file(tmp_path)


def test_size_limit(tmp_path):
    path = tmp_path / "spec.xspec"
    path.write_bytes(b"x" * 101)
    assert read_regular_file(path, max_bytes=101) == b"x" * 101
    with pytest.raises(UserError, match=r"spec\.xspec: larger than 100 bytes"):
        read_regular_file(path, max_bytes=100)
