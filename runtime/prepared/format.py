"""The prepared data directory (format version 1): what `xspec data prepare` writes and training reads.

    DIR/manifest.json         what the directory holds (`Manifest`): its kind, the token type, every data
                              file with its size and SHA-256, the sources it came from, counts, what was
                              skipped, the command that wrote it
    DIR/sentencepiece.model   the vocabulary its tokens are ids of
    DIR/tokens-NNNNN.bin      (kind "text") the documents as one stream of token ids, EOS d1 EOS d2 ... EOS,
                              cut into shards of at most SHARD_TOKENS ids (little-endian uint16 where the
                              vocabulary fits, else uint32)
    DIR/documents.bin         (kind "text") int64: the stream position of the EOS before each document, and
                              last the position of the final EOS, so document k is stream[o[k] : o[k+1] + 1]
    DIR/source-NNNNN.bin, DIR/target-NNNNN.bin
                              (kind "parallel") the two sides' token ids, sentence after sentence (no EOS)
    DIR/source.bin, DIR/target.bin
                              (kind "parallel") int64 offsets: pair k is source[s[k]:s[k+1]], target[t[k]:t[k+1]]

The manifest is a claim, checked against the files before training starts (`open_prepared`): its format
and version (a newer one is refused by name), the names it gives (plain names inside the directory, read
through InputDirectory: no link leading out of it, regular files only), the vocabulary's size (read from
the sentencepiece model itself, never from the manifest's number), each file's size and hash, the token
counts, the offsets (starting at 0, never decreasing, ending at the stream's length, the documents' ends
exactly where the stream holds its EOSes), the longest example, and every token id below the vocabulary's
size. Ids are checked again wherever they are read (a max over each slice), so a shard changed after the
checks is named, never an index error in the model. Nothing is unpickled: the files are raw arrays whose
type and length the checked manifest gives.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, Iterable, Iterator, Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from xspec.base.errors import UserError
from xspec.base.files import open_regular_file
from xspec.base.input_dir import InputDirectory
from xspec.base.strict_json import parse_json
from xspec.base.text import printable, shown
from ..vocab import EOS, Vocab

FORMAT: Final = "xspec-prepared"
VERSION: Final = 1
MANIFEST = "manifest.json"
VOCAB_FILE = "sentencepiece.model"
SHARD_TOKENS = 1 << 28              # ids per shard file: 512 MiB of uint16
MAX_MANIFEST_BYTES = 64 << 20       # a manifest names its files and sources: kilobytes
MAX_VOCAB_BYTES = 1 << 30           # a sentencepiece model: megabytes
CHECK_CHUNK = 1 << 24               # ids (or offsets) read at a time when checking: bounded memory
OFFSET = np.dtype("<i8")
NEWER_SKIPS = ("not_json", "not_object", "no_field", "not_string")
Kind = Literal["text", "parallel"]       # what a prepared directory holds: documents or sentence pairs


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class FileRecord(_Record):
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class SourceRecord(_Record):
    path: str
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class VocabularyRecord(_Record):
    pieces: int = Field(ge=8, le=1 << 32)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    origin: str                         # "trained on N lines of the sources" or the user's file


class Skipped(_Record):
    """What prepare skipped, by kind (runtime/prepared/lines.py). The kinds after invalid_utf8 are those of
    JSON Lines and Parquet inputs; they are left out of the file when zero (`Manifest.to_json`), so that a
    directory of plain text is written as it was before they existed."""

    empty: int = Field(0, ge=0)
    too_long: int = Field(0, ge=0)      # lines longer than prepare's --max-line-bytes
    invalid_utf8: int = Field(0, ge=0)
    not_json: int = Field(0, ge=0)
    not_object: int = Field(0, ge=0)
    no_field: int = Field(0, ge=0)      # no text field, or a null one
    not_string: int = Field(0, ge=0)
    where: list[str] = []               # the first few, as FILE:LINE: reason (FILE, row N: reason)


class Manifest(_Record):
    format: Literal["xspec-prepared"]
    version: Literal[1]
    kind: Kind
    dtype: Literal["uint16", "uint32"]
    vocabulary: VocabularyRecord
    streams: dict[str, list[str]]       # "tokens" (text); "source", "target" (parallel): shard files in order
    offsets: dict[str, str]             # "documents" (text); "source", "target" (parallel): offset files
    files: dict[str, FileRecord]        # every file above but the manifest
    examples: int = Field(ge=0)         # documents (text) or sentence pairs (parallel)
    tokens: dict[str, int]              # ids in each stream
    longest: dict[str, int]             # the longest example of each stream, in ids (EOS excluded)
    sources: list[SourceRecord]
    skipped: Skipped
    command: str
    created: str

    def stream_names(self) -> tuple[str, ...]:
        return ("tokens",) if self.kind == "text" else ("source", "target")

    @property
    def id_dtype(self) -> np.dtype:
        """The ids' type on disk: little-endian, as prepare writes them."""
        return np.dtype("<u2" if self.dtype == "uint16" else "<u4")

    def to_json(self) -> str:
        """manifest.json's text (see `Skipped`)."""
        unused = {kind for kind in NEWER_SKIPS if not getattr(self.skipped, kind)}
        return self.model_dump_json(indent=2, exclude={"skipped": unused}) + "\n"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open_regular_file(path) as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def prepared_directory(directory: Path) -> InputDirectory:
    """`directory` as a prepared directory to read: a directory, holding a manifest."""
    if not os.path.isdir(directory):
        reason = "no such directory" if not os.path.lexists(directory) else "not a directory"
        raise UserError(f"{shown(directory)}: not a prepared data directory ({reason}); make one with "
                        "xspec data prepare")
    source = InputDirectory.open(directory, "a prepared data directory")
    if not source.has(MANIFEST):
        raise UserError(f"{shown(directory)}: not a prepared data directory (no {MANIFEST}); make one with "
                        "xspec data prepare")
    return source


