"""`xspec data prepare`: text into a prepared data directory (runtime/prepared/format.py).

The input is plain text, JSON Lines or Parquet, compressed or not (sources.py). Two passes over it, each
a stream (memory bounded whatever its size):
1. unless a vocabulary is given, a uniform sample of at most `vocab_sample` kept lines (reservoir
   sampling, seeded) on which sentencepiece trains, as its own `input_sentence_size` would sample;
2. the lines cut into chunks that worker processes tokenize (each with the vocabulary loaded once),
   written in order, as they come back, into shards of token ids and their offset files; the input
   files are hashed on the way.
Everything is written into a hidden folder beside the output, which is renamed into place only once
complete: an interrupted prepare leaves nothing that looks like a prepared directory. It resumes: the
folder keeps the vocabulary and, every CHECKPOINT_SECONDS, what has been written (progress.json, written
after the files it describes are flushed to disk). The same command again continues from there (the
inputs read again up to that point, for their hashes, but not tokenized again); one with other inputs or
options starts over. A lock on the folder keeps a second prepare of the same output out while one runs.

The record is not trusted: before anything is cut or reopened, every count it gives is checked against
the files it describes (sizes, hashes, ids below the vocabulary's size, offsets, the documents' ends, the
longest example), and against the inputs (they must hold as many examples as it says were written). A
record that disagrees means starting over, with a note; only the hidden folder is emptied, and only when
it holds nothing but files prepare writes.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import re
import shutil
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterable, Iterator, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from xspec.base.errors import UserError
from xspec.base.files import open_regular_file, read_regular_file
from xspec.base.strict_json import parse_json
from xspec.base.text import shown
from .format import (FORMAT, MANIFEST, MAX_VOCAB_BYTES, OFFSET, SHARD_TOKENS, VERSION, VOCAB_FILE, FileRecord,
                     Kind, Manifest, Skipped, SourceRecord, Taken, VocabularyRecord, blocks, scan_ids, scan_offsets)
from .lines import Digest, Skips
from .sources import Reading, aligned_lines, text_lines
from ..vocab import EOS, Vocab, train_vocab

if TYPE_CHECKING:
    import sentencepiece as spm

CHUNK_LINES = 4096                  # lines a worker tokenizes at a time
SAMPLED_LINE_BYTES = 4192          # sentencepiece's max_sentence_length: longer lines do not train it
UINT16_PIECES = 1 << 16             # vocabularies up to this size store ids as uint16, larger ones as uint32
PARTIAL = ".partial"                # the hidden folder: .NAME.partial
PROGRESS = "progress.json"          # in it: what has been written, for a resume
LOCK = ".lock"                      # in it: held while a prepare writes there
CHECKPOINT_SECONDS = 30.0           # how often progress is recorded (each record flushes the files to disk)
MAX_PROGRESS_BYTES = 16 << 20       # a record names shards and their hashes: kilobytes
# Every name prepare writes in its hidden folder (the vocabulary's temporary file included).
OWN_NAMES = re.compile(r"\.lock|progress\.json(\.new)?|sentencepiece\.model|\.sentencepiece\.model\.[^/]*\.tmp|"
                       r"manifest\.json|(tokens|source|target)-\d{5}\.bin|(documents|source|target)\.bin")


@dataclass(frozen=True)
class PrepareOptions:
    vocab_size: int = 37000
    vocab_model: str = "bpe"
    vocab_file: Optional[Path] = None   # a sentencepiece model to use instead of training one
    vocab_sample: int = 1_000_000       # lines the vocabulary is trained on at most
    max_line_bytes: int = 1 << 20
    field: str = "text"                 # the text's field (JSON Lines) or column (Parquet)
    workers: int = 1
    progress: bool = False
    command: str = ""

    @property
    def reading(self) -> Reading:
        return Reading(self.max_line_bytes, self.field)


def prepare_text(files: list[Path], out: Path, options: PrepareOptions,
                 say: Callable[[str], None] = print) -> Manifest:
    """A language model's documents, one a record, from `files` (in order) into `out`."""
    def lines(skips: Skips, digests: Optional[list[Digest]] = None) -> Iterator[str]:
        return text_lines(files, options.reading, skips, digests)

    return _prepare("text", files, lines, lambda pairs: pairs, out, options, say)


