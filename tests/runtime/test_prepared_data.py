"""Prepared data: `xspec data prepare` into token shards and back, the window order (a permutation per
epoch, independent of the number of ranks), training on prepared data with exact resume, mixtures, and
every bad directory refused by name before training starts."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest

from xspec.cli import main
from xspec.base.errors import UserError
from xspec.runtime.data_order import Permutation, sequence_slice
from xspec.runtime.demo_data import generate_split
from xspec.runtime.loop import Progress, Trainer
from xspec.runtime.prepared import examples as prepared_examples
from xspec.runtime.prepared import prepare as prepare_module
from xspec.runtime.prepared.examples import Mixture, PreparedPairs, PreparedText, parse_data_argument
from xspec.runtime.prepared.format import MANIFEST, file_sha256, open_prepared
from xspec.runtime.prepared.prepare import PrepareOptions, prepare_parallel, prepare_text
from xspec.runtime.run_dir import read_metrics_log
from xspec.runtime.vocab import EOS, Vocab

ROOT = Path(__file__).resolve().parents[2]
LM = str(ROOT / "specs" / "lm.xspec")
TINY = str(ROOT / "specs" / "tiny.xspec")
SMALL_LM = ["--set", "d_model=32", "--set", "d_ff=64", "--set", "heads=2", "--set", "layers=1", "--set", "vocab=200",
            "--set", "train.batch_tokens=256", "--set", "data.block_size=16", "--set", "train.warmup_steps=10",
            "--set", "train.validate_every_steps=5", "--set", "train.checkpoint_every_steps=5"]
OPTIONS = PrepareOptions(vocab_size=120, vocab_sample=10_000)


def _run(*argv: str) -> tuple[int, str]:
    """The command's exit status and what it printed (its messages, then its errors)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """The demo pairs as a language model's text and a translation corpus, with lines to skip."""
    d = tmp_path_factory.mktemp("texts")
    pairs = generate_split("train", 600)
    source = [s for s, _ in pairs]
    (d / "a.txt").write_bytes(("\n".join(source[:300]) + "\n\n" + "x" * 5000 + "\n").encode() +
                              b"caf\xe9 au lait\n" + ("\n".join(source[300:]) + "\n").encode())
    (d / "train.src").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (d / "train.tgt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    (d / "valid.txt").write_text("".join(s + "\n" for s, _ in generate_split("valid", 30)), encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def text_dir(texts, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "text"
    prepare_text([texts / "a.txt"], out, PrepareOptions(vocab_size=120, max_line_bytes=4096, workers=2),
                 say=lambda line: None)
    return out


@pytest.fixture(scope="module")
def pairs_dir(texts, text_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "pairs"
    options = PrepareOptions(vocab_file=text_dir / "sentencepiece.model")
    prepare_parallel(texts / "train.src", texts / "train.tgt", out, options, say=lambda line: None)
    return out


# --- prepare and read back ---------------------------------------------------------------------------

def test_prepared_text_reads_back_as_the_text_encoded_directly_and_says_what_it_skipped(texts, text_dir):
    prepared = open_prepared(text_dir)
    manifest = prepared.manifest
    vocab = Vocab(prepared.vocab_proto)
    kept = [line.strip() for line in (texts / "a.txt").read_bytes().decode("utf-8", "replace").split("\n")
            if line.strip() and "x" * 100 not in line and "\ufffd" not in line]
    assert manifest.examples == len(kept) == 600 and manifest.dtype == "uint16"
    stream, offsets = prepared.streams["tokens"], prepared.offsets["documents"]
    expected = vocab.encode(kept)
    for k in (0, 1, 299, 300, 599):
        assert stream.read(int(offsets[k]), int(offsets[k + 1]) + 1).tolist() == [EOS, *expected[k], EOS]
    assert len(stream) == sum(len(ids) + 1 for ids in expected) + 1
    assert manifest.longest["tokens"] == max(len(ids) for ids in expected)
    skipped = manifest.skipped
    assert (skipped.empty, skipped.too_long, skipped.invalid_utf8) == (1, 1, 1)
    assert skipped.where == [f"{texts / 'a.txt'}:302: longer than 4,096 bytes",
                             f"{texts / 'a.txt'}:303: invalid UTF-8 (byte 0xe9 at column 4)"]
    assert manifest.sources[0].sha256 == file_sha256(texts / "a.txt")
    counts = PreparedText(prepared, "blocks", 16, truncate=False).token_counts()      # the unigram baseline's
    predicted = [i for ids in expected for i in (*ids, EOS)]
    assert counts.tolist() == np.bincount(predicted, minlength=len(counts)).tolist()


def test_prepared_pairs_read_back_aligned(texts, pairs_dir):
    prepared = open_prepared(pairs_dir)
    vocab = Vocab(prepared.vocab_proto)
    pairs = generate_split("train", 600)
    examples = PreparedPairs(prepared, max_tokens=256, truncate=False)
    sources, targets = examples.pairs([0, 17, 599])
    for row, (i, (s, t)) in enumerate(zip((0, 17, 599), (pairs[0], pairs[17], pairs[599]))):
        assert sources[row] == vocab.encode([s])[0] + [EOS] and targets[row] == vocab.encode([t])[0]
    assert "given:" in prepared.manifest.vocabulary.origin


def test_a_vocabulary_beyond_uint16_stores_uint32_ids(texts, tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "UINT16_PIECES", 50)
    out = tmp_path / "wide"
    prepare_text([texts / "valid.txt"], out, OPTIONS, say=lambda line: None)
    prepared = open_prepared(out)
    assert prepared.manifest.dtype == "uint32" and prepared.streams["tokens"].shards[0].dtype == np.dtype("<u4")
    vocab = Vocab(prepared.vocab_proto)
    first = (texts / "valid.txt").read_text().split("\n")[0]
    offsets = prepared.offsets["documents"]
    assert prepared.streams["tokens"].read(1, int(offsets[1])).tolist() == vocab.encode([first])[0]


def test_the_vocabulary_sample_holds_only_lines_sentencepiece_trains_on(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "SAMPLED_LINE_BYTES", 100)
    lines = [s for s, _ in generate_split("valid", 40)] + ["y" * 150]
    short = sum(len(line.encode()) <= 100 for line in lines)
    assert 0 < short < len(lines) - 1                                          # some demo lines are long too
    text = tmp_path / "t.txt"
    text.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    manifest = prepare_text([text], tmp_path / "out", OPTIONS, say=lambda line: None)
    assert manifest.examples == 41                                             # every line is prepared
    assert manifest.vocabulary.origin.startswith(f"trained on {short} of {short} lines")


def test_prepare_never_leaves_a_half_written_directory(texts, tmp_path, monkeypatch):
    out = tmp_path / "out"

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module._TextWriter, "close", fail)
    with pytest.raises(KeyboardInterrupt):
        prepare_text([texts / "valid.txt"], out, OPTIONS, say=lambda line: None)
    assert [p.name for p in tmp_path.iterdir()] == [".out.partial"]      # hidden, and kept for a resume
    monkeypatch.undo()
    prepare_text([texts / "valid.txt"], out, OPTIONS, say=lambda line: None)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and not (out / "progress.json").exists()
    with pytest.raises(UserError, match="already exists"):
        prepare_text([texts / "valid.txt"], out, OPTIONS, say=lambda line: None)


def _interrupted(prepare: Callable[[Path], object], out: Path, after_chunks: int, monkeypatch) -> None:
    """Runs `prepare` into `out`, interrupted (as by Ctrl-C) when it has written `after_chunks` chunks, each
    chunk's progress recorded."""
    monkeypatch.setattr(prepare_module, "CHUNK_LINES", 16)
    monkeypatch.setattr(prepare_module, "CHECKPOINT_SECONDS", 0.0)
    for writer in (prepare_module._TextWriter, prepare_module._ParallelWriter):
        def add(self, encoded, original=writer.add):
            self.chunks = getattr(self, "chunks", 0) + 1
            if self.chunks > after_chunks:
                original(self, encoded)             # written, but not recorded: cut off on resume
                raise KeyboardInterrupt
            original(self, encoded)

        monkeypatch.setattr(writer, "add", add)
    with pytest.raises(KeyboardInterrupt):
        prepare(out)
    monkeypatch.undo()
    monkeypatch.setattr(prepare_module, "CHUNK_LINES", 16)


