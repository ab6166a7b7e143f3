"""run.json: absolute paths except inside the run directory (which can then be moved), checked when read."""

from __future__ import annotations

import json
import shutil

import pytest

from xspec.base.errors import UserError
from xspec.runtime.run_dir import DataFiles, RunRecord, Split, read_run_record, write_run_record


def test_demo_files_are_stored_relative_to_the_run_so_it_can_move(tmp_path, monkeypatch):
    run, corpus = tmp_path / "run", tmp_path / "corpus"
    monkeypatch.chdir(tmp_path)
    inside = Split(run / "data" / "train.src", run / "data" / "train.tgt")
    outside = Split(corpus / "valid.en", corpus / "valid.de")
    write_run_record(run, RunRecord(DataFiles(inside, outside), truncate=True))
    stored = json.loads((run / "run.json").read_text())
    assert stored["data"]["train"] == {"src": "data/train.src", "tgt": "data/train.tgt"}
    assert stored["data"]["valid"] == {"src": str(corpus / "valid.en"), "tgt": str(corpus / "valid.de")}
    assert (stored["format"], stored["truncate"], stored["stopped"], stored["data"]["test"]) == (2, True, None, None)

    moved = tmp_path / "elsewhere" / "run"
    shutil.move(run, moved)
    record = read_run_record(moved)
    assert record.data.train == Split(moved / "data" / "train.src", moved / "data" / "train.tgt")
    assert record.data.valid == outside and record.truncate is True


def test_an_older_run_json_reads_relative_paths_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps(
        {"data": {"train": {"src": "run/data/train.src", "tgt": "run/data/train.tgt"}, "valid": None, "test": None}}))
    record = read_run_record(tmp_path / "run")
    assert record.data.train.src == tmp_path / "run" / "data" / "train.src"
    assert record.truncate is None                  # not recorded then: a resume takes what it is given


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    ("[]", "no data files"),
    ('{"data": {"train": null}}', "no training files"),
    ('{"data": {"train": {"src": "a"}}}', "data.train is not a pair of file names"),
    ('{"data": {"train": {"src": "a\\u0000b", "tgt": "b"}}}', "data.train is not a pair of file names"),
    ('{"data": {"train": {"src": "a", "tgt": "b"}}, "truncate": "yes"}', "truncate is not true or false"),
    ('{"data": {"train": {"src": "a", "tgt": "b"}}, "stopped": {"reason": "bored"}}', "stopped is not a stop"),
])
def test_a_run_json_xspec_did_not_write_is_one_message(tmp_path, content, problem):
    path = tmp_path / "run.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError, match=rf"run\.json: not a run description xspec wrote \({problem}"):
        read_run_record(tmp_path)


def test_a_missing_run_json(tmp_path):
    with pytest.raises(UserError, match="run.json: missing; .* is not an xspec run directory"):
        read_run_record(tmp_path)