def read_manifest(source: InputDirectory) -> Manifest:
    path = source.file(MANIFEST)
    raw = parse_json(source.read(MANIFEST, MAX_MANIFEST_BYTES), shown(path))
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise UserError(f"{shown(path)}: not a manifest xspec wrote (format is not {FORMAT!r})")
    version = raw.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise UserError(f"{shown(path)}: prepared by a newer xspec (format version {version}); this one reads "
                        f"version {VERSION}: prepare the data again with this version, or upgrade xspec")
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"{shown(path)}: not a manifest xspec wrote ({printable(where)}: "
                        f"{printable(first['msg'])})") from None
    _check_names(manifest, path)
    return manifest


def _check_names(manifest: Manifest, path: Path) -> None:
    """Every file a manifest names is a plain name inside its directory, listed with its size and hash, and
    it lists no other."""
    offsets = {"documents"} if manifest.kind == "text" else {"source", "target"}
    if set(manifest.streams) != set(manifest.stream_names()) or set(manifest.offsets) != offsets or \
            set(manifest.tokens) != set(manifest.stream_names()) or \
            set(manifest.longest) != set(manifest.stream_names()):
        raise UserError(f"{shown(path)}: not a manifest xspec wrote (streams do not match kind {manifest.kind!r})")
    named = [name for shards in manifest.streams.values() for name in shards] + list(manifest.offsets.values())
    for name in [*named, *manifest.files, VOCAB_FILE]:
        if "/" in name or "\\" in name or name in ("", ".", "..") or "\0" in name:
            raise UserError(f"{shown(path)}: not a manifest xspec wrote (file name '{printable(name)}')")
        if name not in manifest.files and name != VOCAB_FILE:
            raise UserError(f"{shown(path)}: names {printable(name)} without its size and hash")
    if len(set(named)) != len(named) or set(manifest.files) != set(named):
        raise UserError(f"{shown(path)}: not a manifest xspec wrote (its files are not its shards and offsets, "
                        "each once)")


def check_ids(path: Path, at: int, ids: np.ndarray, pieces: int, name: str) -> None:
    """The ids read from `path` (the first at position `at` of that shard) are below `pieces`."""
    if len(ids) and int(ids.max()) >= pieces:
        raise UserError(f"{shown(path)}: the {name} stream holds id {int(ids.max())} at or near position "
                        f"{at + int(np.argmax(ids >= pieces))} of this shard, beyond the vocabulary's {pieces} "
                        "pieces: corrupt, or prepared with another vocabulary")


@dataclass
class TokenStream:
    """One stream of token ids over its shard files, read-only and memory-mapped: nothing is loaded."""

    shards: list[np.ndarray]            # memory maps (an empty shard: an empty array)
    starts: np.ndarray                  # the stream position of each shard's first id, then the total
    paths: list[Path]                   # the shard files, for messages
    pieces: int                         # the vocabulary's: every id read is checked below it
    name: str

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, start: int, end: int) -> np.ndarray:
        """Ids [start, end) as int64, across shard boundaries."""
        pieces = []
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        for s in range(max(first, 0), len(self.shards)):
            lo, hi = int(self.starts[s]), int(self.starts[s + 1])
            if lo >= end:
                break
            piece = self.shards[s][max(start, lo) - lo:min(end, hi) - lo]
            check_ids(self.paths[s], max(start, lo) - lo, piece, self.pieces, self.name)
            pieces.append(piece)
        return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)