@pytest.mark.parametrize("kind", ["text", "parallel"])
def test_an_interrupted_prepare_resumes_to_the_directory_an_uninterrupted_one_writes(kind, texts, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setattr(prepare_module, "SHARD_TOKENS", 500)    # several shards, one of them open when cut off
    options = PrepareOptions(vocab_size=120, vocab_sample=10_000, max_line_bytes=4096)
    if kind == "text":
        def prepare(out: Path):
            return prepare_text([texts / "a.txt", texts / "valid.txt"], out, options, say=said.append)
    else:
        def prepare(out: Path):
            return prepare_parallel(texts / "train.src", texts / "train.tgt", out, options, say=said.append)
    said: list[str] = []
    monkeypatch.setattr(prepare_module, "CHUNK_LINES", 16)
    whole = prepare(tmp_path / "whole")
    monkeypatch.undo()
    monkeypatch.setattr(prepare_module, "SHARD_TOKENS", 500)
    _interrupted(prepare, tmp_path / "resumed", after_chunks=7, monkeypatch=monkeypatch)
    monkeypatch.setattr(prepare_module, "SHARD_TOKENS", 500)
    said.clear()
    resumed = prepare(tmp_path / "resumed")
    assert f"resuming an interrupted prepare after its first {7 * 16:,}" in said[0]
    assert resumed.model_dump(exclude={"created"}) == whole.model_dump(exclude={"created"})
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "resumed").iterdir())
    for name in set(names) - {MANIFEST}:     # the manifests differ only in the time (compared above)
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "resumed" / name).read_bytes(), name
    open_prepared(tmp_path / "resumed")


