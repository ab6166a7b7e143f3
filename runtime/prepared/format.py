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

Everything read from a directory is checked before training starts (`open_prepared`): the manifest's
format and version (a newer one is refused by name), each file's size and hash, the offsets (starting
at 0, never decreasing, ending at the stream's length), and every token id below the vocabulary's size.
Nothing is unpickled: the files are raw arrays whose type and length the manifest gives.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from xspec.base.errors import UserError
from xspec.base.files import open_regular_file, read_regular_file

FORMAT = "xspec-prepared"
VERSION = 1
MANIFEST = "manifest.json"
VOCAB_FILE = "sentencepiece.model"
SHARD_TOKENS = 1 << 28              # ids per shard file: 512 MiB of uint16
MAX_MANIFEST_BYTES = 64 << 20       # a manifest names its files and sources: kilobytes
CHECK_CHUNK = 1 << 24               # ids (or offsets) read at a time when checking: bounded memory
OFFSET = np.dtype("<i8")


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
    empty: int = Field(0, ge=0)
    too_long: int = Field(0, ge=0)      # lines longer than prepare's --max-line-bytes
    invalid_utf8: int = Field(0, ge=0)
    where: list[str] = []               # the first few, as FILE:LINE: reason


class Manifest(_Record):
    format: Literal["xspec-prepared"]
    version: Literal[1]
    kind: Literal["text", "parallel"]
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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open_regular_file(path) as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    if not directory.is_dir():
        raise UserError(f"{directory}: not a prepared data directory (no such directory); make one with "
                        "xspec data prepare")
    if not path.exists():
        raise UserError(f"{directory}: not a prepared data directory (no {MANIFEST}); make one with "
                        "xspec data prepare")
    try:
        raw = json.loads(read_regular_file(path, MAX_MANIFEST_BYTES).decode("utf-8"))
    except (ValueError, RecursionError):
        raise UserError(f"{path}: not a manifest xspec wrote (not JSON)") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise UserError(f"{path}: not a manifest xspec wrote (format is not {FORMAT!r})")
    version = raw.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise UserError(f"{path}: prepared by a newer xspec (format version {version}); this one reads version "
                        f"{VERSION}: prepare the data again with this version, or upgrade xspec")
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"{path}: not a manifest xspec wrote ({where}: {first['msg']})") from None
    _check_names(manifest, path)
    return manifest


def _check_names(manifest: Manifest, path: Path) -> None:
    """Every file a manifest names is a plain name inside its directory, listed with its size and hash."""
    offsets = {"documents"} if manifest.kind == "text" else {"source", "target"}
    if set(manifest.streams) != set(manifest.stream_names()) or set(manifest.offsets) != offsets or \
            set(manifest.tokens) != set(manifest.stream_names()) or \
            set(manifest.longest) != set(manifest.stream_names()):
        raise UserError(f"{path}: not a manifest xspec wrote (streams do not match kind {manifest.kind!r})")
    named = [name for shards in manifest.streams.values() for name in shards] + list(manifest.offsets.values())
    for name in named + [VOCAB_FILE]:
        if "/" in name or "\\" in name or name in ("", ".", "..") or "\0" in name:
            raise UserError(f"{path}: not a manifest xspec wrote (file name {name!r})")
        if name not in manifest.files and name != VOCAB_FILE:
            raise UserError(f"{path}: names {name} without its size and hash")


@dataclass
class TokenStream:
    """One stream of token ids over its shard files, read-only and memory-mapped: nothing is loaded."""

    shards: list[np.ndarray]            # memory maps (an empty shard: an empty array)
    starts: np.ndarray                  # the stream position of each shard's first id, then the total

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
            pieces.append(self.shards[s][max(start, lo) - lo:min(end, hi) - lo])
        return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)


@dataclass
class PreparedDir:
    path: Path
    manifest: Manifest
    vocab_proto: bytes
    streams: dict[str, TokenStream]
    offsets: dict[str, np.memmap]       # int64, examples + 1 each

    @property
    def kind(self) -> str:
        return self.manifest.kind

    def __len__(self) -> int:
        return self.manifest.examples

    def id_chunks(self, name: str) -> Iterator[np.ndarray]:
        """The ids of stream `name`, a chunk at a time, by ordinary reads (see open_prepared)."""
        for shard in self.manifest.streams[name]:
            yield from _blocks(self.path / shard, self.manifest.id_dtype)

    def example_lengths(self, name: str) -> Iterator[np.ndarray]:
        """The differences of consecutive offsets of `name` (each example's ids; a document's with its EOS),
        a chunk at a time, by ordinary reads (see open_prepared)."""
        return _differences(_blocks(self.path / self.manifest.offsets[name], OFFSET))


