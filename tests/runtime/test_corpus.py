"""Bad input files: one clear error naming the file (and line), or a count of what was skipped."""

import os
from pathlib import Path

import pytest

from xspec.base.errors import UserError
from xspec.runtime.corpus import encode_pairs, read_lines, read_parallel
from xspec.runtime.vocab import EOS, train_vocab
from xspec.runtime.demo_data import generate_split


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match=r"nope\.en: no such file"):
        read_lines(tmp_path / "nope.en")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(UserError, match="is a directory"):
        read_lines(tmp_path)


def test_unreadable_file(tmp_path):
    path = _write(tmp_path / "secret.en", b"hello\n")
    path.chmod(0)
    try:
        if path.open("rb").readable():
            pytest.skip("running as a user who can read any file")
    except PermissionError:
        with pytest.raises(UserError, match="secret.en: cannot read"):
            read_lines(path)
    finally:
        path.chmod(0o644)


def test_invalid_utf8_names_the_line(tmp_path):
    path = _write(tmp_path / "train.de", "eins\nzwei\ndr\u00fcber\n".encode() + b"vier \xff\n")
    with pytest.raises(UserError, match=r"train\.de:4: invalid UTF-8 \(byte 0xff at column 6\)"):
        read_lines(path)


def test_line_counts_must_match(tmp_path):
    src = _write(tmp_path / "a.en", b"one\ntwo\nthree\n")
    tgt = _write(tmp_path / "a.de", b"eins\nzwei\n")
    with pytest.raises(UserError, match=r"a\.en has 3 lines but .*a\.de has 2"):
        read_parallel(src, tgt)


def test_empty_lines_are_skipped_and_counted(tmp_path):
    src = _write(tmp_path / "a.en", b"one\n\nthree\nfour\n")
    tgt = _write(tmp_path / "a.de", b"eins\nzwei\n \nvier\n")
    text = read_parallel(src, tgt)
    assert text.source == ["one", "four"] and text.target == ["eins", "vier"]
    assert text.empty_skipped == 2 and text.line_numbers == [1, 4]


def test_all_empty_is_an_error(tmp_path):
    src = _write(tmp_path / "a.en", b"\n\n")
    tgt = _write(tmp_path / "a.de", b"x\n\n")
    with pytest.raises(UserError, match="no sentence pairs"):
        read_parallel(src, tgt)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vocab")
    pairs = generate_split("train", 300)
    return train_vocab([s for pair in pairs for s in pair], 200, "bpe", directory)


def test_long_sentences_are_skipped_or_truncated(tmp_path, vocab):
    src = _write(tmp_path / "a.en", b"the dog\n" + b"the dog " * 40 + b"\n")
    tgt = _write(tmp_path / "a.de", b"der hund\nder hund\n")
    text = read_parallel(src, tgt)
    skipped = encode_pairs(text, vocab, max_tokens=20, truncate=False)
    assert len(skipped) == 1 and skipped.too_long == 1
    assert "1 too long skipped" in skipped.summary("train")
    truncated = encode_pairs(text, vocab, max_tokens=20, truncate=True)
    assert len(truncated) == 2 and truncated.too_long == 1
    assert len(truncated.source[1]) == 20 and truncated.source[1][-1] == EOS


def test_special_files_and_bad_paths_are_one_line_each(tmp_path):
    fifo = tmp_path / "fifo.en"
    os.mkfifo(fifo)                       # reading it would block: it is refused after a stat
    with pytest.raises(UserError, match=r"^.*fifo\.en: is a FIFO; only regular files are read$"):
        read_lines(fifo)
    loop = tmp_path / "loop.en"
    loop.symlink_to(loop)
    with pytest.raises(UserError, match=r"^.*loop\.en: cannot read: Too many levels of symbolic links$"):
        read_lines(loop)
    with pytest.raises(UserError, match="a path cannot contain a NUL byte"):
        read_lines(Path(f"{tmp_path}/train\0.en"))
    target = _write(tmp_path / "real.en", b"one\n")
    link = tmp_path / "link.en"
    link.symlink_to(target)              # a symlink to a regular file is read like the file
    assert read_lines(link) == ["one"]


def test_a_huge_line_count_reports_the_right_line(tmp_path):
    lines = 1_000_000
    path = _write(tmp_path / "big.de", b"\n" * (lines - 1) + b"ok \xfe\n")
    with pytest.raises(UserError, match=rf"big\.de:{lines}: invalid UTF-8 \(byte 0xfe at column 4\)"):
        read_lines(path)
    assert len(read_lines(_write(tmp_path / "ok.de", b"a\n" * lines))) == lines