def test_a_prepare_of_changed_inputs_starts_over(texts, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes((texts / "a.txt").read_bytes())
    said: list[str] = []

    def prepare(out: Path):
        return prepare_text([corpus], out, OPTIONS, say=said.append)

    _interrupted(prepare, tmp_path / "out", after_chunks=3, monkeypatch=monkeypatch)
    corpus.write_bytes((texts / "a.txt").read_bytes() + b"one more line\n")
    said.clear()
    manifest = prepare(tmp_path / "out")
    assert not any("resuming" in line for line in said)
    assert manifest.sources[0].bytes == corpus.stat().st_size


def test_a_progress_record_naming_other_files_is_not_followed(texts, tmp_path, monkeypatch):
    """The record is read as untrusted: names outside the shards prepare writes mean starting over."""
    said: list[str] = []

    def prepare(out: Path):
        return prepare_text([texts / "a.txt"], out, OPTIONS, say=said.append)

    _interrupted(prepare, tmp_path / "out", after_chunks=3, monkeypatch=monkeypatch)
    record = tmp_path / ".out.partial" / "progress.json"
    bystander = tmp_path / "bystander.bin"
    bystander.write_bytes(b"keep me")
    progress = json.loads(record.read_text())
    progress["writer"]["tokens"]["names"] = ["../bystander.bin"]
    record.write_text(json.dumps(progress))
    said.clear()
    prepare(tmp_path / "out")
    assert not any("resuming" in line for line in said) and bystander.read_bytes() == b"keep me"


def test_a_progress_record_of_another_stream_or_length_is_not_resumed(texts, tmp_path, monkeypatch):
    """A record that disagrees with the files it describes means starting over, with a note
    (tests/runtime/test_prepared_hostile.py has a case of each kind)."""
    said: list[str] = []

    def prepare(out: Path):
        return prepare_text([texts / "a.txt"], out, OPTIONS, say=said.append)

    for field, value, reason in (("names", ["source-00000.bin"], "its tokens stream is written in other files"),
                                 ("length", 1, "the length of its tokens stream, 1 ids, is not what its shards hold")):
        _interrupted(prepare, tmp_path / field, after_chunks=3, monkeypatch=monkeypatch)
        record = tmp_path / f".{field}.partial" / "progress.json"
        progress = json.loads(record.read_text())
        progress["writer"]["tokens"][field] = value
        record.write_text(json.dumps(progress))
        said.clear()
        prepare(tmp_path / field)
        assert said[0].startswith(f"{tmp_path / field}: the interrupted prepare's record does not match what it "
                                  f"describes ({reason}")
        assert not (tmp_path / f".{field}.partial").exists() and open_prepared(tmp_path / field).manifest.examples


def test_a_second_prepare_of_the_same_output_is_kept_out_while_one_runs(texts, tmp_path):
    work = tmp_path / ".out.partial"
    work.mkdir()
    held = prepare_module._lock(work / prepare_module.LOCK, tmp_path / "out")
    try:
        with pytest.raises(UserError, match="another prepare is writing it"):
            prepare_text([texts / "valid.txt"], tmp_path / "out", OPTIONS, say=lambda line: None)
    finally:
        held.close()
    prepare_text([texts / "valid.txt"], tmp_path / "out", OPTIONS, say=lambda line: None)


def test_the_prepare_command_checks_its_inputs(texts, tmp_path):
    assert _run("data", "prepare", "--src", str(texts / "train.src"), "-o", str(tmp_path / "o"))[1] == \
        "xspec: error: --src and --tgt go together (only one was given)\n"
    code, err = _run("data", "prepare", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "o"))
    assert code == 1 and err == f"xspec: error: {tmp_path / 'missing.txt'}: no such file\n"
    code, err = _run("data", "prepare", str(texts / "valid.txt"), "--src", "a", "--tgt", "b", "-o", str(tmp_path / "o"))
    assert code == 1 and "not both" in err
    (tmp_path / "a.src").write_text("one\ntwo\n")
    (tmp_path / "a.tgt").write_text("one\n")
    code, err = _run("data", "prepare", "--src", str(tmp_path / "a.src"), "--tgt", str(tmp_path / "a.tgt"),
                     "--vocab-size", "8", "--workers", "1", "-o", str(tmp_path / "o"))
    assert code == 1 and "must be aligned line by line" in err and not (tmp_path / "o").exists()


