"""Prepared data met with hostile input: a manifest whose claims lie (the vocabulary's size, counts, the
longest example), shards changed after their checks, progress records that disagree with their files,
mixture weights at the float's limit, links leading out of a prepared directory, FIFOs and dangling links
where files should be, control characters in names and fields, and input paths that are not files. Each is
one clear message naming the file (and key) and a non-zero status, never an internal error, never a
hang, and nothing the user had is lost."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from prepare_interruption import stop_after
from xspec.base.errors import UserError
from xspec.cli import INTERNAL_ERROR, main
from xspec.runtime.demo_data import generate_split
from xspec.runtime.prepared import examples as prepared_examples
from xspec.runtime.prepared import prepare as prepare_module
from xspec.runtime.prepared.examples import Mixture, PreparedText, parse_data_argument
from xspec.runtime.prepared.format import MANIFEST, file_sha256, open_prepared
from xspec.runtime.prepared.prepare import PrepareOptions, prepare_text

LM = str(Path(__file__).resolve().parents[2] / "specs" / "lm.xspec")
OPTIONS = PrepareOptions(vocab_size=100, vocab_sample=10_000, max_line_bytes=4096)
PREPARE_FLAGS = ["--vocab-size", "100", "--vocab-sample", "10000", "--max-line-bytes", "4096", "--workers", "1",
                 "--no-progress"]


def _run(*argv: str) -> tuple[int, str]:
    """The command's exit status and everything it printed."""
    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        code = main(list(argv))
    assert code != INTERNAL_ERROR, out.getvalue()
    return code, out.getvalue()


def _quiet(line: str) -> None:
    pass


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    (d / "a.txt").write_text("".join(s + "\n" for s, _ in generate_split("train", 200)), encoding="utf-8")
    return d / "a.txt"


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "text"
    prepare_text([corpus], out, OPTIONS, say=_quiet)
    return out


def _copy(source: Path, to: Path) -> Path:
    return Path(shutil.copytree(source, to))


def _rewrite_manifest(directory: Path, change) -> None:
    manifest = json.loads((directory / MANIFEST).read_text())
    change(manifest)
    (directory / MANIFEST).write_text(json.dumps(manifest))


# --- the manifest's claims ----------------------------------------------------------------------------

@pytest.mark.parametrize("pieces", [4_000_000_000, 99])
def test_the_vocabulary_size_is_read_from_the_vocabulary_not_the_manifest(pieces, prepared, tmp_path):
    d = _copy(prepared, tmp_path / "d")
    _rewrite_manifest(d, lambda m: m["vocabulary"].update(pieces=pieces))
    code, out = _run("data", "show", str(d))
    assert (code, out) == (1, f"xspec: error: {d / MANIFEST}: vocabulary.pieces is {pieces:,}, but "
                              f"{d / 'sentencepiece.model'} has 100 pieces: not the manifest xspec wrote\n")


@pytest.mark.parametrize("key, value, message", [
    ("tokens", {"tokens": 10}, "{d}/manifest.json: the tokens shards hold {ids:,} ids, the manifest says 10"),
    ("examples", 150, "{d}/documents.bin: 1,608 bytes, not the 151 offsets of 150 examples: the index does not "
                      "match its shards"),
    ("longest", {"tokens": 7}, "{d}/manifest.json: longest.tokens is 7, but the longest example in "
                               "{d}/documents.bin has {longest:,} ids"),
])
def test_counts_in_the_manifest_are_checked_against_the_files(key, value, message, prepared, tmp_path):
    d = _copy(prepared, tmp_path / "d")
    truth = json.loads((d / MANIFEST).read_text())
    _rewrite_manifest(d, lambda m: m.update({key: value}))
    expected = message.format(ids=truth["tokens"]["tokens"], d=d, longest=truth["longest"]["tokens"])
    assert _run("data", "show", str(d)) == (1, f"xspec: error: {expected}\n")


