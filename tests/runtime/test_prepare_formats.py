"""`xspec data prepare` on JSON Lines (plain, gzip, zstandard) and Parquet: the same documents as the
text they hold, every skipped record named by file and line (or row), a file that is not its format one
error naming it, and an interrupted prepare of a compressed file resumed to the same directory."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from prepare_interruption import stop_after
from xspec.cli import main
from xspec.runtime.demo_data import generate_split
from xspec.runtime.prepared import prepare as prepare_module
from xspec.runtime.prepared import sources
from xspec.runtime.prepared.format import MANIFEST, file_sha256, open_prepared
from xspec.runtime.prepared.prepare import PrepareOptions, prepare_parallel, prepare_text

LINES = [s for s, _ in generate_split("train", 120)]


def _run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


def _quiet(line: str) -> None:
    pass


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """LINES as plain text, prepared (its vocabulary is every other test's)."""
    d = tmp_path_factory.mktemp("plain")
    (d / "lines.txt").write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    prepare_text([d / "lines.txt"], d / "prepared", PrepareOptions(vocab_size=100), say=_quiet)
    return d / "prepared"


def _options(plain: Path, **changes) -> PrepareOptions:
    return PrepareOptions(vocab_file=plain / "sentencepiece.model", max_line_bytes=2000, **changes)


def _same_data(a: Path, b: Path) -> None:
    """Two prepared directories hold the same files, byte for byte, but for their manifests."""
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in set(names) - {MANIFEST}:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _jsonl(lines: list[str], field: str = "text") -> bytes:
    """LINES as JSON Lines, with a record of a kind that is skipped after every ninth (13 of them)."""
    bad = [b"", b"   ", b"{not json", b"[1, 2]", b'{"other": "x"}', b'{"text": null}', b'{"text": 17}',
           b'{"text": "a", "text": "b"}', b'{"text": NaN}', b'{"text": "  "}', b'{"text": "\\ud800 lone"}',
           b'{"text": "caf\xe9"}', b'{"text": "' + b"y" * 3000 + b'"}']
    out = []
    for k, line in enumerate(lines):
        out.append(json.dumps({"id": k, field: line}, ensure_ascii=k % 2 == 0).encode())
        if k % 9 == 8:
            out.append(bad.pop(0))
    return b"\xef\xbb\xbf" + b"\n".join(out) + b"\n"            # a byte order mark first, as some tools write


EXPECTED_SKIPS = {"empty": 3, "too_long": 1, "invalid_utf8": 2, "not_json": 3, "not_object": 1, "no_field": 2,
                  "not_string": 1}


def _where(path: Path) -> list[str]:
    """The places _jsonl's bad records are reported at (empty ones are counted, not named)."""
    return [f"{path}:30: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
            f"{path}:40: a JSON array, not an object",
            f"{path}:50: no 'text' field",
            f"{path}:60: 'text' is null",
            f"{path}:70: 'text' is a JSON number, not a string",
            f"{path}:80: not JSON xspec reads (the key 'text' is given twice in one object)",
            f"{path}:90: not JSON xspec reads (NaN is not a JSON number)",
            f"{path}:110: not UTF-8 (a lone surrogate \\ud800 at character 1)",
            f"{path}:120: invalid UTF-8 (byte 0xe9 at column 14)",
            f"{path}:130: longer than 2,000 bytes"]


def test_json_lines_prepare_to_the_text_they_hold_and_name_every_skipped_record(plain, tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(_jsonl(LINES))
    manifest = prepare_text([path], tmp_path / "out", _options(plain), say=_quiet)
    _same_data(plain, tmp_path / "out")
    skipped = manifest.skipped.model_dump()
    assert {kind: skipped[kind] for kind in EXPECTED_SKIPS} == EXPECTED_SKIPS
    assert manifest.skipped.where == _where(path)
    assert manifest.sources[0].sha256 == file_sha256(path) and manifest.sources[0].bytes == path.stat().st_size
    written = json.loads((tmp_path / "out" / MANIFEST).read_text())["skipped"]
    assert written["not_json"] == 3 and open_prepared(tmp_path / "out").manifest == manifest
    code, out = _run("data", "show", str(tmp_path / "out"))
    assert code == 0 and "  skipped: 3 empty, 1 too long, 2 invalid UTF-8, 3 not JSON, 1 not a JSON object, " \
        "2 without the text field, 1 with a text field that is not a string\n" in out


def test_a_plain_text_manifest_leaves_out_the_json_kinds_of_skips(plain):
    assert list(json.loads((plain / MANIFEST).read_text())["skipped"]) == ["empty", "too_long", "invalid_utf8",
                                                                           "where"]


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst", ".ndjson.gz"])
def test_compressed_json_lines_prepare_as_the_plain_file_does(suffix, plain, tmp_path):
    data = _jsonl(LINES)
    half = len(data) // 2
    if suffix.endswith(".gz"):          # two members, then NUL padding, as gzip allows
        packed = gzip.compress(data[:half]) + gzip.compress(data[half:]) + b"\0" * 8
    else:                               # two frames
        packed = zstandard.ZstdCompressor().compress(data[:half]) + zstandard.ZstdCompressor().compress(data[half:])
    path = tmp_path / f"docs{suffix}"
    path.write_bytes(packed)
    manifest = prepare_text([path], tmp_path / "out", _options(plain), say=_quiet)
    _same_data(plain, tmp_path / "out")
    assert manifest.skipped.where == _where(path)
    assert (manifest.sources[0].bytes, manifest.sources[0].sha256) == (len(packed), file_sha256(path))


def test_compressed_plain_text_prepares_as_the_plain_file_does(plain, tmp_path):
    (tmp_path / "lines.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(line + "\n" for line in LINES).encode()))
    prepare_text([tmp_path / "lines.txt.zst"], tmp_path / "out", _options(plain), say=_quiet)
    _same_data(plain, tmp_path / "out")


def _parquet(path: Path, values: list, kind=pa.string()) -> Path:
    pq.write_table(pa.table({"id": list(range(len(values))), "body": pa.array(values, type=kind)}), path,
                   row_group_size=50)
    return path


def test_parquet_prepares_its_column_a_batch_at_a_time_naming_skipped_rows(plain, tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "PARQUET_ROWS", 7)            # rows and batches cross the row groups
    values = [line.encode() for line in LINES]
    values[10:10] = [None, b"  ", b"caf\xe9", b"z" * 3000]
    table = pa.table({"body": pa.array(values, type=pa.binary())})
    bad_utf8 = pa.Array.from_buffers(pa.string(), len(values), table.column(0).chunks[0].buffers())
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"n": list(range(len(values))), "body": bad_utf8}), path, row_group_size=50)
    manifest = prepare_text([path], tmp_path / "out", _options(plain, field="body"), say=_quiet)
    _same_data(plain, tmp_path / "out")
    assert manifest.skipped.where == [f"{path}, row 11: 'body' is null",
                                      f"{path}, row 13: invalid UTF-8 (byte 0xe9 at column 4)",
                                      f"{path}, row 14: longer than 2,000 bytes"]
    assert (manifest.skipped.empty, manifest.sources[0].sha256) == (1, file_sha256(path))