# --- bad directories -----------------------------------------------------------------------------------

def _copy(source: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(source, tmp_path / "copy"))


def _rewrite_manifest(directory: Path, change) -> None:
    manifest = json.loads((directory / MANIFEST).read_text())
    change(manifest)
    (directory / MANIFEST).write_text(json.dumps(manifest))


def test_a_corrupt_shard_is_named(text_dir, tmp_path):
    d = _copy(text_dir, tmp_path)
    shard = d / "tokens-00000.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match=f"{shard}: corrupt"):
        open_prepared(d)
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(UserError, match=f"{shard}: .* bytes, but its manifest says .*truncated"):
        open_prepared(d)


def test_an_index_that_does_not_match_its_shards_is_named(text_dir, tmp_path):
    d = _copy(text_dir, tmp_path)
    index = d / "documents.bin"
    offsets = np.fromfile(index, dtype="<i8")
    offsets[-1] -= 1
    offsets.tofile(index)
    _rewrite_manifest(d, lambda m: m["files"]["documents.bin"].update(sha256=file_sha256(index)))
    with pytest.raises(UserError, match=f"{index}: the index does not match its shards"):
        open_prepared(d)


def test_ids_beyond_the_vocabulary_and_newer_formats_are_refused(text_dir, tmp_path):
    d = _copy(text_dir, tmp_path)
    shard = d / "tokens-00000.bin"
    ids = np.fromfile(shard, dtype="<u2")
    ids[5] = 5000
    ids.tofile(shard)
    _rewrite_manifest(d, lambda m: m["files"]["tokens-00000.bin"].update(sha256=file_sha256(shard)))
    with pytest.raises(UserError,
                       match="holds id 5000 at or near position 5 of this shard, beyond the vocabulary.s 120 pieces"):
        open_prepared(d)
    _rewrite_manifest(d, lambda m: m.update(version=2))
    with pytest.raises(UserError, match=r"prepared by a newer xspec \(format version 2\)"):
        open_prepared(d)