def prepare_parallel(source: Path, target: Path, out: Path, options: PrepareOptions,
                     say: Callable[[str], None] = print) -> Manifest:
    """A translation corpus, two files aligned record by record, into `out`."""
    def pairs(skips: Skips, digests: Optional[list[Digest]] = None) -> Iterator[tuple[str, str]]:
        return aligned_lines(source, target, options.reading, skips, digests)

    def sides(items: Iterable[tuple[str, str]]) -> Iterator[str]:
        for s, t in items:
            yield s
            yield t

    return _prepare("parallel", [source, target], pairs, sides, out, options, say)


class _StartOver(Exception):
    """An interrupted prepare's record that disagrees with its files or inputs; the message says how."""


def _prepare(kind: Kind, files: list[Path], read: Callable, text_of: Callable, out: Path, options: PrepareOptions,
             say: Callable[[str], None]) -> Manifest:
    out = Path(out)
    if os.path.lexists(out):
        raise UserError(f"-o {shown(out)}: already exists; choose another folder or remove it (a prepared directory "
                        "is written whole, never over another)")
    started = time.time()
    fingerprint = _fingerprint(kind, files, options)
    work = out.parent / f".{out.name}{PARTIAL}"
    lock, progress = _claim(work, fingerprint, out)
    try:
        try:
            manifest, vocab, skips = _write(kind, files, read, text_of, work, out, fingerprint, progress, options,
                                            say)
        except _StartOver as disagreement:
            say(f"{shown(out)}: the interrupted prepare's record does not match what it describes ({disagreement}); "
                "starting over")
            _empty(work)
            manifest, vocab, skips = _write(kind, files, read, text_of, work, out, fingerprint, None, options, say)
        (work / MANIFEST).write_text(manifest.to_json(), encoding="utf-8")
        for name in (PROGRESS, f"{PROGRESS}.new", LOCK):     # the resume's own files
            (work / name).unlink(missing_ok=True)
        _sync(work)
        os.rename(work, out)
    except UserError:
        shutil.rmtree(work, ignore_errors=True)     # the input is at fault: nothing to resume
        raise
    except BaseException:
        say(f"{shown(out)}: interrupted; the same command resumes it")
        raise
    finally:
        if lock is not None:
            lock.close()
    seconds = time.time() - started
    read_bytes = sum(s.bytes for s in manifest.sources)
    unit = "documents" if kind == "text" else "sentence pairs"
    say(f"{shown(out)}: {manifest.examples:,} {unit}, "
        f"{' + '.join(f'{n:,}' for n in manifest.tokens.values())} tokens ({manifest.dtype}), vocabulary "
        f"{len(vocab):,}; {skips.describe()}; {read_bytes / 1e6:,.1f} MB in {seconds:.1f} s "
        f"({read_bytes / 1e6 / max(seconds, 1e-9):.1f} MB/s, "
        f"{options.workers} worker{'s' if options.workers > 1 else ''})")
    return manifest