def test_the_field_option_names_the_text_field_through_the_command(plain, tmp_path, capsys):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(_jsonl(LINES, field="content"))
    code, out = _run("data", "prepare", str(path), "--field", "content", "--vocab", str(plain / "sentencepiece.model"),
                     "--max-line-bytes", "2000", "--workers", "1", "--no-progress", "-o", str(tmp_path / "out"))
    assert code == 0, out
    assert f"{path}:50: no 'content' field; {path}:60: no 'content' field" in out
    _same_data(plain, tmp_path / "out")
    for command, shown in ((["data"], "*.jsonl, *.ndjson,"), (["data", "prepare"], "--field NAME")):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        assert shown in capsys.readouterr().out


def test_a_json_file_of_lines_is_json_lines_and_a_field_for_plain_text_is_refused(plain, tmp_path):
    """Hugging Face datasets' to_json writes JSON Lines to `.json`; --field names nothing in plain text, so
    giving it for text files alone is a mistake said, not text trained on as it stands."""
    path = tmp_path / "docs.json"
    path.write_bytes(_jsonl(LINES))
    manifest = prepare_text([path], tmp_path / "out", _options(plain), say=_quiet)
    _same_data(plain, tmp_path / "out")
    assert manifest.skipped.not_json == 3
    text = tmp_path / "docs.txt"
    text.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    code, out = _run("data", "prepare", str(text), "--field", "content", "-o", str(tmp_path / "never"))
    assert code == 1 and out == (f"xspec: error: --field content: names the text's field of JSON Lines "
                                 f"(.jsonl, .ndjson, .json) or Parquet inputs; {text} is read as plain text, a "
                                 "document a line\n")
    assert not (tmp_path / "never").exists()
    code, out = _run("train", "specs/lm.xspec", "--train", str(path), "-o", str(tmp_path / "run"))
    assert code == 1 and out.startswith(f"xspec: error: --train {path}: JSON Lines, by its name; plain text is read "
                                        "here, a line an example: `xspec data prepare FILE -o DIR` reads it")
    assert not (tmp_path / "run").exists()
    code, out = _run("eval", str(tmp_path / "run"), "--text", str(path))      # before the run is loaded
    assert code == 1 and out == (f"xspec: error: --text {path}: JSON Lines, by its name; plain text is read here, "
                                 "a line an example: write each record's text on a line of its own first\n")