@dataclass
class PreparedDir:
    path: Path
    manifest: Manifest
    vocab_proto: bytes
    pieces: int                         # the vocabulary's size, read from its file
    streams: dict[str, TokenStream]
    offsets: dict[str, np.ndarray]      # int64, examples + 1 each; memory-mapped where not empty
    source: InputDirectory

    @property
    def kind(self) -> str:
        return self.manifest.kind

    def __len__(self) -> int:
        return self.manifest.examples

    def id_chunks(self, name: str) -> Iterator[np.ndarray]:
        """The ids of stream `name`, a chunk at a time, by ordinary reads (see open_prepared), checked."""
        for path, _, chunk in _shard_chunks(self.source, self.manifest, name, self.pieces, hashed=False):
            yield chunk

    def example_lengths(self, name: str) -> Iterator[np.ndarray]:
        """The differences of consecutive offsets of `name` (each example's ids; a document's with its EOS),
        a chunk at a time, by ordinary reads (see open_prepared)."""
        file = self.manifest.offsets[name]
        return _differences(blocks(self.source.open_file(file), self.source.file(file), OFFSET))


def open_prepared(directory: Path, verify: bool = True) -> PreparedDir:
    """A prepared directory, checked (see the module docstring); `verify=False` skips the hashes and the
    scans of every id and offset (for a directory this process has just checked).

    The scans read the files a chunk at a time through ordinary reads, each file once for its hash and
    its checks together: a scan through the memory maps would leave every page of the corpus counted in
    the process's resident memory."""
    directory = Path(directory)
    source = prepared_directory(directory)
    manifest = read_manifest(source)
    pieces, proto = _vocabulary(source, manifest)
    streams = {name: _stream(source, name, manifest, pieces) for name in manifest.stream_names()}
    for name in manifest.stream_names():
        if len(streams[name]) != manifest.tokens[name]:
            raise UserError(f"{shown(source.file(MANIFEST))}: the {name} shards hold {len(streams[name]):,} ids, "
                            f"the manifest says {manifest.tokens[name]:,}")
    offsets = {name: _offsets(source, name, manifest, len(streams[_stream_of(name)]))
               for name in manifest.offsets}
    if verify:
        for name in manifest.offsets:
            _scan_index(source, name, manifest, len(streams[_stream_of(name)]))
        for name in manifest.stream_names():
            ends: Optional[tuple[Taken, Path]] = None
            if name == "tokens":
                index = source.file(manifest.offsets["documents"])
                ends = Taken(blocks(source.open_file(manifest.offsets["documents"]), index, OFFSET)), index
            scan_ids(name, _shard_chunks(source, manifest, name, pieces, hashed=True), pieces, ends)
    return PreparedDir(directory, manifest, proto, pieces, streams, offsets, source)


def _stream_of(offsets_name: str) -> str:
    return "tokens" if offsets_name == "documents" else offsets_name


def _vocabulary(source: InputDirectory, manifest: Manifest) -> tuple[int, bytes]:
    """The vocabulary's size, from the sentencepiece model itself, and the model; the manifest's claims
    about it checked."""
    vocab_path = source.file(VOCAB_FILE)
    proto = source.read(VOCAB_FILE, MAX_VOCAB_BYTES)
    if hashlib.sha256(proto).hexdigest() != manifest.vocabulary.sha256:
        raise UserError(f"{shown(vocab_path)}: not the vocabulary {shown(source.file(MANIFEST))} was prepared with "
                        "(its hash differs)")
    pieces = len(Vocab.from_bytes(proto, shown(vocab_path)))
    if pieces != manifest.vocabulary.pieces:
        raise UserError(f"{shown(source.file(MANIFEST))}: vocabulary.pieces is {manifest.vocabulary.pieces:,}, but "
                        f"{shown(vocab_path)} has {pieces:,} pieces: not the manifest xspec wrote")
    return pieces, proto