def test_prepared_data_of_another_vocabulary_than_the_runs_is_refused(texts, text_dir, tmp_path):
    other = tmp_path / "other"
    prepare_text([texts / "valid.txt"], other, PrepareOptions(vocab_size=60), say=lambda line: None)
    code, err = _run("train", LM, *SMALL_LM, "--data", str(text_dir), "--vocab", str(other / "sentencepiece.model"),
                     "--no-test", "-o", str(tmp_path / "run"))
    assert code == 1 and "not the vocabulary the prepared data was made with" in err, err
    code, err = _run("train", LM, *SMALL_LM, "--data", f"{text_dir},{other}", "--no-test", "-o", str(tmp_path / "r2"))
    assert code == 1 and f"{other / MANIFEST}: prepared with another vocabulary than {text_dir}" in err, err
    code, err = _run("train", LM, *SMALL_LM, "--set", "vocab=100", "--data", str(text_dir), "--no-test",
                     "-o", str(tmp_path / "r4"))
    assert code == 1 and f"{text_dir / 'sentencepiece.model'}: the prepared data's vocabulary has 120 pieces, " \
        "but the model's embedding has 100 rows; prepare it with --vocab-size <= 100" in err, err
    code, err = _run("train", TINY, "--data", str(text_dir), "--no-test", "-o", str(tmp_path / "r3"))
    assert code == 1 and "a language model's text, but the model is a translation model" in err, err
    vocab = text_dir / "sentencepiece.model"          # 120 pieces, given as a vocabulary of the user's
    code, err = _run("train", LM, *SMALL_LM, "--set", "vocab=100", "--train", str(texts / "valid.txt"), "--vocab",
                     str(vocab), "--no-test", "-o", str(tmp_path / "r5"))
    assert code == 1 and err.endswith(f"--vocab {vocab}: 120 pieces, but the model's embedding has 100 rows; give "
                                      "one of at most 100 pieces, or --set vocab=120\n"), err


# --- the order ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4099])
def test_each_epoch_is_a_permutation_and_epochs_differ(n):
    first = Permutation(n, "0", 0)(np.arange(n))
    assert sorted(first.tolist()) == list(range(n))
    if n > 10:
        assert first.tolist() != Permutation(n, "0", 1)(np.arange(n)).tolist()
        assert first.tolist() != list(range(n))


def test_the_sequence_runs_epoch_after_epoch():
    ids, epoch = sequence_slice(10, 8, 14, "3")
    assert epoch == 0
    assert ids[:2].tolist() == Permutation(10, "3", 0)(np.arange(8, 10)).tolist()
    assert sorted(ids[2:12].tolist()) == list(range(10))                 # the whole of epoch 1
    assert ids[12:].tolist() == Permutation(10, "3", 2)(np.arange(2)).tolist()


def _planned(examples, progress: Progress, world_size: int, updates: int, batch_tokens: int = 256):
    """The first `updates` planned from `progress` as a process of `world_size` plans them."""
    trainer = SimpleNamespace(spec=SimpleNamespace(train=SimpleNamespace(update_parts=None, batch_tokens=batch_tokens,
                                                                         seed=7)),
                              context=SimpleNamespace(world_size=world_size), progress=progress, examples=examples)
    out = []
    for window, index, parts, update in Trainer.planned_updates(trainer):
        out.append((window.number, index, parts, sorted(window.global_ids([i for b in update for i in b]))))
        if len(out) == updates:
            return out