def test_sentence_pairs_read_any_format_aligned_record_by_record(plain, tmp_path):
    pairs = generate_split("train", 60)
    (tmp_path / "train.src").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp_path / "train.tgt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    prepare_parallel(tmp_path / "train.src", tmp_path / "train.tgt", tmp_path / "text", _options(plain), say=_quiet)
    src = tmp_path / "src.jsonl.gz"
    src.write_bytes(gzip.compress("".join(json.dumps({"body": s}) + "\n" for s, _ in pairs).encode()))
    tgt = _parquet(tmp_path / "tgt.parquet", [t for _, t in pairs])
    prepare_parallel(src, tgt, tmp_path / "mixed", _options(plain, field="body"), say=_quiet)
    _same_data(tmp_path / "text", tmp_path / "mixed")
    _parquet(tgt, [t for _, t in pairs[:-1]])
    code, out = _run("data", "prepare", "--src", str(src), "--tgt", str(tgt), "--field", "body", "--vocab",
                     str(plain / "sentencepiece.model"), "-o", str(tmp_path / "short"))
    assert (code, out) == (1, f"xspec: error: {tgt} has 59 records but {src} has more: source and target files must "
                              "be aligned record by record\n")
    assert not (tmp_path / "short").exists() and not (tmp_path / ".short.partial").exists()


# --- files that are not their format -----------------------------------------------------------------

