"""The input files of `xspec data prepare`, read as a stream of records in bounded memory, whatever their
format (told by the file's name):

    *.txt, anything else      plain text, a document (or sentence) a line
    *.jsonl, *.ndjson, *.json JSON Lines: an object a line, the text in its `field` ("text" by default)
    either, then .gz or .zst  the same, compressed with gzip or zstandard (read as they decompress)
    *.parquet                 Parquet: the string column `field` (any string encoding, dictionary-encoded
                              included), read a record batch at a time

Every record comes with its line (a Parquet row's number) and, when it is skipped, why (lines.py: empty,
too long, not UTF-8, not JSON, not an object, no text field, a text field that is not a string). A file
that cannot be read as its format (not gzip, truncated zstandard, not Parquet, a column of numbers) is one
error naming it. Each file is hashed as it is read: its bytes as stored, compressed or not.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

from xspec.base.errors import UserError
from xspec.base.files import open_regular_file
from xspec.base.strict_json import parse_json
from xspec.base.text import printable, shown
from .lines import Digest, Line, Skips, cut_lines, text_line

READ_BYTES = 1 << 20                # read (and decompressed) at a time
ZSTD_FEED = 1 << 10                 # compressed bytes zstandard is given at a time: a block of at least 4 bytes
                                    # decompresses to at most 128 KiB, so a call yields at most 32 MiB
PARQUET_ROWS = 1024                 # rows of a Parquet file converted at a time
# A `.json` file of lines is JSON Lines too: what Hugging Face datasets' to_json writes.
LINE_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}


@dataclass(frozen=True)
class Reading:
    """How prepare reads its inputs: the longest line (or value) it keeps, and the text's field or column."""

    max_bytes: int = 1 << 20
    field: str = "text"


def input_format(path: Path) -> tuple[str, str]:
    """("text", "jsonl" or "parquet"; "", "gzip" or "zstd") by the file's name, case aside."""
    name, compression = Path(path).name.lower(), ""
    for suffix, method in COMPRESSIONS.items():
        if name.endswith(suffix):
            name, compression = name[:-len(suffix)], method
    if name.endswith(".parquet"):
        return "parquet", compression
    return next((kind for suffix, kind in LINE_FORMATS.items() if name.endswith(suffix)), "text"), compression


def plain_text(path: Path, where: str, hint: str) -> Path:
    """`path`, a text file read as it stands (a sentence or document a line) by a command other than prepare;
    refused, with `hint`, where its name says a format prepare reads (JSON Lines, Parquet, compressed), which
    would be read as its raw lines."""
    kind, compression = input_format(path)
    if (kind, compression) != ("text", ""):
        what = {"jsonl": "JSON Lines", "parquet": "Parquet"}.get(kind, "text") + \
            (f", {compression}-compressed" if compression else "")
        raise UserError(f"{where} {shown(str(path))}: {what}, by its name; plain text is read here, a line an "
                        f"example: {hint}")
    return path


def check_input(path: Path) -> None:
    """Refuses, naming it, an input prepare could not read: not a regular file (a directory, a FIFO, a
    dangling link, a path through a file), a compressed Parquet file, or a format whose library is missing."""
    open_regular_file(path).close()
    kind, compression = input_format(path)
    if kind == "parquet" and compression:
        raise UserError(f"{shown(path)}: a compressed Parquet file; Parquet compresses its own columns: give "
                        "the .parquet file itself")
    if compression == "zstd":
        _zstandard(path)
    if kind == "parquet":
        _pyarrow(path)


def read_records(path: Path, reading: Reading, digest: Optional[Digest] = None) -> Iterator[Line]:
    """Every record of `path` in order, kept or skipped; `digest` takes every byte of the file."""
    kind, compression = input_format(path)
    if kind == "parquet":
        yield from _parquet_rows(path, reading, digest)
        return
    with open_regular_file(path) as handle:
        blocks = _raw_blocks(handle, path, digest)
        if compression == "gzip":
            blocks = _gunzipped(blocks, path)
        elif compression == "zstd":
            blocks = _unzstd(blocks, path)
        for number, data in cut_lines(blocks, reading.max_bytes):
            yield text_line(number, data, reading.max_bytes) if kind == "text" else \
                _json_record(number, data, reading)