def test_a_manifest_listing_files_it_does_not_use_or_strict_json_it_breaks_is_refused(prepared, tmp_path):
    d = _copy(prepared, tmp_path / "d")
    _rewrite_manifest(d, lambda m: m["files"].update({"../outside.bin": m["files"]["documents.bin"]}))
    assert _run("data", "show", str(d)) == (1, f"xspec: error: {d / MANIFEST}: not a manifest xspec wrote (file "
                                               "name '../outside.bin')\n")
    _rewrite_manifest(d, lambda m: m["files"].pop("../outside.bin") and
                      m["files"].update({"spare.bin": m["files"]["documents.bin"]}))
    assert _run("data", "show", str(d)) == (1, f"xspec: error: {d / MANIFEST}: not a manifest xspec wrote (its files "
                                               "are not its shards and offsets, each once)\n")
    text = (prepared / MANIFEST).read_text()
    (d / MANIFEST).write_text(text.replace('"examples": 200', '"examples": 200, "examples": 2'))
    assert _run("data", "show", str(d)) == (1, f"xspec: error: {d / MANIFEST}: not JSON xspec reads (the key "
                                               "'examples' is given twice in one object)\n")


def test_an_index_whose_ends_are_not_the_streams_eoses_is_refused(prepared, tmp_path):
    """Offsets that rise and end where the stream ends, but put a document's end where it has none."""
    d = _copy(prepared, tmp_path / "d")
    index = d / "documents.bin"
    offsets = np.fromfile(index, dtype="<i8")
    offsets[1] += 1
    offsets.tofile(index)
    _rewrite_manifest(d, lambda m: m["files"]["documents.bin"].update(sha256=file_sha256(index)))
    code, out = _run("data", "show", str(d))
    assert (code, out) == (1, f"xspec: error: {index}: the index does not match its shards (the stream's EOS number 1 "
                              f"is at position {offsets[1] - 1:,} of {d / 'tokens-00000.bin'}; the index says stream "
                              f"position {offsets[1]:,})\n")


def test_ids_changed_after_the_checks_are_named_where_they_are_read(prepared, tmp_path):
    d = _copy(prepared, tmp_path / "d")
    opened = open_prepared(d)
    examples = PreparedText(opened, "lines", 64, truncate=True)
    first = examples.sequences([3])
    shard = d / "tokens-00000.bin"
    ids = np.fromfile(shard, dtype="<u2")
    position = int(opened.offsets["documents"][3]) + 2
    ids[position] = 5000
    with open(shard, "r+b") as handle:        # in place: the memory map sees it
        handle.write(ids.tobytes())
    message = (f"{shard}: the tokens stream holds id 5000 at or near position {position} of this shard, beyond the "
               "vocabulary's 100 pieces: corrupt, or prepared with another vocabulary")
    with pytest.raises(UserError) as raised:
        examples.sequences([3])
    assert str(raised.value) == message and len(first[0]) > 3
    with pytest.raises(UserError) as raised:
        examples.token_counts()
    assert str(raised.value) == message


# --- progress records that disagree with their files ---------------------------------------------------

def _interrupt(corpus: Path, out: Path, monkeypatch, after_chunks: int = 4) -> Path:
    """An interrupted prepare of `corpus` into `out`, its progress recorded after each chunk but the last;
    returns its hidden folder."""
    monkeypatch.setattr(prepare_module, "SHARD_TOKENS", 300)
    with pytest.MonkeyPatch.context() as patch:
        stop_after(patch, after_chunks)
        with pytest.raises(KeyboardInterrupt):
            prepare_text([corpus], out, OPTIONS, say=_quiet)
    monkeypatch.setattr(prepare_module, "CHUNK_LINES", 16)
    return out.parent / f".{out.name}.partial"


def _lie(work: Path, change) -> None:
    record = work / "progress.json"
    progress = json.loads(record.read_text())
    change(progress["writer"], work)
    record.write_text(json.dumps(progress))


