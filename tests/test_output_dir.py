"""Directories xspec writes whole (exports): complete or absent, replacing only what xspec wrote there as it
left it, and removing the staging folders of writers that died, never a living writer's."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from xspec.base.errors import UserError
from xspec.base.output_dir import WRITTEN, check_replaceable, write_directory


def files(*names: str):
    def fill(staging: Path) -> None:
        for name in names:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(name)
    return fill


def refusal(path: Path) -> str:
    with pytest.raises(UserError) as error:
        check_replaceable(path, "-o", "export")
    return str(error.value)


def test_the_record_lists_every_file_and_folder_written(tmp_path):
    out = tmp_path / "out"
    write_directory(check_replaceable(out, "-o", "export"), files("a.bin", "sub/b.txt"), "xspec export")
    record = json.loads((out / WRITTEN).read_text())
    assert (record["writer"], record["files"]) == ("xspec export", ["a.bin", "sub", "sub/b.txt"])
    assert record["stamps"] == {name: [os.stat(out / name).st_size, os.stat(out / name).st_mtime_ns]
                                for name in ("a.bin", "sub/b.txt")}
    write_directory(check_replaceable(out, "-o", "export"), files("c.bin"), "xspec export")
    assert sorted(p.name for p in out.iterdir()) == [WRITTEN, "c.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("change, stray", [
    (lambda out: (out / "notes.txt").write_text("mine"), "notes.txt"),
    (lambda out: (out / "sub" / "added.txt").write_text("mine"), "sub/added.txt"),
    (lambda out: (out / WRITTEN).unlink(), "a.bin"),
    (lambda out: (out / WRITTEN).write_text('{"files": ["a.bin", "sub", "sub/b.txt", 1]}'), "a.bin"),
    (lambda out: (out / WRITTEN).write_text("not json"), "a.bin"),
    (lambda out: ((out / WRITTEN).unlink(), (out / WRITTEN).symlink_to("/etc/passwd")), "a.bin"),
])
def test_a_directory_holding_anything_unrecorded_is_refused_and_kept(tmp_path, change, stray):
    out = tmp_path / "out"
    write_directory(out, files("a.bin", "sub/b.txt"), "xspec export")
    change(out)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert refusal(out) == (f"-o {out}: holds {stray}, which no xspec export wrote there; give a new or empty "
                            "directory (xspec replaces only a directory it wrote, as it left it)")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_a_file_edited_since_it_was_written_is_refused_and_kept(tmp_path):
    """The record lists it, but not as it is now: what the user changed is not replaced."""
    out = tmp_path / "out"
    write_directory(out, files("a.bin", "sub/b.txt"), "xspec export")
    (out / "sub" / "b.txt").write_text("edited by hand")
    assert refusal(out) == (f"-o {out}: holds sub/b.txt, which has changed since xspec wrote it; give a new or "
                            "empty directory (xspec replaces only a directory it wrote, as it left it)")
    assert (out / "sub" / "b.txt").read_text() == "edited by hand"
    record = json.loads((out / WRITTEN).read_text())     # a record of an older version: names only
    (out / WRITTEN).write_text(json.dumps({"writer": record["writer"], "files": record["files"]}))
    assert check_replaceable(out, "-o", "export") == out


def test_an_empty_directory_or_a_new_path_may_be_written(tmp_path):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "new" / "deeper"):
        write_directory(check_replaceable(out, "-o", "export"), files("x"), "xspec export")
        assert (out / "x").read_text() == "x"


def test_a_failed_write_leaves_the_earlier_output_and_no_staging_folder(tmp_path):
    out = tmp_path / "out"
    write_directory(out, files("old"), "xspec export")

    def fail(staging: Path) -> None:
        (staging / "half").write_text("...")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_directory(out, fail, "xspec export")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == [WRITTEN, "old"]


def test_a_dead_writers_staging_folder_goes_a_living_writers_stays(tmp_path):
    out = tmp_path / "out"
    dead, living, foreign = (tmp_path / f".out.{name}.tmp" for name in ("dead", "living", "foreign"))
    for folder in (dead, living, foreign):
        folder.mkdir()
        (folder / "half").write_text("...")
    for folder in (dead, living):
        (folder / WRITTEN).write_text('{"writer": "xspec export", "files": null}')
    with open(living / WRITTEN) as held:
        fcntl.flock(held, fcntl.LOCK_EX)           # as a writer filling it holds it
        write_directory(out, files("x"), "xspec export")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.foreign.tmp", ".out.living.tmp", "out"]


def test_a_file_or_an_uncreatable_path_is_refused(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    assert refusal(file) == f"-o {file}: {file} is not a directory"
    assert refusal(file / "sub") == f"-o {file / 'sub'}: {file} is not a directory"


def test_a_name_with_control_characters_is_shown_escaped(tmp_path):
    out = tmp_path / "out\x1b[2J"
    out.mkdir()
    (out / "x\ny").write_text("mine")
    message = refusal(out)
    assert "\x1b" not in message and "\n" not in message and "holds x\\ny, which" in message
    assert os.path.exists(out / "x\ny")


def test_a_directory_holding_only_an_unreadable_record_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / WRITTEN).write_text("not json")
    assert refusal(out).startswith(f"-o {out}: holds {WRITTEN}, which no xspec export wrote there")
    assert (out / WRITTEN).read_text() == "not json"
