"""`xspec data prepare`: text files into a prepared data directory (runtime/prepared/format.py).

Two passes over the input, each a stream (memory bounded whatever its size):
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
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
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
from xspec.runtime.prepared.format import (FORMAT, MANIFEST, OFFSET, SHARD_TOKENS, VERSION, VOCAB_FILE, FileRecord,
                                           Manifest, Skipped, SourceRecord, VocabularyRecord)
from xspec.runtime.prepared.lines import Digest, Skips, aligned_lines, text_lines
from xspec.runtime.vocab import EOS, Vocab, train_vocab

if TYPE_CHECKING:
    import sentencepiece as spm

CHUNK_LINES = 4096                  # lines a worker tokenizes at a time
SAMPLED_LINE_BYTES = 4192          # sentencepiece's max_sentence_length: longer lines do not train it
UINT16_PIECES = 1 << 16             # vocabularies up to this size store ids as uint16, larger ones as uint32
PARTIAL = ".partial"                # the hidden folder: .NAME.partial
PROGRESS = "progress.json"          # in it: what has been written, for a resume
LOCK = ".lock"                      # in it: held while a prepare writes there
CHECKPOINT_SECONDS = 30.0           # how often progress is recorded (each record flushes the files to disk)


@dataclass(frozen=True)
class PrepareOptions:
    vocab_size: int = 37000
    vocab_model: str = "bpe"
    vocab_file: Optional[Path] = None   # a sentencepiece model to use instead of training one
    vocab_sample: int = 1_000_000       # lines the vocabulary is trained on at most
    max_line_bytes: int = 1 << 20
    workers: int = 1
    progress: bool = False
    command: str = ""


def prepare_text(files: list[Path], out: Path, options: PrepareOptions,
                 say: Callable[[str], None] = print) -> Manifest:
    """A language model's documents, one a line, from `files` (in order) into `out`."""
    def lines(skips: Skips, digests: Optional[dict] = None) -> Iterator[str]:
        return text_lines(files, options.max_line_bytes, skips, digests)

    return _prepare("text", files, lines, lambda pairs: pairs, out, options, say)


def prepare_parallel(source: Path, target: Path, out: Path, options: PrepareOptions,
                     say: Callable[[str], None] = print) -> Manifest:
    """A translation corpus, two line-aligned files, into `out`."""
    def pairs(skips: Skips, digests: Optional[dict] = None) -> Iterator[tuple[str, str]]:
        return aligned_lines(source, target, options.max_line_bytes, skips, digests)

    def sides(items: Iterable[tuple[str, str]]) -> Iterator[str]:
        for s, t in items:
            yield s
            yield t

    return _prepare("parallel", [source, target], pairs, sides, out, options, say)