def _gz_truncated(data: bytes) -> bytes:
    packed = gzip.compress(data)
    return packed[:len(packed) // 2]


def _zst_truncated(data: bytes) -> bytes:
    packed = zstandard.ZstdCompressor().compress(data)
    return packed[:-3]


def _zst_corrupt(data: bytes) -> bytes:
    packed = bytearray(zstandard.ZstdCompressor().compress(data))
    packed[20:40] = b"\xff" * 20
    return bytes(packed)


CORRUPT = [
    ("docs.jsonl.gz", lambda data: b"plain text, not gzip\n", "not gzip data, or corrupt (Error -3 while "
                                                                "decompressing data: incorrect header check)"),
    ("docs.jsonl.gz", _gz_truncated, "truncated gzip data (the file ends inside a compressed stream)"),
    ("docs.jsonl.zst", _zst_truncated, "truncated zstandard data (the file ends inside a frame)"),
    ("docs.jsonl.zst", lambda data: b"plain text, not zstandard\n",
     "not zstandard data, or corrupt (zstd decompressor error: Unknown frame descriptor)"),
    ("docs.jsonl.zst", _zst_corrupt, "not zstandard data, or corrupt (zstd decompressor error: Data corruption "
                                     "detected)"),
    ("docs.parquet", lambda data: data, "not a Parquet file xspec can read (Parquet magic bytes not found in "
                                        "footer. Either the file is corrupted or this is not a parquet file.)"),
]


@pytest.mark.parametrize("name, corrupt, message", CORRUPT, ids=[c[2][:24] for c in CORRUPT])
def test_a_file_that_is_not_its_format_is_one_error_naming_it(name, corrupt, message, plain, tmp_path):
    path = tmp_path / name
    path.write_bytes(corrupt(_jsonl(LINES)))
    code, out = _run("data", "prepare", str(path), "--vocab", str(plain / "sentencepiece.model"), "--workers", "1",
                     "-o", str(tmp_path / "out"))
    assert (code, out) == (1, f"xspec: error: {path}: {message}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]          # nothing left behind


@pytest.mark.parametrize("encoding", ["large_string", "dictionary", "large dictionary", "string_view"])
def test_parquet_text_in_any_string_encoding_prepares_the_same(plain, tmp_path, encoding):
    """Large strings, a dictionary-encoded column (what pandas writes for a categorical) and string views
    hold the same text as a plain string column."""
    if encoding == "string_view" and not hasattr(pa, "string_view"):
        pytest.skip("this pyarrow has no string views")
    column = {"large_string": lambda: pa.array(LINES, type=pa.large_string()),
              "dictionary": lambda: pa.array(LINES).dictionary_encode(),
              "large dictionary": lambda: pa.array(LINES, type=pa.large_string()).dictionary_encode(),
              "string_view": lambda: pa.array(LINES, type=pa.string_view())}[encoding]()
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": column}), path, row_group_size=50)
    assert pa.types.is_dictionary(pq.ParquetFile(path).schema_arrow.field("body").type) == ("dictionary" in encoding)
    prepare_text([path], tmp_path / "out", _options(plain, field="body"), say=_quiet)
    _same_data(plain, tmp_path / "out")


def test_a_parquet_column_that_is_missing_or_not_text_is_named(plain, tmp_path):
    path = _parquet(tmp_path / "docs.parquet", list(range(5)), kind=pa.int64())
    vocab = str(plain / "sentencepiece.model")
    code, out = _run("data", "prepare", str(path), "--field", "body", "--vocab", vocab, "-o", str(tmp_path / "o"))
    assert (code, out) == (1, f"xspec: error: {path}: the column 'body' holds int64, not strings; --field names the "
                              "text column\n")
    code, out = _run("data", "prepare", str(path), "--vocab", vocab, "-o", str(tmp_path / "o"))
    assert (code, out) == (1, f"xspec: error: {path}: no column named 'text' (its columns: 'id', 'body'); --field "
                              "names the text column\n")
    (tmp_path / "x.parquet.gz").write_bytes(b"")
    code, out = _run("data", "prepare", str(tmp_path / "x.parquet.gz"), "--vocab", vocab, "-o", str(tmp_path / "o"))
    assert (code, out) == (1, f"xspec: error: {tmp_path / 'x.parquet.gz'}: a compressed Parquet file; Parquet "
                              "compresses its own columns: give the .parquet file itself\n")


def test_decompression_is_bounded_whatever_the_ratio(tmp_path):
    """A zstandard bomb (a megabyte of one byte compresses to a few hundred) decompresses a bounded piece at
    a time: no block handed on is larger than the feed can produce."""
    packed = zstandard.ZstdCompressor().compress(b"a" * (64 << 20))
    blocks = list(sources._unzstd(iter([packed]), tmp_path / "bomb.zst"))
    assert sum(map(len, blocks)) == 64 << 20 and max(map(len, blocks)) <= 2 * sources.READ_BYTES + (32 << 20)
    gz = gzip.compress(b"a" * (16 << 20))
    assert max(map(len, sources._gunzipped(iter([gz]), tmp_path / "bomb.gz"))) <= sources.READ_BYTES


def test_an_interrupted_prepare_of_zstandard_json_lines_resumes_to_the_same_directory(plain, tmp_path, monkeypatch):
    path = tmp_path / "docs.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(_jsonl(LINES)))
    options = _options(plain)
    said: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        stop_after(patch, 4)
        with pytest.raises(KeyboardInterrupt):
            prepare_text([path], tmp_path / "out", options, say=said.append)
    monkeypatch.setattr(prepare_module, "CHUNK_LINES", 16)
    said.clear()
    manifest = prepare_text([path], tmp_path / "out", options, say=said.append)
    assert said[0] == f"{tmp_path / 'out'}: resuming an interrupted prepare after its first 48 documents"
    _same_data(plain, tmp_path / "out")
    assert manifest.skipped.where == _where(path) and manifest.sources[0].sha256 == file_sha256(path)