def _same_data(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in set(names) - {MANIFEST}:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _whole(corpus: Path, tmp_path: Path) -> Path:
    """`corpus` prepared without interruption, as `_interrupt` cuts its shards."""
    out = tmp_path / "whole"
    prepare_text([corpus], out, OPTIONS, say=_quiet)
    return out


def _set_shard_record(writer: dict, **values) -> None:
    writer["tokens"]["records"]["tokens-00000.bin"].update(values)


def _cut_open_shard(writer: dict, work: Path) -> None:
    shard = work / writer["tokens"]["names"][-1]
    shard.write_bytes(shard.read_bytes()[:2])


LIES = [
    ("the longest example", lambda w, _: w.update(longest=w["longest"] + 5),
     "{work}/documents.bin: its longest example is not the {longest} ids the record says"),
    ("offsets and examples that disagree", lambda w, _: w.update(documents=w["documents"] - 1),
     "it records {docs} examples in documents.bin but {examples} in all"),
    ("more offsets than were written", lambda w, _: w.update(examples=10_000, documents=10_001),
     "{work}/documents.bin: holds less than the record says was written"),
    ("a finished shard's hash", lambda w, _: _set_shard_record(w, sha256="0" * 64),
     "{work}/tokens-00000.bin: not the shard the record hashed"),
    ("a finished shard's size", lambda w, _: _set_shard_record(w, bytes=2),
     "the length of its tokens stream, {length:,} ids, is not what its shards hold"),
    ("the stream's length", lambda w, _: w["tokens"].update(length=1),
     "the length of its tokens stream, 1 ids, is not what its shards hold"),
    ("another stream's shards", lambda w, _: w["tokens"].update(names=["source-00000.bin"], records={}),
     "its tokens stream is written in other files (source-00000.bin)"),
    ("an open shard cut short", _cut_open_shard, "{work}/{open}: holds less than the record says was written"),
]


@pytest.mark.parametrize("what, lie, reason", LIES, ids=[lie[0] for lie in LIES])
def test_a_lying_progress_record_means_starting_over_with_a_note(what, lie, reason, corpus, tmp_path, monkeypatch):
    out = tmp_path / "out"
    work = _interrupt(corpus, out, monkeypatch)
    whole = _whole(corpus, tmp_path)                # as many ids a shard as the interrupted one
    writer = json.loads((work / "progress.json").read_text())["writer"]
    facts = {"work": work, "longest": writer["longest"] + 5, "docs": writer["documents"] - 2,
             "examples": writer["examples"], "length": writer["tokens"]["length"],
             "open": writer["tokens"]["names"][-1]}
    _lie(work, lie)
    code, said = _run("data", "prepare", str(corpus), *PREPARE_FLAGS, "-o", str(out))
    assert code == 0, said
    assert said.splitlines()[0] == (f"{out}: the interrupted prepare's record does not match what it describes "
                                    f"({reason.format(**facts)}); starting over")
    _same_data(whole, out)
    assert not work.exists() and _run("data", "show", str(out))[0] == 0


def test_a_record_of_more_examples_than_the_inputs_hold_starts_over(corpus, tmp_path, monkeypatch):
    """The inputs changed without their size or modification time changing: the record's count of examples
    written is more than they hold (this once stopped every retry with an internal error)."""
    text = tmp_path / "a.txt"
    shutil.copy(corpus, text)
    out = tmp_path / "out"
    _interrupt(text, out, monkeypatch)
    status = text.stat()
    data = text.read_bytes()
    cut = data.index(b"\n", len(data) // 8) + 1
    text.write_bytes(data[:cut] + data[cut:].replace(b"\n", b" "))       # same size, an eighth of the lines
    os.utime(text, ns=(status.st_atime_ns, status.st_mtime_ns))
    kept = data[:cut].count(b"\n")
    code, said = _run("data", "prepare", str(text), *PREPARE_FLAGS, "-o", str(out))
    assert code == 0, said
    assert said.splitlines()[:2] == [f"{out}: resuming an interrupted prepare after its first 48 documents",
                                     f"{out}: the interrupted prepare's record does not match what it describes (it "
                                     f"records 48 examples written, but the inputs hold {kept}); starting over"]
    assert kept < 48 and open_prepared(out).manifest.examples == kept


def test_a_record_naming_a_replaced_vocabulary_starts_over(corpus, prepared, tmp_path, monkeypatch):
    out = tmp_path / "out"
    work = _interrupt(corpus, out, monkeypatch)
    (work / "sentencepiece.model").write_bytes((prepared / "sentencepiece.model").read_bytes()[:-10])
    said: list[str] = []
    prepare_text([corpus], out, OPTIONS, say=said.append)
    assert said[0] == (f"{out}: the interrupted prepare's record does not match what it describes (sentencepiece.model "
                       "is not the vocabulary it records); starting over")
    _same_data(_whole(corpus, tmp_path), out)


def test_the_hidden_folder_is_emptied_only_when_it_holds_prepares_files_alone(corpus, tmp_path, monkeypatch):
    out = tmp_path / "out"
    work = _interrupt(corpus, out, monkeypatch)
    (work / "notes.txt").write_text("mine")
    code, text = _run("data", "prepare", str(corpus), *PREPARE_FLAGS, "-o", str(out))
    assert (code, text) == (1, f"xspec: error: {work}: holds notes.txt, which prepare does not write there; this is "
                               f"where prepare writes -o {out}: move the folder away or remove it\n")
    assert (work / "notes.txt").read_text() == "mine"
    (work / "notes.txt").unlink()
    os.symlink(tmp_path / "elsewhere.bin", work / "tokens-00099.bin")
    assert _run("data", "prepare", str(corpus), *PREPARE_FLAGS, "-o", str(out))[1].startswith(
        f"xspec: error: {work}: holds tokens-00099.bin, which prepare does not write there")
    shutil.rmtree(work)
    for kind in ("file", "link"):
        if kind == "file":
            work.write_text("a file of mine")
        else:
            os.symlink(tmp_path / "target", work)
        code, text = _run("data", "prepare", str(corpus), *PREPARE_FLAGS, "-o", str(out))
        assert (code, text) == (1, f"xspec: error: {work}: in the way of the folder prepare writes -o {out} in (it is "
                                   "not one prepare made); move it away or remove it\n")
        assert not out.exists() and (os.readlink(work) if kind == "link" else work.read_text()) == \
            (str(tmp_path / "target") if kind == "link" else "a file of mine")
        work.unlink()


# --- mixture weights --------------------------------------------------------------------------------

def test_weights_at_the_floats_limit_mix_by_their_ratio(prepared, monkeypatch):
    monkeypatch.setattr(prepared_examples, "WINDOW", 100)
    parts = parse_data_argument("a:1e308,b:1e308,c:5e307")
    assert [w for _, w in parts] == [1e308, 1e308, 5e307]
    examples = PreparedText(open_prepared(prepared), "blocks", 16, truncate=False)
    mixture = Mixture([(examples, w) for _, w in parts])
    assert [p.weight for p in mixture.parts] == [0.4, 0.4, 0.2] and mixture.take == [40, 40, 20]
    assert np.bincount(mixture.window(0, seed=1).source_of).tolist() == [40, 40, 20]
    with pytest.raises(UserError) as raised:
        parse_data_argument("a:1e999")
    assert str(raised.value) == "--data a:1e999: 'a:1e999': a weight is a positive number"
    with pytest.raises(UserError) as raised:
        parse_data_argument("a\x1b[2J:x")
    assert str(raised.value) == "--data a\\x1b[2J:x: 'a\\x1b[2J:x': the weight after ':' is not a number"
    with pytest.raises(UserError) as raised:     # the same corpus twice: its weight says how much of it
        parse_data_argument("a,b:2,./a:3")
    assert str(raised.value) == "--data a,b:2,./a:3: './a' is given twice; a corpus is mixed in once, its weight " \
        "after ':' (DIR:2 for twice its share)"


# --- the prepared directory as an input directory -------------------------------------------------------

def test_links_leading_out_of_a_prepared_directory_are_refused_and_links_inside_it_followed(prepared, tmp_path):
    d = _copy(prepared, tmp_path / "d")
    outside = tmp_path / "outside.bin"
    os.rename(d / "tokens-00000.bin", outside)
    os.symlink(outside, d / "tokens-00000.bin")
    assert _run("data", "show", str(d)) == (1, f"xspec: error: {d / 'tokens-00000.bin'}: a symlink leading out of {d} "
                                               f"(to {outside}); xspec follows links only inside the directory it is "
                                               "given\n")
    (d / "tokens-00000.bin").unlink()
    os.makedirs(d / "store")
    os.rename(outside, d / "store" / "tokens.bin")
    os.symlink("store/tokens.bin", d / "tokens-00000.bin")
    assert _run("data", "show", str(d))[0] == 0
    os.rename(d / MANIFEST, tmp_path / MANIFEST)
    os.symlink(tmp_path / MANIFEST, d / MANIFEST)
    assert _run("data", "show", str(d))[1].startswith(f"xspec: error: {d / MANIFEST}: a symlink leading out of {d}")


@pytest.mark.parametrize("kind, reason", [("dangling", "a symlink to a missing file"),
                                          ("directory", "is a directory, not a text file"),
                                          ("fifo", "is a FIFO; only regular files are read"),
                                          ("missing", "no such file")])
def test_a_shard_that_is_not_a_regular_file_is_named(kind, reason, prepared, tmp_path):
    d = _copy(prepared, tmp_path / "d")
    shard = d / "tokens-00000.bin"
    shard.unlink()
    {"dangling": lambda: os.symlink("nowhere.bin", shard), "directory": shard.mkdir, "fifo": lambda: os.mkfifo(shard),
     "missing": lambda: None}[kind]()
    assert _run("data", "show", str(d)) == (1, f"xspec: error: {shard}: {reason}\n")
    code, out = _run("train", LM, "--data", str(d), "--no-test", "-o", str(tmp_path / "run"))
    assert (code, out.splitlines()[-1]) == (1, f"xspec: error: {shard}: {reason}")


def test_names_and_fields_holding_control_characters_are_shown_escaped(prepared, tmp_path):
    d = _copy(prepared, tmp_path / "web\x1b[31m\nX")
    evil = "\x1b]0;owned\x07line\nbreak\u202e"
    _rewrite_manifest(d, lambda m: (m["vocabulary"].update(origin=evil), m.update(command=evil),
                                    m["skipped"].update(where=[evil]), m["sources"][0].update(path=evil)))
    code, out = _run("data", "show", str(d))
    shown_dir = str(d).replace("\x1b", "\\x1b").replace("\n", "\\n")
    escaped = "\\x1b]0;owned\\x07line\\nbreak\\u202e"
    lines = out.splitlines()
    assert code == 0 and "\x1b" not in out and "\u202e" not in out and len(lines) == 7
    assert lines[0].startswith(f"{shown_dir}: text, 200 documents, format version 1")
    assert lines[2] == f"  vocabulary: 100 pieces, {escaped}" and lines[4] == f"    {escaped}"
    assert lines[5].startswith(f"  source: {escaped} (") and lines[6] == f"  command: {escaped}"
    code, out = _run("data", "show", str(d), "--json")
    assert code == 0 and "\x1b" not in out and "\u202e" not in out and json.loads(out)["command"] == evil
    _rewrite_manifest(d, lambda m: m["streams"].update(tokens=["tokens\x1b[2J-00000.bin"]))
    code, out = _run("data", "show", str(d))
    assert (code, out) == (1, f"xspec: error: {shown_dir}/manifest.json: names tokens\\x1b[2J-00000.bin without its "
                              "size and hash\n")


# --- input paths for prepare ------------------------------------------------------------------------

def test_inputs_that_are_not_regular_files_are_named_before_anything_is_written(corpus, tmp_path):
    os.symlink(tmp_path / "nowhere.txt", tmp_path / "dangling.txt")
    os.mkfifo(tmp_path / "fifo.txt")
    (tmp_path / "folder.txt").mkdir()
    cases = [(corpus / "x", "a folder on its path is a file, not a directory"),
             (tmp_path / "dangling.txt", "a symlink to a missing file"),
             (tmp_path / "folder.txt", "is a directory, not a text file"),
             (tmp_path / "fifo.txt", "is a FIFO; only regular files are read"),
             (tmp_path / "missing.txt", "no such file")]
    for path, reason in cases:
        code, out = _run("data", "prepare", str(corpus), str(path), *PREPARE_FLAGS, "-o", str(tmp_path / "out"))
        assert (code, out) == (1, f"xspec: error: {path}: {reason}\n")
    for vocab, reason in ((tmp_path / "missing.model", "no such file"),
                          (tmp_path / "fifo.txt", "is a FIFO; only regular files are read")):
        code, out = _run("data", "prepare", str(corpus), "--vocab", str(vocab), "-o", str(tmp_path / "out"))
        assert (code, out) == (1, f"xspec: error: {vocab}: {reason}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.txt", "fifo.txt", "folder.txt"]
    os.symlink(tmp_path / "nowhere", tmp_path / "out")
    code, out = _run("data", "prepare", str(corpus), *PREPARE_FLAGS, "-o", str(tmp_path / "out"))
    assert (code, out) == (1, f"xspec: error: -o {tmp_path / 'out'}: already exists; choose another folder or remove "
                              "it (a prepared directory is written whole, never over another)\n")
    assert os.path.islink(tmp_path / "out")