def test_a_run_resumed_on_another_number_of_ranks_continues_the_same_examples(text_dir, monkeypatch):
    monkeypatch.setattr(prepared_examples, "WINDOW", 100)
    examples = PreparedText(open_prepared(text_dir), "blocks", 16, truncate=False)
    uninterrupted = _planned(examples, Progress(), world_size=2, updates=40)
    assert len({w for w, *_ in uninterrupted}) >= 3                    # several windows
    stop = next(k for k, u in enumerate(uninterrupted) if u[0] == 1) + 2      # two updates into the second window
    window, index, parts, _ = uninterrupted[stop - 1]
    resumed = _planned(examples, Progress(window=window, update=index + 1, parts=parts), world_size=1,
                       updates=40 - stop)
    same_window = [r for r in resumed if r[0] == window]
    assert len(same_window) >= 2
    assert [r[3] for r in same_window] == [u[3] for u in uninterrupted[stop:stop + len(same_window)]]
    assert all(r[2] == 2 for r in same_window) and all(r[2] == 1 for r in resumed[len(same_window):])
    # later windows hold the same examples, planned for one rank
    later = [w for w, *_ in resumed[len(same_window):]]
    complete = ({w for w, *_ in uninterrupted} - {uninterrupted[-1][0]}) & (set(later) - {later[-1]})
    assert complete
    for w in complete:
        assert sorted(i for r in resumed if r[0] == w for i in r[3]) == \
            sorted(i for u in uninterrupted if u[0] == w for i in u[3])