def _write(kind: Kind, files: list[Path], read: Callable, text_of: Callable, work: Path, out: Path,
           fingerprint: dict, progress: Optional["Progress"], options: PrepareOptions,
           say: Callable[[str], None]) -> tuple[Manifest, Vocab, Skips]:
    """Everything but the manifest's file into `work`, from the start or, given `progress`, after what it
    records (checked first); returns the manifest, the vocabulary and what was skipped."""
    unit = "documents" if kind == "text" else "sentence pairs"
    if progress is None:
        vocab, origin = _vocabulary(read, text_of, work, options, say)
        progress = Progress(fingerprint=fingerprint, origin=origin,
                            vocabulary=hashlib.sha256(vocab.model_proto).hexdigest())
        _record(work, progress)
    else:
        vocab, origin = _recorded_vocabulary(work, progress), progress.origin
    dtype = np.dtype("<u2" if len(vocab) <= UINT16_PIECES else "<u4")
    written = _check_progress(work, progress.writer, kind, dtype, len(vocab)) if progress.writer else {}
    if progress.writer is not None:
        say(f"{shown(out)}: resuming an interrupted prepare after its first {progress.writer.examples:,} {unit}")
    skips, digests = Skips(), [Digest() for _ in files]
    items = read(skips, digests)
    _skip_written(items, progress.writer.examples if progress.writer else 0)
    writer = _TextWriter(work, dtype, progress.writer, written) if kind == "text" else \
        _ParallelWriter(work, dtype, progress.writer, written)
    recorded = time.monotonic()
    for encoded in _encode(items, vocab, kind, options):
        writer.add(encoded)
        if time.monotonic() - recorded >= CHECKPOINT_SECONDS:
            _record(work, progress.model_copy(update={"writer": writer.checkpoint()}))
            recorded = time.monotonic()
    if not writer.examples:
        raise UserError(f"{', '.join(shown(f) for f in files)}: no text to prepare ({skips.describe()})")
    files_written = writer.close()
    manifest = Manifest(
        format=FORMAT, version=VERSION, kind=kind, dtype="uint16" if dtype.itemsize == 2 else "uint32",
        vocabulary=VocabularyRecord(pieces=len(vocab), sha256=hashlib.sha256(vocab.model_proto).hexdigest(),
                                    origin=origin),
        streams=writer.streams, offsets=writer.offset_files, files=files_written,
        examples=writer.examples, tokens=writer.tokens_count, longest=writer.longest,
        sources=[SourceRecord(path=str(Path(f).resolve()), bytes=digest.bytes, sha256=digest.sha256.hexdigest())
                 for f, digest in zip(files, digests)],
        skipped=Skipped(**skips.counts(), where=skips.where),
        command=options.command, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return manifest, vocab, skips


def _skip_written(items: Iterator, count: int) -> None:
    """Reads past the `count` examples an interrupted prepare wrote (for the inputs' hashes only)."""
    for done in range(count):
        if next(items, None) is None:
            raise _StartOver(f"it records {count:,} examples written, but the inputs hold {done:,}")


# --- resuming ------------------------------------------------------------------------------------

class _State(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ShardsState(_State):
    """Where a stream of shards stood at a checkpoint: its files (the last one open), ids written."""

    names: list[str]
    length: int = Field(ge=0)
    in_shard: int = Field(ge=0)                 # ids in the open (last) shard
    records: dict[str, FileRecord]              # the finished shards

    @model_validator(mode="after")
    def _consistent(self) -> "ShardsState":
        prefix = self.names[0].rsplit("-", 1)[0] if self.names else ""
        if (self.names != [f"{prefix}-{i:05d}.bin" for i in range(len(self.names))]
                or prefix not in ("", "tokens", "source", "target") or set(self.records) != set(self.names[:-1])
                or self.in_shard > SHARD_TOKENS):
            raise ValueError("shard names, records and counts that prepare does not write")
        return self


class TextState(_State):
    tokens: ShardsState
    documents: int = Field(ge=1)                # offsets written
    examples: int = Field(ge=0)
    longest: int = Field(ge=0)


class SideState(_State):
    ids: ShardsState
    offsets: int = Field(ge=1)


class PairsState(_State):
    source: SideState
    target: SideState
    examples: int = Field(ge=0)
    longest: dict[str, int]


class Progress(_State):
    """progress.json: what an interrupted prepare had written, for the same inputs and options."""

    fingerprint: dict[str, Any]
    origin: str
    vocabulary: str = Field(pattern=r"^[0-9a-f]{64}$")     # the SHA-256 of the vocabulary it wrote
    writer: Optional[Union[TextState, PairsState]] = None


def _fingerprint(kind: str, files: list[Path], options: PrepareOptions) -> dict[str, Any]:
    """What makes a prepared directory what it is: its inputs as they are now (path, size, modification
    time), the vocabulary's settings or file, the line limit and the text's field. Workers and messages do
    not count."""
    def stamp(path: Path) -> list:
        try:
            status = path.stat()
        except OSError as error:
            raise UserError(f"{shown(path)}: cannot read: {error.strerror}") from None
        return [str(path.resolve()), status.st_size, status.st_mtime_ns]

    return {"format": [FORMAT, VERSION, SHARD_TOKENS], "kind": kind, "inputs": [stamp(Path(f)) for f in files],
            "vocabulary": (stamp(Path(options.vocab_file)) if options.vocab_file is not None
                           else [options.vocab_size, options.vocab_model, options.vocab_sample]),
            "max_line_bytes": options.max_line_bytes, "field": options.field}


def _claim(work: Path, fingerprint: dict, out: Path) -> tuple[Optional[BinaryIO], Optional[Progress]]:
    """The hidden folder, locked for this prepare: an interrupted one's progress where it prepared the same
    inputs with the same options, else an empty folder (a leftover of other inputs emptied)."""
    if os.path.islink(work) or (os.path.lexists(work) and not work.is_dir()):
        raise UserError(f"{shown(work)}: in the way of the folder prepare writes -o {shown(out)} in (it is not one "
                        "prepare made); move it away or remove it")
    if work.is_dir():
        _check_own_folder(work, out)
        lock = _lock(work / LOCK, out)
        progress = _read_progress(work / PROGRESS)
        if progress is not None and progress.fingerprint == fingerprint:
            return lock, progress
        _empty(work)
        return lock, None
    try:
        work.mkdir(parents=True)
    except FileExistsError:     # made a moment ago by another prepare of the same output
        raise UserError(f"-o {shown(out)}: another prepare is writing it ({shown(work)} appeared meanwhile)") from None
    return _lock(work / LOCK, out), None


def _check_own_folder(work: Path, out: Path) -> None:
    """The hidden folder holds only files prepare writes there: it is then prepare's to empty."""
    with os.scandir(work) as entries:
        for entry in entries:
            if not OWN_NAMES.fullmatch(entry.name) or not entry.is_file(follow_symlinks=False):
                raise UserError(f"{shown(work)}: holds {shown(entry.name)}, which prepare does not write there; this "
                                f"is where prepare writes -o {shown(out)}: move the folder away or remove it")


def _empty(work: Path) -> None:
    """Removes prepare's files from its hidden folder, but for the lock this prepare holds."""
    with os.scandir(work) as entries:
        for entry in entries:
            if entry.name != LOCK:
                os.unlink(entry.path)


def _lock(path: Path, out: Path) -> BinaryIO:
    handle = open(path, "ab")
    try:
        import fcntl
    except ImportError:         # no advisory locks here (Windows): a second prepare is not kept out
        return handle
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise UserError(f"-o {shown(out)}: another prepare is writing it ({shown(path.parent)} is locked)") from None
    return handle


def _read_progress(path: Path) -> Optional[Progress]:
    """An interrupted prepare's record, if it is one (checked: names, counts and kinds prepare writes)."""
    try:       # strict JSON first: pydantic's reader keeps the last of a key given twice
        return Progress.model_validate(parse_json(read_regular_file(path, MAX_PROGRESS_BYTES), shown(path)))
    except (UserError, ValidationError):
        return None


def _record(work: Path, progress: Progress) -> None:
    """Writes the progress record atomically, once what it describes is on disk."""
    _sync(work)
    staged = work / f"{PROGRESS}.new"
    staged.write_text(progress.model_dump_json(), encoding="utf-8")
    with open(staged, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(staged, work / PROGRESS)


def _sync(folder: Path) -> None:
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                with open(entry.path, "rb") as handle:
                    os.fsync(handle.fileno())


def _recorded_vocabulary(work: Path, progress: Progress) -> Vocab:
    """The vocabulary an interrupted prepare wrote, if it is the one its record names."""
    try:
        proto = read_regular_file(work / VOCAB_FILE, MAX_VOCAB_BYTES)
        if hashlib.sha256(proto).hexdigest() != progress.vocabulary:
            raise _StartOver(f"{VOCAB_FILE} is not the vocabulary it records")
        return Vocab.from_bytes(proto, shown(work / VOCAB_FILE))
    except UserError as error:
        raise _StartOver(str(error)) from None


def _check_progress(work: Path, state: Union["TextState", "PairsState"], kind: str, dtype: np.dtype,
                    pieces: int) -> dict[str, "hashlib._Hash"]:
    """Checks an interrupted prepare's record against the files it describes, reading what it says was
    written (format.py's checks of a prepared directory, on the files so far); returns the SHA-256 so far of
    each file that is continued (the open shards, the offsets)."""
    if isinstance(state, TextState) != (kind == "text"):
        raise _StartOver(f"it records {'text' if isinstance(state, TextState) else 'sentence pairs'}, not {kind}")
    if isinstance(state, TextState):
        streams = {"tokens": (state.tokens, "documents.bin", state.documents)}
        longest = {"tokens": state.longest}
    else:
        streams = {name: (side.ids, f"{name}.bin", side.offsets)
                   for name, side in (("source", state.source), ("target", state.target))}
        longest = state.longest
    if set(longest) != set(streams):
        raise _StartOver("its longest examples are not those of its streams")
    digests: dict[str, "hashlib._Hash"] = {}
    for name, (shards, index, count) in streams.items():
        _check_shards_state(name, shards, dtype)
        if count != state.examples + 1:
            raise _StartOver(f"it records {count - 1:,} examples in {index} but {state.examples:,} in all")
        try:
            digests.update(_scan_written(work, name, shards, index, count, dtype, pieces, longest[name]))
        except UserError as error:
            raise _StartOver(str(error)) from None
    return digests


def _check_shards_state(name: str, shards: ShardsState, dtype: np.dtype) -> None:
    """A stream's names and counts are those prepare writes: its own shards, each but the last full."""
    if any(not shard.startswith(f"{name}-") for shard in shards.names):
        raise _StartOver(f"its {name} stream is written in other files ({shown(shards.names[0])})")
    finished = [shards.records[shard].bytes for shard in shards.names[:-1]]
    if any(size != SHARD_TOKENS * dtype.itemsize for size in finished) or bool(shards.names) != bool(shards.in_shard) \
            or len(finished) * SHARD_TOKENS + shards.in_shard != shards.length:
        raise _StartOver(f"the length of its {name} stream, {shards.length:,} ids, is not what its shards hold")


def _scan_written(work: Path, name: str, shards: ShardsState, index: str, count: int, dtype: np.dtype,
                  pieces: int, longest: int) -> dict[str, "hashlib._Hash"]:
    """Reads the shards and offsets of stream `name` up to where the record says (UserError where they do not
    match it); returns the SHA-256 of the open shard's and the offsets' part that is kept."""
    kept: dict[str, "hashlib._Hash"] = {}
    size = count * OFFSET.itemsize
    path = work / index
    text = name == "tokens"
    kept[index] = hashlib.sha256()
    largest = scan_offsets(path, blocks(_at_least(path, size), path, OFFSET, kept[index], limit=size), count,
                           shards.length - 1 if text else shards.length, least=1 if text else 0)
    if (largest - 1 if text and count > 1 else largest) != longest:
        raise UserError(f"{shown(path)}: its longest example is not the {longest:,} ids the record says")
    ends = (Taken(blocks(_at_least(path, size), path, OFFSET, limit=size)), path) if text else None
    scan_ids(name, _written_ids(work, shards, dtype, kept), pieces, ends)
    return kept


def _written_ids(work: Path, shards: ShardsState, dtype: np.dtype,
                 kept: dict[str, "hashlib._Hash"]) -> Iterator[tuple[Path, int, np.ndarray]]:
    """The ids of a stream's shards, up to where the record says (the finished shards' hashes checked); the
    open shard's SHA-256 into `kept`."""
    for k, shard in enumerate(shards.names):
        path, at, digest = work / shard, 0, hashlib.sha256()
        finished = k < len(shards.names) - 1
        size = shards.records[shard].bytes if finished else shards.in_shard * dtype.itemsize
        handle = _at_least(path, size)
        if finished and os.fstat(handle.fileno()).st_size != size:
            handle.close()
            raise UserError(f"{shown(path)}: not the {size:,} bytes the record says")
        for chunk in blocks(handle, path, dtype, digest, limit=size):
            yield path, at, chunk
            at += len(chunk)
        if not finished:
            kept[shard] = digest
        elif digest.hexdigest() != shards.records[shard].sha256:
            raise UserError(f"{shown(path)}: not the shard the record hashed")


def _at_least(path: Path, size: int) -> BinaryIO:
    """`path` open to read, if it holds at least `size` bytes."""
    handle = open_regular_file(path)
    if os.fstat(handle.fileno()).st_size < size:
        handle.close()
        raise UserError(f"{shown(path)}: holds less than the record says was written")
    return handle


# --- the vocabulary ------------------------------------------------------------------------------

def _vocabulary(read: Callable, text_of: Callable, work: Path, options: PrepareOptions,
                say: Callable[[str], None]) -> tuple[Vocab, str]:
    if options.vocab_file is not None:
        vocab = Vocab.load(options.vocab_file)
        (work / VOCAB_FILE).write_bytes(vocab.model_proto)
        return vocab, f"given: {Path(options.vocab_file).resolve()}"
    # sentencepiece skips longer sentences when it trains: holding them would only cost memory. So the
    # sample holds at most vocab_sample x SAMPLED_LINE_BYTES bytes, whatever --max-line-bytes allows.
    trainable = (line for line in text_of(read(Skips())) if len(line) <= SAMPLED_LINE_BYTES and
                 len(line.encode("utf-8")) <= SAMPLED_LINE_BYTES)
    sample, seen = _reservoir(trainable, options.vocab_sample)
    if not sample:
        return _no_text(read)
    say(f"training the vocabulary ({options.vocab_size:,} pieces, {options.vocab_model}) on "
        f"{len(sample):,} of {seen:,} lines short enough to train on")
    vocab = train_vocab(sample, options.vocab_size, options.vocab_model, work, setting="--vocab-size")
    return vocab, f"trained on {len(sample):,} of {seen:,} lines of the sources short enough to train on"


def _no_text(read: Callable):
    skips = Skips()
    for _ in read(skips):
        pass
    raise UserError(f"no text to prepare ({skips.describe()})")


def _reservoir(lines: Iterable[str], size: int) -> tuple[list[str], int]:
    """A uniform sample of at most `size` of `lines` (Algorithm R, seeded: the same input gives the same
    sample), and how many lines there were."""
    rng, sample, seen = random.Random(0), list[str](), 0
    for seen, line in enumerate(lines, start=1):
        if len(sample) < size:
            sample.append(line)
        else:
            j = rng.randrange(seen)
            if j < size:
                sample[j] = line
    return sample, seen


# --- tokenizing ----------------------------------------------------------------------------------

def _encode(items: Iterable, vocab: Vocab, kind: str, options: PrepareOptions) -> Iterator[tuple]:
    """Chunks of encoded lines, in order: (ids, lengths) for text; two of them for sentence pairs. With
    several workers, at most two chunks a worker are in flight."""
    chunks = _chunks(items, CHUNK_LINES)
    bar = _bar(options.progress)
    if options.workers <= 1:
        _init_worker(vocab.model_proto)
        for chunk in chunks:
            yield _encode_chunk((kind, chunk))
            bar(len(chunk))
        return
    context = multiprocessing.get_context("spawn")      # no forked copy of whatever the parent holds
    with context.Pool(options.workers, initializer=_init_worker, initargs=(vocab.model_proto,)) as pool:
        pending: deque = deque()
        for chunk in chunks:
            pending.append((len(chunk), pool.apply_async(_encode_chunk, ((kind, chunk),))))
            if len(pending) >= 2 * options.workers:
                count, result = pending.popleft()
                yield result.get()
                bar(count)
        while pending:
            count, result = pending.popleft()
            yield result.get()
            bar(count)


def _bar(enabled: bool) -> Callable[[int], None]:
    if not enabled or not sys.stderr.isatty():
        return lambda lines: None
    from tqdm import tqdm

    bar = tqdm(unit=" lines", unit_scale=True, file=sys.stderr, desc="tokenizing")
    return bar.update


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


_PROCESSOR: Optional["spm.SentencePieceProcessor"] = None     # a worker's, loaded once (_init_worker)


def _init_worker(model_proto: bytes) -> None:
    import sentencepiece as spm

    global _PROCESSOR
    _PROCESSOR = spm.SentencePieceProcessor(model_proto=model_proto)


def _encode_chunk(task: tuple[str, list]) -> tuple:
    kind, chunk = task
    assert _PROCESSOR is not None, "the worker's vocabulary is loaded by its initializer"
    if kind == "text":
        return _flat(_PROCESSOR.encode(chunk))
    sources, targets = _PROCESSOR.encode([s for s, _ in chunk]), _PROCESSOR.encode([t for _, t in chunk])
    return _flat(sources), _flat(targets)


def _flat(encoded: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
    ids = np.fromiter((i for row in encoded for i in row), dtype=np.uint32, count=int(lengths.sum()))
    return ids, lengths


# --- writing -------------------------------------------------------------------------------------

class _Shards:
    """One stream of ids into files PREFIX-NNNNN.bin of at most SHARD_TOKENS ids, hashed as written. From a
    checkpoint's `state` (checked: _check_progress) and the SHA-256 of its open shard so far, it goes on
    where that left off (what was written after it is cut off)."""

    def __init__(self, folder: Path, prefix: str, dtype: np.dtype, state: Optional[ShardsState] = None,
                 written: Optional[dict[str, "hashlib._Hash"]] = None) -> None:
        self.folder, self.prefix, self.dtype = folder, prefix, dtype
        self.names: list[str] = []
        self.records: dict[str, FileRecord] = {}
        self.length = 0
        self._handle: Optional[BinaryIO] = None
        self._digest: Optional["hashlib._Hash"] = None
        self._in_shard = 0
        if state is not None:
            self.names, self.length, self._in_shard = list(state.names), state.length, state.in_shard
            self.records = dict(state.records)
            for stale in folder.glob(f"{prefix}-*.bin"):        # begun after the checkpoint
                if stale.name not in self.names:
                    stale.unlink()
            if self.names:
                last = self.names[-1]
                self._handle = _reopen(folder / last, self._in_shard * dtype.itemsize)
                self._digest = (written or {})[last]

    def write(self, ids: np.ndarray) -> None:
        ids = ids.astype(self.dtype, copy=False)
        while len(ids):
            if self._handle is None or self._in_shard == SHARD_TOKENS:
                self._next()
            room = SHARD_TOKENS - self._in_shard
            piece, ids = ids[:room], ids[room:]
            data = piece.tobytes()
            assert self._handle is not None and self._digest is not None
            self._handle.write(data)
            self._digest.update(data)
            self._in_shard += len(piece)
            self.length += len(piece)

    def checkpoint(self) -> ShardsState:
        """What a resume needs (the open shard flushed)."""
        if self._handle is not None:
            self._handle.flush()
        return ShardsState(names=list(self.names), length=self.length, in_shard=self._in_shard,
                           records=dict(self.records))

    def _next(self) -> None:
        self._finish()
        name = f"{self.prefix}-{len(self.names):05d}.bin"
        self.names.append(name)
        self._handle, self._digest, self._in_shard = open(self.folder / name, "wb"), hashlib.sha256(), 0

    def _finish(self) -> None:
        if self._handle is not None and self._digest is not None:
            self._handle.close()
            name = self.names[-1]
            self.records[name] = FileRecord(bytes=self._in_shard * self.dtype.itemsize, sha256=self._digest.hexdigest())
            self._handle = None

    def close(self) -> dict[str, FileRecord]:
        if not self.names:
            self._next()                    # an empty stream still has its (empty) shard
        self._finish()
        return self.records


class _Offsets:
    """int64 offsets into one file, appended chunk by chunk, hashed as written; from a checkpoint's
    count (checked) and the SHA-256 of the offsets so far, appended after that many."""

    def __init__(self, path: Path, first: int, count: Optional[int] = None,
                 written: Optional[dict[str, "hashlib._Hash"]] = None) -> None:
        self.path = path
        self._handle: BinaryIO
        if count is None:
            self._handle, self._digest, self.count = open(path, "wb"), hashlib.sha256(), 0
            self.write(np.array([first], dtype=np.int64))
        else:
            self._handle, self._digest = _reopen(path, count * OFFSET.itemsize), (written or {})[path.name]
            self.count = count

    def checkpoint(self) -> int:
        self._handle.flush()
        return self.count

    def write(self, values: np.ndarray) -> None:
        data = values.astype(OFFSET, copy=False).tobytes()
        self._handle.write(data)
        self._digest.update(data)
        self.count += len(values)

    def close(self) -> FileRecord:
        self._handle.close()
        return FileRecord(bytes=self.count * OFFSET.itemsize, sha256=self._digest.hexdigest())


class _TextWriter:
    """Documents as one stream EOS d1 EOS d2 ... EOS; the offsets are the positions of their EOSes."""

    def __init__(self, folder: Path, dtype: np.dtype, state: Optional[Union[TextState, PairsState]] = None,
                 written: Optional[dict[str, "hashlib._Hash"]] = None) -> None:
        assert state is None or isinstance(state, TextState), "checked by _check_progress"
        self.tokens = _Shards(folder, "tokens", dtype, state.tokens if state else None, written)
        if state is None:
            self.tokens.write(np.array([EOS]))
        self.offsets = _Offsets(folder / "documents.bin", 0, state.documents if state else None, written)
        self.examples, self._longest = (state.examples, state.longest) if state else (0, 0)

    def checkpoint(self) -> TextState:
        return TextState(tokens=self.tokens.checkpoint(), documents=self.offsets.checkpoint(),
                         examples=self.examples, longest=self._longest)

    def add(self, encoded: tuple[np.ndarray, np.ndarray]) -> None:
        ids, lengths = encoded
        if not len(lengths):
            return
        ends = np.cumsum(lengths + 1)                           # one past each document's EOS, in the chunk
        chunk = np.empty(int(ends[-1]), dtype=np.int64)
        eos = ends - 1
        chunk[eos] = EOS
        keep = np.ones(len(chunk), dtype=bool)
        keep[eos] = False
        chunk[keep] = ids
        base = self.tokens.length
        self.tokens.write(chunk)
        self.offsets.write(base + eos)
        self.examples += len(lengths)
        self._longest = max(self._longest, int(lengths.max()))

    def close(self) -> dict[str, FileRecord]:
        records: dict[str, FileRecord] = dict(self.tokens.close())
        records["documents.bin"] = self.offsets.close()
        self.streams, self.offset_files = {"tokens": self.tokens.names}, {"documents": "documents.bin"}
        self.tokens_count = {"tokens": self.tokens.length}
        self.longest = {"tokens": self._longest}
        return records


class _ParallelWriter:
    """The two sides' ids, sentence after sentence, and where each sentence starts."""

    def __init__(self, folder: Path, dtype: np.dtype, state: Optional[Union[TextState, PairsState]] = None,
                 written: Optional[dict[str, "hashlib._Hash"]] = None) -> None:
        assert state is None or isinstance(state, PairsState), "checked by _check_progress"
        sides = {"source": state.source, "target": state.target} if state else {}
        self.sides = {name: (_Shards(folder, name, dtype, sides[name].ids if state else None, written),
                             _Offsets(folder / f"{name}.bin", 0, sides[name].offsets if state else None, written))
                      for name in ("source", "target")}
        self.examples = state.examples if state else 0
        self._longest = {"source": 0, "target": 0, **(state.longest if state else {})}

    def checkpoint(self) -> PairsState:
        sides = {name: SideState(ids=shards.checkpoint(), offsets=offsets.checkpoint())
                 for name, (shards, offsets) in self.sides.items()}
        return PairsState(source=sides["source"], target=sides["target"], examples=self.examples,
                          longest=dict(self._longest))

    def add(self, encoded: tuple) -> None:
        for name, (ids, lengths) in zip(("source", "target"), encoded):
            shards, offsets = self.sides[name]
            base = shards.length
            shards.write(ids)
            offsets.write(base + np.cumsum(lengths))
            if len(lengths):
                self._longest[name] = max(self._longest[name], int(lengths.max()))
        self.examples += len(encoded[0][1])

    def close(self) -> dict[str, FileRecord]:
        records: dict[str, FileRecord] = {}
        for name, (shards, offsets) in self.sides.items():
            records.update(shards.close())
            records[f"{name}.bin"] = offsets.close()
        self.streams = {name: shards.names for name, (shards, _) in self.sides.items()}
        self.offset_files = {name: f"{name}.bin" for name in self.sides}
        self.tokens_count = {name: shards.length for name, (shards, _) in self.sides.items()}
        self.longest = dict(self._longest)
        return records


def _reopen(path: Path, size: int) -> BinaryIO:
    """`path` cut to its first `size` bytes (what a checkpoint recorded, checked: _check_progress), open to
    append."""
    with open(path, "r+b") as handle:
        handle.truncate(size)
    return open(path, "ab")