def _mapped(source: InputDirectory, name: str, dtype: np.dtype, manifest: Manifest) -> np.ndarray:
    """The file `name`, memory-mapped, after checking that it holds the bytes its record says."""
    path, record = source.file(name), manifest.files[name]
    if record.bytes % dtype.itemsize:
        raise UserError(f"{shown(path)}: {record.bytes} bytes is not a whole number of {dtype.itemsize}-byte "
                        "values")
    with source.open_file(name) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size != record.bytes:
            raise UserError(f"{shown(path)}: {size:,} bytes, but its manifest says {record.bytes:,}: truncated or "
                            "replaced; prepare the data again")
        count = size // dtype.itemsize
        return np.memmap(handle, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype=dtype)


def _stream(source: InputDirectory, name: str, manifest: Manifest, pieces: int) -> TokenStream:
    shards = manifest.streams[name]
    maps = [_mapped(source, shard, manifest.id_dtype, manifest) for shard in shards]
    starts = np.cumsum([0, *(len(m) for m in maps)], dtype=np.int64)
    return TokenStream(maps, starts, [source.file(shard) for shard in shards], pieces, name)


def _offsets(source: InputDirectory, name: str, manifest: Manifest, stream_length: int) -> np.ndarray:
    path = source.file(manifest.offsets[name])
    offsets = _mapped(source, manifest.offsets[name], OFFSET, manifest)
    count = manifest.examples + 1
    if len(offsets) != count:
        raise UserError(f"{shown(path)}: {len(offsets) * OFFSET.itemsize:,} bytes, not the {count:,} offsets of "
                        f"{manifest.examples:,} examples: the index does not match its shards")
    last_expected = stream_length - 1 if name == "documents" else stream_length
    if int(offsets[0]) != 0 or int(offsets[-1]) != last_expected:
        raise UserError(f"{shown(path)}: the index does not match its shards (it spans {int(offsets[0])}.."
                        f"{int(offsets[-1])}, the {_stream_of(name)} stream 0..{last_expected})")
    return offsets


def _scan_index(source: InputDirectory, name: str, manifest: Manifest, stream_length: int) -> None:
    """The offsets of `name` read through (hashed), and the manifest's longest example checked against them."""
    file = manifest.offsets[name]
    text = name == "documents"
    largest = scan_offsets(source.file(file), _hashed(source, file, manifest, OFFSET), manifest.examples + 1,
                           stream_length - 1 if text else stream_length, least=1 if text else 0)
    longest = largest - 1 if text and manifest.examples else largest
    stream = _stream_of(name)
    if longest != manifest.longest[stream]:
        raise UserError(f"{shown(source.file(MANIFEST))}: longest.{stream} is {manifest.longest[stream]:,}, but the "
                        f"longest example in {shown(source.file(file))} has {longest:,} ids")


# --- reading and checking files a chunk at a time (shared with prepare's resume) --------------------

def blocks(handle: BinaryIO, path: Path, dtype: np.dtype, digest=None,
           limit: Optional[int] = None) -> Iterator[np.ndarray]:
    """The values of the open file `handle` (at most `limit` bytes of it) a chunk at a time, by ordinary
    reads, each read block into `digest` when given; the file is closed at the end."""
    with handle:
        left = limit
        while left is None or left > 0:
            size = CHECK_CHUNK * dtype.itemsize if left is None else min(CHECK_CHUNK * dtype.itemsize, left)
            try:
                block = handle.read(size)
            except OSError as error:
                raise UserError(f"{shown(path)}: cannot read: {error.strerror}") from None
            if not block:
                return
            if len(block) % dtype.itemsize:
                raise UserError(f"{shown(path)}: ends inside a value (changed while it was read?)")
            if digest is not None:
                digest.update(block)
            if left is not None:
                left -= len(block)
            yield np.frombuffer(block, dtype=dtype)