def _prepare(kind: str, files: list[Path], read: Callable, text_of: Callable, out: Path, options: PrepareOptions,
             say: Callable[[str], None]) -> Manifest:
    out = Path(out)
    if out.exists():
        raise UserError(f"-o {out}: already exists; choose another folder or remove it (a prepared directory is "
                        "written whole, never over another)")
    started = time.time()
    fingerprint = _fingerprint(kind, files, options)
    work = out.parent / f".{out.name}{PARTIAL}"
    lock, progress = _claim(work, fingerprint, out)
    unit = "documents" if kind == "text" else "sentence pairs"
    try:
        if progress is None:
            vocab, origin = _vocabulary(read, text_of, work, options, say)
            progress = Progress(fingerprint=fingerprint, origin=origin)
            _record(work, progress)
        else:
            vocab, origin = Vocab.load(work / VOCAB_FILE), progress.origin
            say(f"{out}: resuming an interrupted prepare after its first "
                f"{progress.writer.examples if progress.writer else 0:,} {unit}")
        dtype = np.dtype("<u2" if len(vocab) <= UINT16_PIECES else "<u4")
        skips, digests = Skips(), dict[Path, Digest]()
        writer = _TextWriter(work, dtype, progress.writer) if kind == "text" else \
            _ParallelWriter(work, dtype, progress.writer)
        items = read(skips, digests)
        for _ in range(writer.examples):        # written before the interruption: read for the hashes only
            next(items)
        recorded = time.monotonic()
        for encoded in _encode(items, vocab, kind, options):
            writer.add(encoded)
            if time.monotonic() - recorded >= CHECKPOINT_SECONDS:
                _record(work, progress.model_copy(update={"writer": writer.checkpoint()}))
                recorded = time.monotonic()
        if not writer.examples:
            raise UserError(f"{', '.join(map(str, files))}: no text to prepare ({skips.describe()})")
        files_written = writer.close()
        files_written[VOCAB_FILE] = None
        manifest = Manifest(
            format=FORMAT, version=VERSION, kind=kind, dtype="uint16" if dtype.itemsize == 2 else "uint32",
            vocabulary=VocabularyRecord(pieces=len(vocab), sha256=hashlib.sha256(vocab.model_proto).hexdigest(),
                                        origin=origin),
            streams=writer.streams, offsets=writer.offset_files,
            files={name: record for name, record in files_written.items() if record is not None},
            examples=writer.examples, tokens=writer.tokens_count, longest=writer.longest,
            sources=[SourceRecord(path=str(Path(f).resolve()), bytes=digests[f].bytes,
                                  sha256=digests[f].sha256.hexdigest())
                     for f in files],
            skipped=Skipped(empty=skips.empty, too_long=skips.too_long, invalid_utf8=skips.invalid_utf8,
                            where=skips.where),
            command=options.command, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        (work / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
        for name in (PROGRESS, f"{PROGRESS}.new", LOCK):     # the resume's own files
            (work / name).unlink(missing_ok=True)
        _sync(work)
        os.rename(work, out)
    except UserError:
        shutil.rmtree(work, ignore_errors=True)     # the input is at fault: nothing to resume
        raise
    except BaseException:
        say(f"{out}: interrupted; the same command resumes it")
        raise
    finally:
        if lock is not None:
            lock.close()
    seconds = time.time() - started
    read_bytes = sum(s.bytes for s in manifest.sources)
    say(f"{out}: {manifest.examples:,} {unit}, "
        f"{' + '.join(f'{n:,}' for n in manifest.tokens.values())} tokens ({manifest.dtype}), vocabulary "
        f"{len(vocab):,}; {skips.describe()}; {read_bytes / 1e6:,.1f} MB in {seconds:.1f} s "
        f"({read_bytes / 1e6 / max(seconds, 1e-9):.1f} MB/s, "
        f"{options.workers} worker{'s' if options.workers > 1 else ''})")
    return manifest


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
    writer: Optional[Union[TextState, PairsState]] = None


def _fingerprint(kind: str, files: list[Path], options: PrepareOptions) -> dict[str, Any]:
    """What makes a prepared directory what it is: its inputs as they are now (path, size, modification
    time), the vocabulary's settings or file, and the line limit. Workers and messages do not count."""
    def stamp(path: Path) -> list:
        status = path.stat()
        return [str(path.resolve()), status.st_size, status.st_mtime_ns]

    return {"format": [FORMAT, VERSION, SHARD_TOKENS], "kind": kind, "inputs": [stamp(Path(f)) for f in files],
            "vocabulary": (stamp(Path(options.vocab_file)) if options.vocab_file is not None
                           else [options.vocab_size, options.vocab_model, options.vocab_sample]),
            "max_line_bytes": options.max_line_bytes}


def _claim(work: Path, fingerprint: dict, out: Path) -> tuple[Optional[BinaryIO], Optional[Progress]]:
    """The hidden folder, locked for this prepare: an interrupted one's progress where it prepared the same
    inputs with the same options, else a new folder (a leftover of other inputs removed)."""
    lock = None
    if work.is_dir() and not work.is_symlink():
        lock = _lock(work / LOCK, out)
        progress = _read_progress(work / PROGRESS)
        if progress is not None and progress.fingerprint == fingerprint and (work / VOCAB_FILE).is_file():
            return lock, progress
        lock.close()
        shutil.rmtree(work, ignore_errors=True)
    elif work.exists() or work.is_symlink():
        work.unlink()
    try:
        work.mkdir(parents=True)
    except FileExistsError:     # made a moment ago by another prepare of the same output
        raise UserError(f"-o {out}: another prepare is writing it ({work} appeared meanwhile)") from None
    return _lock(work / LOCK, out), None


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
        raise UserError(f"-o {out}: another prepare is writing it ({path.parent} is locked)") from None
    return handle


def _read_progress(path: Path) -> Optional[Progress]:
    """An interrupted prepare's record, if it is one (checked: names, counts and kinds prepare writes)."""
    try:
        return Progress.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
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
    for path in folder.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


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
    checkpoint's `state`, it goes on where that left off (what was written after it is cut off)."""

    def __init__(self, folder: Path, prefix: str, dtype: np.dtype, state: Optional[ShardsState] = None) -> None:
        self.folder, self.prefix, self.dtype = folder, prefix, dtype
        self.names: list[str] = []
        self.records: dict[str, FileRecord] = {}
        self.length = 0
        self._handle: Optional[BinaryIO] = None
        self._digest: Optional["hashlib._Hash"] = None
        self._in_shard = 0
        if state is not None:
            written = sum(record.bytes for record in state.records.values()) // dtype.itemsize + state.in_shard
            if any(not name.startswith(f"{prefix}-") for name in state.names) or written != state.length:
                raise UserError(f"{folder}: its progress record does not describe the {prefix} stream it wrote; "
                                "it is removed, and the same command prepares the data from the start")
            self.names, self.length, self._in_shard = list(state.names), state.length, state.in_shard
            self.records = dict(state.records)
            for stale in folder.glob(f"{prefix}-*.bin"):        # begun after the checkpoint
                if stale.name not in self.names:
                    stale.unlink()
            if self.names:
                self._handle, self._digest = _reopen(folder / self.names[-1], self._in_shard * dtype.itemsize)

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
    count, appended after that many."""

    def __init__(self, path: Path, first: int, count: Optional[int] = None) -> None:
        self.path = path
        if count is None:
            self._handle, self._digest, self.count = open(path, "wb"), hashlib.sha256(), 0
            self.write(np.array([first], dtype=np.int64))
        else:
            self._handle, self._digest = _reopen(path, count * OFFSET.itemsize)
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

    def __init__(self, folder: Path, dtype: np.dtype, state: Optional[Union[TextState, PairsState]] = None) -> None:
        if state is not None and not isinstance(state, TextState):
            raise UserError(f"{folder}: its progress record is of sentence pairs, not text")
        self.tokens = _Shards(folder, "tokens", dtype, state.tokens if state else None)
        if state is None:
            self.tokens.write(np.array([EOS]))
        self.offsets = _Offsets(folder / "documents.bin", 0, state.documents if state else None)
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

    def close(self) -> dict[str, Optional[FileRecord]]:
        records: dict = dict(self.tokens.close())
        records["documents.bin"] = self.offsets.close()
        self.streams, self.offset_files = {"tokens": self.tokens.names}, {"documents": "documents.bin"}
        self.tokens_count = {"tokens": self.tokens.length}
        self.longest = {"tokens": self._longest}
        return records


class _ParallelWriter:
    """The two sides' ids, sentence after sentence, and where each sentence starts."""

    def __init__(self, folder: Path, dtype: np.dtype, state: Optional[Union[TextState, PairsState]] = None) -> None:
        if state is not None and not isinstance(state, PairsState):
            raise UserError(f"{folder}: its progress record is of text, not sentence pairs")
        sides = {"source": state.source, "target": state.target} if state else {}
        self.sides = {name: (_Shards(folder, name, dtype, sides[name].ids if state else None),
                             _Offsets(folder / f"{name}.bin", 0, sides[name].offsets if state else None))
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

    def close(self) -> dict[str, Optional[FileRecord]]:
        records: dict = {}
        for name, (shards, offsets) in self.sides.items():
            records.update(shards.close())
            records[f"{name}.bin"] = offsets.close()
        self.streams = {name: shards.names for name, (shards, _) in self.sides.items()}
        self.offset_files = {name: f"{name}.bin" for name in self.sides}
        self.tokens_count = {name: shards.length for name, (shards, _) in self.sides.items()}
        self.longest = dict(self._longest)
        return records


def _reopen(path: Path, size: int) -> tuple[BinaryIO, "hashlib._Hash"]:
    """`path` cut to its first `size` bytes (what a checkpoint recorded), open to append, and the hash of
    those bytes."""
    if not path.is_file() or path.stat().st_size < size:   # not what the checkpoint saw written: start over
        raise UserError(f"{path}: holds less than its interrupted prepare recorded; it is removed, and the same "
                        "command prepares the data from the start")
    with open(path, "r+b") as handle:
        handle.truncate(size)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return open(path, "ab"), digest