def test_a_mixture_takes_each_corpus_by_weight(text_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(prepared_examples, "WINDOW", 200)
    a = PreparedText(open_prepared(text_dir), "blocks", 16, truncate=False)
    b = PreparedText(open_prepared(text_dir), "lines", 64, truncate=True)
    mixture = Mixture([(a, 0.7), (b, 0.3)])
    window = mixture.window(3, seed=1)
    counts = np.bincount(window.source_of)
    assert counts.tolist() == [140, 60]
    assert (window.ids[window.source_of == 1] >= a.count).all()
    batch = mixture.collate(window.ids[:4].tolist() + window.ids[-2:].tolist())
    assert batch.inputs[0].shape[0] == 6
    assert parse_data_argument("x:0.7,y:0.3") == [(Path("x"), 0.7), (Path("y"), 0.3)]
    with pytest.raises(UserError, match="a weight is a positive number"):
        parse_data_argument("x:0,y:1")


# --- training -----------------------------------------------------------------------------------------

def _losses(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics_log(run) if "loss" in r]


def test_training_on_prepared_text_resumes_with_exactly_the_same_batches(texts, text_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(prepared_examples, "WINDOW", 64)             # several windows in 14 steps
    common = ["train", LM, *SMALL_LM, "--data", str(text_dir), "--valid", str(texts / "valid.txt"), "--no-test",
              "--no-tensorboard"]
    assert _run(*common, "--set", "train.max_steps=14", "-o", str(tmp_path / "whole"))[0] == 0
    code, err = _run(*common, "--set", "train.max_steps=7", "-o", str(tmp_path / "part"))
    assert code == 0 and "prepared" in err and "windows of 64" in err, err
    assert _run("train", "--resume", str(tmp_path / "part"), "--set", "train.max_steps=14", "--no-test",
                "--no-tensorboard")[0] == 0
    assert _losses(tmp_path / "whole") == _losses(tmp_path / "part")
    assert len(_losses(tmp_path / "whole")) == 14
    record = json.loads((tmp_path / "part" / "run.json").read_text())
    assert record["data"]["train"] == {"prepared": [str(text_dir)], "weights": [1.0]}


def test_a_mixture_trains_and_reports_its_realised_shares(texts, text_dir, pairs_dir, tmp_path):
    second = tmp_path / "second"
    prepare_text([texts / "valid.txt"], second, PrepareOptions(vocab_file=text_dir / "sentencepiece.model"),
                 say=lambda line: None)
    code, err = _run("train", LM, *SMALL_LM, "--data", f"{text_dir}:0.75,{second}:0.25", "--no-test",
                     "--no-tensorboard", "--set", "train.max_steps=10", "-o", str(tmp_path / "mix"))
    assert code == 0, err
    line = next(line for line in err.splitlines() if "data mixture" in line)
    shares = [float(part.split()[-1]) for part in line.split("%")[:-1]]     # "... DIR 74.2% (weight 75.0%), ..."
    assert abs(shares[0] - 75) < 12 and abs(shares[2] - 25) < 12, line     # ten updates' sample of a window


def test_translation_trains_on_a_prepared_corpus(pairs_dir, tmp_path):
    code, err = _run("train", TINY, "--data", str(pairs_dir), "--valid", str(pairs_dir), "--no-test",
                     "--no-tensorboard", "--set", "train.max_steps=2", "--set", "train.batch_tokens=500",
                     "--set", "train.validate_every_steps=2", "-o", str(tmp_path / "mt"))
    assert code == 0, err
    assert "600 sentence pairs" in err and read_metrics_log(tmp_path / "mt")[-1].get("valid_loss") is not None
    code, out = _run("show", str(tmp_path / "mt"))        # it read the prepared split's `src`: AttributeError
    assert code == 0 and f"data        train: {pairs_dir}\n" in out, out


def test_a_large_plain_text_file_is_sent_to_prepare(texts, tmp_path, monkeypatch):
    from xspec.runtime import tasks

    monkeypatch.setattr(tasks, "PLAIN_TEXT_LIMIT_BYTES", 1000)
    monkeypatch.setattr(tasks, "PLAIN_TEXT_NOTE_BYTES", 100)
    code, err = _run("train", LM, *SMALL_LM, "--train", str(texts / "a.txt"), "--no-test", "-o", str(tmp_path / "r"))
    assert code == 1 and f"prepare it once (xspec data prepare {texts / 'a.txt'} -o DIR)" in err, err


def test_a_plain_text_file_worth_preparing_is_noted_once(tmp_path, monkeypatch):
    from xspec.runtime import tasks

    monkeypatch.setattr(tasks, "PLAIN_TEXT_NOTE_BYTES", 100)
    text = tmp_path / "text.txt"
    text.write_text("".join(source + "\n" for source, _ in generate_split("train", 300)))
    code, out = _run("train", LM, *SMALL_LM, "--train", str(text), "--set", "train.max_steps=1",
                     "--no-test", "--no-tensorboard", "-o", str(tmp_path / "r"))
    assert code == 0, out
    assert out.count(f"note: {text}: ") == 1 and f"xspec data prepare {text} -o DIR" in out


def _two_processes(*argv: str) -> None:
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "-m", "xspec", *argv], env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                            text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_run_of_two_processes_resumed_on_one_continues_with_the_same_examples(texts, text_dir, tmp_path):
    """Two processes plan each update in two parts; resumed on one process, the run finishes the window in
    that plan, so its losses are those of the two processes' uninterrupted run (up to summation order)."""
    common = ["train", LM, *SMALL_LM, "--set", "dropout=0", "--data", str(text_dir), "--no-test", "--no-tensorboard",
              "--no-progress", "--device", "cpu"]
    _two_processes(*common, "--set", "train.max_steps=8", "-o", str(tmp_path / "whole"))
    _two_processes(*common, "--set", "train.max_steps=4", "-o", str(tmp_path / "part"))
    code, err = _run("train", "--resume", str(tmp_path / "part"), "--set", "train.max_steps=8", "--no-test",
                     "--no-tensorboard", "--no-progress", "--device", "cpu")
    assert code == 0, err
    whole, part = _losses(tmp_path / "whole"), _losses(tmp_path / "part")
    assert [s for s, _ in whole] == [s for s, _ in part] == list(range(1, 9))
    assert [loss for _, loss in part] == pytest.approx([loss for _, loss in whole], rel=2e-4)