def text_lines(paths: list[Path], reading: Reading, skips: Skips,
               digests: Optional[list[Digest]] = None) -> Iterator[str]:
    """The kept records of `paths`, one file after another; skipped ones noted in `skips`; each file's
    digest into `digests` (one a file, in order) when given."""
    for k, path in enumerate(paths):
        for line in read_records(path, reading, digests[k] if digests is not None else None):
            if line.text is None:
                skips.note(line.problem, f"{line.place(path)}: {line.detail or line.problem}")
            else:
                yield line.text


def aligned_lines(source: Path, target: Path, reading: Reading, skips: Skips,
                  digests: Optional[list[Digest]] = None) -> Iterator[tuple[str, str]]:
    """The kept pairs of two files aligned record by record: a pair is skipped when either side is; files
    of different lengths are an error (found when the shorter one ends)."""
    src = read_records(source, reading, digests[0] if digests is not None else None)
    tgt = read_records(target, reading, digests[1] if digests is not None else None)
    rows = "parquet" in (input_format(source)[0], input_format(target)[0])
    unit, by = ("records", "record by record") if rows else ("lines", "line by line")
    while True:
        a, b = next(src, None), next(tgt, None)
        if a is None or b is None:
            longer, shorter, extra = (source, target, a) if a is not None else (target, source, b)
            if extra is not None:
                raise UserError(f"{shown(shorter)} has {extra.number - 1:,} {unit} but {shown(longer)} has more: "
                                f"source and target files must be aligned {by}")
            return
        if a.text is not None and b.text is not None:
            yield a.text, b.text
            continue
        line, path = (a, source) if a.text is None else (b, target)
        skips.note(line.problem, f"{line.place(path)}: {line.detail or line.problem}")


# --- lines: plain, gzip, zstandard -------------------------------------------------------------------

def _raw_blocks(handle: BinaryIO, path: Path, digest: Optional[Digest]) -> Iterator[bytes]:
    while True:
        try:
            block = handle.read(READ_BYTES)
        except OSError as error:
            raise UserError(f"{shown(path)}: cannot read: {error.strerror}") from None
        if not block:
            return
        if digest is not None:
            digest.update(block)
        yield block


def _gunzipped(blocks: Iterator[bytes], path: Path) -> Iterator[bytes]:
    """The decompressed bytes of gzip data (members one after another, NUL padding after them allowed, as
    gzip allows), at most READ_BYTES at a time; corrupt or truncated data is an error naming the file."""
    member: Any = None
    for data in blocks:
        while data:
            if member is None:
                if not data.strip(b"\0"):
                    break
                member = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            try:
                out = member.decompress(data, READ_BYTES)
            except zlib.error as error:
                raise UserError(f"{shown(path)}: not gzip data, or corrupt ({printable(str(error))})") from None
            if out:
                yield out
            if member.eof:
                data, member = member.unused_data, None
            else:
                data = member.unconsumed_tail
    if member is not None:
        raise UserError(f"{shown(path)}: truncated gzip data (the file ends inside a compressed stream)")


def _unzstd(blocks: Iterator[bytes], path: Path) -> Iterator[bytes]:
    """The decompressed bytes of zstandard frames one after another, gathered into blocks of about
    READ_BYTES; corrupt or truncated data (a frame the file ends inside) is an error naming the file."""
    zstandard = _zstandard(path)
    frame: Any = None
    out: list[bytes] = []
    held = 0
    for block in blocks:
        for start in range(0, len(block), ZSTD_FEED):
            data = block[start:start + ZSTD_FEED]
            while data:
                if frame is None:
                    frame = zstandard.ZstdDecompressor().decompressobj()
                try:
                    piece = frame.decompress(data)
                except zstandard.ZstdError as error:
                    raise UserError(f"{shown(path)}: not zstandard data, or corrupt ({printable(str(error))})") \
                        from None
                out.append(piece)
                held += len(piece)
                data, frame = (frame.unused_data, None) if frame.eof else (b"", frame)
            if held >= READ_BYTES:
                yield b"".join(out)
                out, held = [], 0
    if frame is not None:
        raise UserError(f"{shown(path)}: truncated zstandard data (the file ends inside a frame)")
    if held:
        yield b"".join(out)


def _json_record(number: int, data: Optional[bytes], reading: Reading) -> Line:
    """A JSON Lines record: the string in the field `reading.field` of the line's object, stripped."""
    line = text_line(number, data, reading.max_bytes)
    if line.text is None:
        return line
    try:
        # origin "": the message is ": not JSON (...)", and the line's place goes before it when reported
        value = parse_json(line.text.removeprefix("\ufeff") if number == 1 else line.text, "")
    except UserError as error:
        return Line(number, None, "not_json", str(error)[2:])
    return _text_of(number, value, reading.field, row=False)