def open_prepared(directory: Path, verify: bool = True) -> PreparedDir:
    """A prepared directory, checked (see the module docstring); `verify=False` skips the hashes and the
    scans of every id and offset (for a directory this process has just checked).

    The scans read the files a chunk at a time through ordinary reads, each file once for its hash and
    its checks together: a scan through the memory maps would leave every page of the corpus counted in
    the process's resident memory."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    vocab_path = directory / VOCAB_FILE
    proto = read_regular_file(vocab_path)
    if hashlib.sha256(proto).hexdigest() != manifest.vocabulary.sha256:
        raise UserError(f"{vocab_path}: not the vocabulary {directory / MANIFEST} was prepared with (its hash differs)")
    dtype = manifest.id_dtype
    for name, record in manifest.files.items():
        _check_size(directory / name, record)
    streams = {name: _stream(directory, shards, dtype, manifest) for name, shards in manifest.streams.items()}
    for name in manifest.stream_names():
        if len(streams[name]) != manifest.tokens[name]:
            raise UserError(f"{directory / MANIFEST}: the {name} shards hold {len(streams[name]):,} ids, the manifest "
                            f"says {manifest.tokens[name]:,}")
    offsets = {}
    for name, file in manifest.offsets.items():
        length = len(streams["tokens" if name == "documents" else name])
        offsets[name] = _offsets(directory / file, manifest.examples, length, name)
        if verify:
            _scan_offsets(directory / file, manifest.files[file], name)
    if verify:
        for name, shards in manifest.streams.items():
            for shard in shards:
                _scan_ids(directory / shard, manifest.files[shard], dtype, manifest.vocabulary.pieces, name)
    return PreparedDir(directory, manifest, proto, streams, offsets)


def _check_size(path: Path, record: FileRecord) -> None:
    with open_regular_file(path) as handle:
        size = handle.seek(0, 2)
    if size != record.bytes:
        raise UserError(f"{path}: {size:,} bytes, but its manifest says {record.bytes:,}: truncated or replaced; "
                        "prepare the data again")


def _blocks(path: Path, dtype: np.dtype, digest=None) -> Iterator[np.ndarray]:
    """The file's values a chunk at a time, by ordinary reads (each read block into `digest` when given)."""
    with open_regular_file(path) as handle:
        while block := handle.read(CHECK_CHUNK * dtype.itemsize):
            if digest is not None:
                digest.update(block)
            yield np.frombuffer(block, dtype=dtype)


def _differences(chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """The differences of consecutive values across chunks, a chunk at a time."""
    previous = None
    for chunk in chunks:
        yield np.diff(chunk if previous is None else np.concatenate(([previous], chunk)))
        previous = chunk[-1]


def _hashed(path: Path, record: FileRecord, dtype: np.dtype) -> Iterator[np.ndarray]:
    """`_blocks` of the file, its SHA-256 checked when they are all read."""
    digest = hashlib.sha256()
    yield from _blocks(path, dtype, digest)
    if digest.hexdigest() != record.sha256:
        raise UserError(f"{path}: corrupt (its SHA-256 differs from the manifest's); prepare the data again")


def _stream(directory: Path, shards: list[str], dtype: np.dtype, manifest: Manifest) -> TokenStream:
    maps, starts = [], [0]
    for name in shards:
        size = manifest.files[name].bytes
        if size % dtype.itemsize:
            raise UserError(f"{directory / name}: {size} bytes is not a whole number of {manifest.dtype} ids")
        count = size // dtype.itemsize
        maps.append(np.memmap(directory / name, dtype=dtype, mode="r", shape=(count,)) if count
                    else np.zeros(0, dtype=dtype))
        starts.append(starts[-1] + count)
    return TokenStream(maps, np.array(starts, dtype=np.int64))


def _offsets(path: Path, examples: int, stream_length: int, name: str) -> np.memmap:
    size = path.stat().st_size
    count = examples + 1
    if size != count * OFFSET.itemsize:
        raise UserError(f"{path}: {size:,} bytes, not the {count:,} offsets of {examples:,} examples: the index does "
                        "not match its shards")
    offsets = np.memmap(path, dtype=OFFSET, mode="r", shape=(count,))
    last_expected = stream_length - 1 if name == "documents" else stream_length
    if int(offsets[0]) != 0 or int(offsets[-1]) != last_expected:
        raise UserError(f"{path}: the index does not match its shards (it spans {int(offsets[0])}..{int(offsets[-1])}, "
                        f"the {name} stream 0..{last_expected})")
    return offsets


def _scan_offsets(path: Path, record: FileRecord, name: str) -> None:
    """Offsets never decrease (a document holds at least one id besides its EOS: they increase)."""
    least = 1 if name == "documents" else 0
    at = 0                                  # examples before this chunk's steps (step k is example k's size)
    for steps in _differences(_hashed(path, record, OFFSET)):
        if (steps < least).any():
            raise UserError(f"{path}: the index does not match its shards (offsets decrease near example "
                            f"{at + int(np.argmax(steps < least))})")
        at += len(steps)


def _scan_ids(path: Path, record: FileRecord, dtype: np.dtype, pieces: int, name: str) -> None:
    at = 0
    for chunk in _hashed(path, record, dtype):
        if len(chunk) and int(chunk.max()) >= pieces:
            raise UserError(f"{path}: the {name} stream holds id {int(chunk.max())} at or near position "
                            f"{at + int(np.argmax(chunk >= pieces))} of this shard, beyond the vocabulary's {pieces} "
                            "pieces: corrupt, or prepared with another vocabulary")
        at += len(chunk)