def _differences(chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """The differences of consecutive values across chunks, a chunk at a time."""
    previous = None
    for chunk in chunks:
        if not len(chunk):
            continue
        yield np.diff(chunk if previous is None else np.concatenate(([previous], chunk)))
        previous = chunk[-1]


def _hashed(source: InputDirectory, name: str, manifest: Manifest, dtype: np.dtype) -> Iterator[np.ndarray]:
    """`blocks` of the file, its SHA-256 checked when they are all read."""
    path, digest = source.file(name), hashlib.sha256()
    yield from blocks(source.open_file(name), path, dtype, digest)
    if digest.hexdigest() != manifest.files[name].sha256:
        raise UserError(f"{shown(path)}: corrupt (its SHA-256 differs from the manifest's); prepare the data again")


IdChunk = tuple[Path, int, np.ndarray]      # a shard, the chunk's first position in it, the chunk's ids


def _shard_chunks(source: InputDirectory, manifest: Manifest, name: str, pieces: int,
                  hashed: bool) -> Iterator[IdChunk]:
    """The ids of stream `name`, shard after shard, a chunk at a time (each shard's hash checked when
    `hashed`); ids are checked below `pieces` by whoever reads them."""
    for shard in manifest.streams[name]:
        path, at = source.file(shard), 0
        chunks = _hashed(source, shard, manifest, manifest.id_dtype) if hashed else \
            blocks(source.open_file(shard), path, manifest.id_dtype)
        for chunk in chunks:
            if not hashed:
                check_ids(path, at, chunk, pieces, name)
            yield path, at, chunk
            at += len(chunk)


class Taken:
    """Values read chunk by chunk, taken a given number at a time."""

    def __init__(self, chunks: Iterable[np.ndarray]) -> None:
        self.chunks, self.held, self.taken = iter(chunks), np.zeros(0, dtype=np.int64), 0

    def take(self, count: int) -> np.ndarray:
        parts = []
        while count:
            if not len(self.held):
                chunk = next(self.chunks, None)
                if chunk is None:
                    break
                self.held = chunk
            part, self.held = self.held[:count], self.held[count:]
            parts.append(part)
            count -= len(part)
        taken = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.taken += len(taken)
        return taken


def scan_ids(name: str, chunks: Iterable[IdChunk], pieces: int, ends: Optional[tuple[Taken, Path]] = None) -> None:
    """Every id of a stream below `pieces`; for text, given `ends` (the offsets of the documents' ends, and
    the index they are read from), an EOS exactly where each document ends and nowhere else."""
    position = 0                            # in the stream
    for path, at, chunk in chunks:
        check_ids(path, at, chunk, pieces, name)
        if ends is not None:
            _check_ends(np.flatnonzero(chunk == EOS), position, ends[0], path, at, ends[1])
        position += len(chunk)
    if ends is not None:
        taken, index = ends
        held = taken.taken
        if len(taken.take(1)):
            raise UserError(f"{shown(index)}: the index does not match its shards (it holds more ends of documents "
                            f"than the {held:,} EOSes of the {name} stream)")


def _check_ends(found: np.ndarray, position: int, ends: Taken, path: Path, at: int, index: Path) -> None:
    """The EOSes `found` in a chunk (the chunk's first id at stream `position`, shard position `at`) are the
    next ends of documents the index gives."""
    before = ends.taken
    expected = ends.take(len(found))
    found = found + position
    if len(expected) == len(found) and (expected == found).all():
        return
    n = len(expected)
    differ = np.flatnonzero(expected != found[:n])
    k = int(differ[0]) if len(differ) else n
    said = f"the index says stream position {int(expected[k]):,}" if k < n else "the index has no more documents"
    raise UserError(f"{shown(index)}: the index does not match its shards (the stream's EOS number {before + k:,} "
                    f"is at position {at + int(found[k]) - position:,} of {shown(path)}; {said})")


def scan_offsets(path: Path, chunks: Iterable[np.ndarray], count: int, end: int, least: int) -> int:
    """Checks the `count` offsets of `path` read chunk by chunk: the first is 0, each one at least `least`
    past the one before, the last is `end`; returns the largest step (0 for one offset)."""
    seen, previous, largest = 0, None, 0
    for chunk in chunks:
        if not len(chunk):
            continue
        if previous is None and int(chunk[0]) != 0:
            raise UserError(f"{shown(path)}: the index does not match its shards (it starts at {int(chunk[0])}, "
                            "not 0)")
        steps = np.diff(chunk if previous is None else np.concatenate(([previous], chunk)))
        if (steps < least).any():
            raise UserError(f"{shown(path)}: the index does not match its shards (offsets decrease near example "
                            f"{max(seen - 1, 0) + int(np.argmax(steps < least))})")
        largest = max(largest, int(steps.max())) if len(steps) else largest
        previous, seen = int(chunk[-1]), seen + len(chunk)
    if seen != count:
        raise UserError(f"{shown(path)}: {seen:,} offsets, not the {count:,} of {count - 1:,} examples: the index "
                        "does not match its shards")
    if previous != end:
        raise UserError(f"{shown(path)}: the index does not match its shards (it ends at {previous}, the stream "
                        f"at {end})")
    return largest