def _text_of(number: int, record: Any, name: str, row: bool) -> Line:
    """The text field `name` of a JSON record (dict), checked."""
    field = _quoted(name)
    if not isinstance(record, dict):
        return Line(number, None, "not_object", f"a JSON {_json_type(record)}, not an object", row)
    if record.get(name) is None:
        return Line(number, None, "no_field", f"no {field} field" if name not in record else f"{field} is null",
                    row)
    value = record[name]
    if not isinstance(value, str):
        return Line(number, None, "not_string", f"{field} is a JSON {_json_type(value)}, not a string", row)
    return _kept(number, value, row)


def _kept(number: int, text: str, row: bool) -> Line:
    text = text.strip()
    if not text:
        return Line(number, None, "empty", row=row)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:     # JSON's "\ud800": a lone surrogate, which no UTF-8 holds
        return Line(number, None, "invalid_utf8", f"not UTF-8 (a lone surrogate {ascii(text[error.start])[1:-1]} "
                                                  f"at character {error.start + 1})", row)
    return Line(number, text, row=row)


def _quoted(name: str) -> str:
    """A field's or column's name, quoted, as messages show it."""
    return f"'{printable(name)}'"


def _json_type(value: Any) -> str:
    kinds = ((bool, "boolean"), (dict, "object"), (list, "array"), (str, "string"), ((int, float), "number"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


# --- Parquet -----------------------------------------------------------------------------------------

def _parquet_rows(path: Path, reading: Reading, digest: Optional[Digest]) -> Iterator[Line]:
    """The rows of the string column `reading.field`, a record batch at a time (memory: about one row
    group's column)."""
    pa, pq = _pyarrow(path)
    with open_regular_file(path) as handle:
        if digest is not None:      # Parquet is read from its end first: hashed in a pass of its own
            for block in _raw_blocks(handle, path, digest):
                pass
            handle.seek(0)
        try:
            parquet = pq.ParquetFile(handle)
            _check_column(parquet.schema_arrow, reading.field, path, pa)
            number = 0
            for batch in parquet.iter_batches(batch_size=PARQUET_ROWS, columns=[reading.field]):
                column = batch.column(0)
                if pa.types.is_dictionary(column.type):   # a categorical: each row's string from the dictionary
                    column = column.dictionary_decode()
                for value in column.cast(pa.large_binary()).to_pylist():
                    number += 1
                    yield _parquet_row(number, value, reading)
        except (pa.ArrowException, OSError) as error:
            detail = printable(" ".join(str(error).split())[:200])
            raise UserError(f"{shown(path)}: not a Parquet file xspec can read ({detail})") from None


def _check_column(schema: Any, name: str, path: Path, pa: Any) -> None:
    names = schema.names
    if names.count(name) != 1:
        listed = ", ".join(_quoted(n) for n in names[:12]) + (", ..." if len(names) > 12 else "")
        what = "no column" if name not in names else "several columns"
        raise UserError(f"{shown(path)}: {what} named {_quoted(name)} (its columns: {listed or 'none'}); "
                        "--field names the text column")
    kind = schema.field(name).type
    stored = kind.value_type if pa.types.is_dictionary(kind) else kind   # dictionary-encoded (pandas' categorical)
    strings = (pa.types.is_string(stored) or pa.types.is_large_string(stored) or
               getattr(pa.types, "is_string_view", lambda t: False)(stored))
    if not strings:
        raise UserError(f"{shown(path)}: the column {_quoted(name)} holds {printable(str(kind))}, not strings; "
                        "--field names the text column")


def _parquet_row(number: int, value: Optional[bytes], reading: Reading) -> Line:
    if value is None:
        return Line(number, None, "no_field", f"{_quoted(reading.field)} is null", row=True)
    line = text_line(number, value if len(value) <= reading.max_bytes else None, reading.max_bytes)
    line.row = True
    return line


# --- the libraries -----------------------------------------------------------------------------------

def _zstandard(path: Path) -> Any:
    try:
        import zstandard
    except ImportError:
        raise UserError(f"{shown(path)}: reading zstandard files needs the zstandard package "
                        "(pip install zstandard)") from None
    return zstandard


def _pyarrow(path: Path) -> tuple[Any, Any]:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise UserError(f"{shown(path)}: reading Parquet files needs the pyarrow package (pip install pyarrow)") \
            from None
    return pyarrow, pyarrow.parquet
