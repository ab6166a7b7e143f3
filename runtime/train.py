"""Training any compiled spec with the paper's recipe (§5), then scoring the test split (§6.1).

The flow of `train()`: check the run (on resume: the recorded data and the checkpoint's model) ->
data -> shared vocabulary -> model, Adam and the eq. 3 schedule (or the last checkpoint's state) ->
only then write the run's spec.xspec and run.json -> token-count batches -> updates with gradient
accumulation, periodic validation and checkpoints until a limit, Ctrl-C or a non-finite loss stops
them (recorded in run.json) -> beam search on the test split -> BLEU.
Nothing here depends on the architecture: the model is whatever `spec.build()` returns.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from xspec.errors import UserError
from xspec.files import write_atomically
from xspec.runtime import checkpoint as ckpt
from xspec.runtime import distributed
from xspec.runtime.batching import collate, micro_batches, plan_epoch, shard
from xspec.runtime.corpus import EncodedPairs, ParallelText, encode_pairs, read_parallel
from xspec.runtime.demo_data import write_demo_data
from xspec.runtime.evaluate import Scores, score
from xspec.runtime.run_dir import (DATA_DIR, METRICS_LOG, TEST_OUTPUT, DataFiles, RunRecord, Split, append_metrics,
                                   read_metrics_log, read_run_record, rewrite_metrics_log, write_final_metrics,
                                   write_run_files, write_run_record)
from xspec.runtime.schedule import make_optimizer, make_scheduler
from xspec.runtime.translation import Translator
from xspec.runtime.vocab import PAD, Vocab, load_or_train_vocab


class Interrupted(UserError):
    """Ctrl-C (or SIGTERM): a checkpoint was written, the run can be resumed."""

    exit_code = 130


@dataclass(frozen=True)
class RunOptions:
    out_dir: Path
    data: DataFiles                     # splits not given are None (on --resume: as the run recorded them)
    device: str | None = None
    compile: str = "auto"               # auto | on | off
    resume: bool = False
    # Truncate over-long training sentences instead of skipping them; None: not said (a fresh run
    # skips them, a resumed one does as it did before).
    truncate: bool | None = None
    progress: bool = True
    evaluate: bool = True               # decode the test split at the end


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint for exact resumption."""

    step: int = 0
    epoch: int = 0
    update: int = 0                     # next update of the epoch's plan
    train_tokens: int = 0
    train_seconds: float = 0.0
    last_checkpoint: Path | None = None

    def state(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "update": self.update,
                "train_tokens": self.train_tokens, "train_seconds": self.train_seconds}

    @classmethod
    def from_state(cls, state: dict, path: Path) -> "Progress":
        """The progress record of a training state file, checked: counts and a duration, none negative."""
        counts = ("step", "epoch", "update", "train_tokens")
        seconds = state.get("train_seconds")
        if set(state) != {*counts, "train_seconds"} or not all(_is_count(state[k]) for k in counts) or \
                isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
                not 0 <= seconds < math.inf:
            raise UserError(f"{path}: unusable training state (progress: expected {', '.join(counts)} as "
                            "whole numbers and train_seconds, none negative)")
        return cls(**{k: state[k] for k in counts}, train_seconds=float(seconds))


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass
class Corpus:
    train: EncodedPairs
    valid: EncodedPairs | None
    test_src: list[str] = field(default_factory=list)
    test_ref: list[str] = field(default_factory=list)


def train(spec, options: RunOptions) -> dict:
    """Trains `spec` (a compiled spec: `xspec.compile(...)`) into `options.out_dir`; returns the final figures."""
    if not spec.has_encoder:
        raise UserError(f"{spec.name}: xspec train translates, and this spec has no encoder "
                        "(a decoder-only model); use an encoder-decoder spec")
    context = distributed.setup(options.device)
    try:
        return _train(spec, options, context)
    finally:
        distributed.teardown(context)


def _train(spec, options: RunOptions, context: distributed.Context) -> dict:
    """Everything that can be refused is checked before the run directory's spec.xspec and run.json
    are (re)written, so a failed command leaves a run as it was."""
    started = time.time()
    run_dir, cfg = options.out_dir, spec.train
    say = print if context.is_main else (lambda *a, **k: None)
    existing = ckpt.list_checkpoints(run_dir)
    if existing and not options.resume:
        raise UserError(f"{run_dir} already holds checkpoints: continue it with --resume {run_dir}, "
                        "or choose another --out")
    if options.resume and not existing:
        raise UserError(f"--resume {run_dir}: no checkpoints in {run_dir / ckpt.CHECKPOINT_DIR}")
    record = _resumed_record(run_dir, options) if options.resume else \
        RunRecord(options.data, truncate=bool(options.truncate))
    resumed = _same_model_checkpoint(existing[-1], spec) if options.resume else None

    if record.data.train is None:
        record = replace(record, data=_demo_files(run_dir, context))
    data = record.data
    texts = _read_texts(data)              # every file checked before any work is done
    vocab = _vocab(spec, texts["train"], run_dir, context)
    corpus = _encode_corpus(spec, texts, vocab, bool(record.truncate))
    say(corpus.train.summary(f"train ({data.train.src.name}, {data.train.tgt.name})"))
    if corpus.valid is not None:
        say(corpus.valid.summary("valid"))

    torch.manual_seed(torch_seed(cfg.seed))
    model = spec.build(device=str(context.device))
    optimizer = make_optimizer(model.parameters(), cfg)
    scheduler = make_scheduler(optimizer, cfg, spec.model_dim)
    progress = _resume(resumed, model, optimizer, scheduler) if resumed is not None else Progress()
    if context.is_main:
        write_run_files(run_dir, spec.resolved_source, record)
        _start_metrics_log(run_dir, progress.step if options.resume else None)
    if resumed is not None:
        say(f"resuming {run_dir} at step {progress.step}")
    say(f"{spec.name}: {spec.parameters:,} parameters, vocabulary {len(vocab)}, device {context.device}"
        + (f", {context.world_size} processes" if context.distributed else ""))
    if context.device.type == "cpu" and "malloc" not in os.environ.get("LD_PRELOAD", ""):
        say("note: CPU training runs several times faster with tcmalloc: "
            "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 (Debian: libtcmalloc-minimal4)")
    # `model` stays the plain module (checkpoints, validation, decoding); updates run through the
    # DDP wrapper and/or torch.compile, which share its parameters.
    step_model = model
    if context.distributed:
        device_ids = [context.device] if context.device.type == "cuda" else None
        step_model = DistributedDataParallel(model, device_ids=device_ids)
    if _use_compile(options.compile, context.device):
        step_model = torch.compile(step_model)

    run = _Run(spec, run_dir, record, context, options)
    with _stop_on_signals() as stop_requested:
        reason = _loop(run, model, step_model, optimizer, scheduler, corpus, vocab, progress, stop_requested)
    stopped = _stop_record(reason, progress)
    say(_stop_line(reason, progress, cfg))
    _record_stop(run, stopped)

    valid_loss = _validate(model, corpus.valid, spec, context) if corpus.valid is not None else None
    if progress.last_checkpoint is None or _checkpoint_step(progress.last_checkpoint) != progress.step:
        _save_checkpoint(spec, model, optimizer, scheduler, vocab, progress, run_dir, context)
    if not context.is_main:
        return {}
    metrics = {"steps": progress.step, "valid_loss": valid_loss,
               "train_tokens_per_s": round(progress.train_tokens / max(progress.train_seconds, 1e-9), 1),
               "train_seconds": round(progress.train_seconds, 1), "stopped": stopped}
    if options.evaluate and corpus.test_src:
        scores = _test(model, vocab, spec, corpus, context, run_dir, options.progress)
        metrics.update(bleu=round(scores.bleu, 2), chrf=round(scores.chrf, 2), bleu_signature=scores.bleu_line,
                       chrf_signature=scores.chrf_line)
    metrics["wall_s"] = round(time.time() - started, 1)
    write_final_metrics(run_dir, metrics)
    say(f"run directory: {run_dir}  (steps {progress.step}, valid loss {valid_loss}, "
        f"{metrics['train_tokens_per_s']} target tokens/s, {metrics['wall_s']} s)")
    if "bleu" in metrics:
        say(metrics["chrf_signature"])
        say(metrics["bleu_signature"])
    return metrics


@dataclass(frozen=True)
class _Run:
    """What the training loop needs to know about the run besides the model and the data."""

    spec: object
    run_dir: Path
    record: RunRecord
    context: distributed.Context
    options: RunOptions


def torch_seed(value: int) -> int:
    """A seed `torch.manual_seed` accepts, whatever integer the spec gives: the same value for
    seeds in [0, 2**63), the rest reduced into that range."""
    return value % 2**63


# --- the run record: what a resumed run must keep --------------------------------------------------

def _resumed_record(run_dir: Path, options: RunOptions) -> RunRecord:
    """run.json as recorded; data files or --truncate given now must be what the run was started with."""
    recorded = read_run_record(run_dir)
    for name, given in options.data.splits().items():
        was = recorded.data.splits()[name]
        if given is not None and (was is None or (given.src.resolve(), given.tgt.resolve()) !=
                                  (was.src.resolve(), was.tgt.resolve())):
            raise UserError(f"--resume {run_dir}: this run was started {_describe_split(name, was, run_dir)}; "
                            f"resuming with {given.src}, {given.tgt} would change the {_ROLES[name]}")
    if options.truncate is not None and recorded.truncate is not None and options.truncate != recorded.truncate:
        raise UserError(f"--resume {run_dir}: this run was started {'with' if recorded.truncate else 'without'} "
                        f"--truncate; resuming {'with' if options.truncate else 'without'} it would change "
                        "the training data")
    truncate = recorded.truncate if recorded.truncate is not None else bool(options.truncate)
    return RunRecord(recorded.data, truncate)


_ROLES = {"train": "training data", "valid": "validation data", "test": "test data"}


def _describe_split(name: str, split: Split | None, run_dir: Path) -> str:
    if split is None:
        return f"without {name} files"
    if name == "train" and split.src.resolve().parent == (run_dir / DATA_DIR).resolve():
        return "on the built-in demo task"
    return f"with {name} files {split.src}, {split.tgt}"


def _same_model_checkpoint(path: Path, spec) -> ckpt.Checkpoint:
    """The checkpoint to resume from; its model parameters must be the spec's (section settings
    such as train.max_steps may change)."""
    saved = ckpt.load_weights(path)
    difference = ckpt.params_difference(model_params(saved.params), model_params(spec.params))
    if difference:
        raise UserError(f"{path}: a checkpoint from a different spec ({difference})")
    return saved


def _start_metrics_log(run_dir: Path, resumed_step: int | None) -> None:
    """A fresh run starts a fresh log (an earlier attempt may have left lines but no checkpoint);
    a resumed one drops the steps logged after its checkpoint, which it will redo."""
    if resumed_step is None:
        (run_dir / METRICS_LOG).unlink(missing_ok=True)
    else:
        rewrite_metrics_log(run_dir, [r for r in read_metrics_log(run_dir) if r.get("step", 0) <= resumed_step])


def _stop_record(reason: str, progress: Progress) -> dict:
    return {"reason": reason, "step": progress.step, "train_seconds": round(progress.train_seconds, 1)}


def _record_stop(run: _Run, stopped: dict) -> None:
    """Why the run stopped, in run.json (and, for a run that finishes, in metrics.json)."""
    if run.context.is_main:
        write_run_record(run.run_dir, replace(run.record, stopped=stopped))


def _stop_line(reason: str, progress: Progress, cfg) -> str:
    if reason == "max_steps":
        return f"stopped at step {progress.step}: reached train.max_steps = {cfg.max_steps}"
    return (f"stopped at step {progress.step}: reached train.max_minutes = {cfg.max_minutes:g} "
            f"({progress.train_seconds:.0f} s of training, counted over resumptions)")


# --- data --------------------------------------------------------------------------------------

def _demo_files(run_dir: Path, context: distributed.Context) -> DataFiles:
    """The built-in task, generated into the run directory (deterministic, so every rank agrees)."""
    if context.is_main:
        write_demo_data(run_dir / DATA_DIR)
    distributed.barrier(context)
    d = run_dir / DATA_DIR
    return DataFiles(*(Split(d / f"{s}.src", d / f"{s}.tgt") for s in ("train", "valid", "test")))


def _vocab(spec, train: ParallelText, run_dir: Path, context: distributed.Context) -> Vocab:
    """§5.1: one vocabulary for source and target, trained on the training data by rank 0."""
    if context.is_main:
        vocab = load_or_train_vocab(run_dir, itertools.chain(train.source, train.target), spec.data.vocab_size,
                                    spec.data.vocab_model)
    distributed.barrier(context)
    if not context.is_main:
        vocab = Vocab.load(run_dir / "sentencepiece.model")
    if len(vocab) > spec.vocab_size:
        raise UserError(f"{run_dir / 'sentencepiece.model'}: {len(vocab)} pieces, but the model's embedding "
                        f"has {spec.vocab_size} rows; set data.vocab_size <= {spec.vocab_size}")
    return vocab


def max_sequence_tokens(spec) -> int:
    """The longest sequence the run feeds the model: the data section's limit, within the positions."""
    return min(spec.data.max_tokens, spec.max_positions or spec.data.max_tokens)


def _read_texts(data: DataFiles) -> dict[str, ParallelText]:
    texts = {"train": read_parallel(data.train.src, data.train.tgt)}
    for name, split in (("valid", data.valid), ("test", data.test)):
        if split is not None:
            texts[name] = read_parallel(split.src, split.tgt)
    return texts


def _encode_corpus(spec, texts: dict[str, ParallelText], vocab: Vocab, truncate: bool) -> Corpus:
    limit = max_sequence_tokens(spec)
    train = encode_pairs(texts["train"], vocab, limit, truncate)
    if not len(train):
        raise UserError(f"{texts['train'].source_path}: every sentence is longer than {limit} tokens; "
                        "raise data.max_tokens or pass --truncate")
    # Validation loss covers every sentence (truncated if need be); BLEU uses the test split, or the
    # validation split when there is no test split.
    valid = encode_pairs(texts["valid"], vocab, limit, truncate=True) if "valid" in texts else None
    corpus = Corpus(train, valid)
    test = texts.get("test", texts.get("valid"))
    if test is not None:
        corpus.test_src, corpus.test_ref = test.source, test.target
    return corpus


# --- training ----------------------------------------------------------------------------------

def _use_compile(choice: str, device: torch.device) -> bool:
    """auto: on for CUDA; off on CPU, where a compiled step measured slower than eager (docs/runtime.md)."""
    return choice == "on" or (choice == "auto" and device.type == "cuda")


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def _loop(run: _Run, model, step_model, optimizer, scheduler, corpus: Corpus, vocab: Vocab, progress: Progress,
          stop_requested) -> str:
    """Updates until a limit is reached; returns which ("max_steps" or "max_minutes"). Ctrl-C and a
    non-finite loss record why the run stopped, then raise."""
    spec, context = run.spec, run.context
    cfg = spec.train
    src_lens = [len(s) for s in corpus.train.source]
    tgt_lens = [len(t) for t in corpus.train.target]
    batches = micro_batches(src_lens, tgt_lens, cfg.max_batch_tokens or cfg.batch_tokens)
    bar = tqdm(total=cfg.max_steps, initial=progress.step, disable=not (context.is_main and run.options.progress),
               dynamic_ncols=True, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
    last_checkpoint_time = time.time()
    plan, planned_epoch = [], None
    # A resumed run may be past its limits already (train.max_minutes counts over resumptions).
    reason = _limit_reached(progress, cfg)
    while reason is None:
        if planned_epoch != progress.epoch:
            plan = plan_epoch(batches, tgt_lens, cfg.batch_tokens, cfg.seed, progress.epoch)
            planned_epoch = progress.epoch
        if progress.update >= len(plan):
            progress.epoch += 1
            progress.update = 0
            continue
        update = plan[progress.update]
        step_started = time.time()
        tokens = sum(tgt_lens[i] + 1 for b in update for i in b)
        # dropout: seeded from (seed, step, rank), so a resumed run replays exactly
        torch.manual_seed(torch_seed((cfg.seed * 1_000_003 + progress.step) * 1_009 + context.rank))
        optimizer.zero_grad(set_to_none=True)
        loss_sum = _accumulate(step_model, update, corpus.train, tokens, spec, context)
        over_time = cfg.max_minutes is not None and \
            progress.train_seconds + time.time() - step_started >= cfg.max_minutes * 60
        # Every rank must take the same decision, so the flags are summed over ranks.
        loss_sum, interrupted, over_time = distributed.all_sum(
            context, [loss_sum, float(stop_requested()), float(over_time)])
        loss = loss_sum / tokens
        if not math.isfinite(loss):
            bar.close()
            _diverged(run, progress, loss)
        if cfg.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        progress.step += 1
        progress.update += 1
        progress.train_tokens += tokens
        elapsed = time.time() - step_started
        progress.train_seconds += elapsed
        if context.is_main:
            append_metrics(run.run_dir, {"step": progress.step, "loss": round(loss, 5), "lr": lr,
                                         "target_tokens": tokens, "tokens_per_s": round(tokens / elapsed, 1)})
            bar.set_postfix_str(f"loss={loss:.3f} lr={lr:.2e} tok/s={tokens / elapsed:,.0f} "
                                f"eta={_eta(progress, cfg)}", refresh=False)
            bar.update(1)
        if progress.step % cfg.validate_every_steps == 0 and corpus.valid is not None:
            valid_loss = _validate(model, corpus.valid, spec, context)
            if context.is_main:
                append_metrics(run.run_dir, {"step": progress.step, "valid_loss": valid_loss})
                bar.write(f"step {progress.step}: valid loss {valid_loss:.4f} (ppl {math.exp(valid_loss):.2f})")
        reason = "max_steps" if progress.step >= cfg.max_steps else "max_minutes" if over_time else None
        due_steps = cfg.checkpoint_every_steps and progress.step % cfg.checkpoint_every_steps == 0
        due_minutes = cfg.checkpoint_every_minutes and \
            time.time() - last_checkpoint_time >= cfg.checkpoint_every_minutes * 60
        if interrupted or over_time or due_steps or due_minutes:
            _save_checkpoint(spec, model, optimizer, scheduler, vocab, progress, run.run_dir, context)
            last_checkpoint_time = time.time()
        if interrupted:
            bar.close()
            _record_stop(run, _stop_record("interrupted", progress))
            raise Interrupted(f"interrupted at step {progress.step}; checkpoint {progress.last_checkpoint} "
                              f"written; continue with: xspec train --resume {run.run_dir}")
    bar.close()
    return reason


def _limit_reached(progress: Progress, cfg) -> str | None:
    if progress.step >= cfg.max_steps:
        return "max_steps"
    if cfg.max_minutes is not None and progress.train_seconds >= cfg.max_minutes * 60:
        return "max_minutes"
    return None


def _accumulate(model, update: list[list[int]], data: EncodedPairs, tokens: int, spec,
                context: distributed.Context) -> float:
    """Forward/backward over this rank's micro-batches of one update; returns its summed token loss.

    The loss is normalised by the update's target tokens over all ranks (§5.1 counts tokens per
    batch); DDP averages gradients over ranks, so each rank scales by world_size to get the sum back.
    """
    passes = shard(update, context.rank, context.world_size)
    total = torch.zeros((), device=context.device)
    for i, (indices, counts) in enumerate(passes):
        batch = collate(indices, data.source, data.target).to(context.device)
        last = i == len(passes) - 1
        with (nullcontext() if last or not context.distributed else model.no_sync()):
            with _autocast(context.device):
                logits = model(batch.src, batch.tgt_in, batch.src_padding)          # [B, T, V]
            # §5.4: label smoothing eps_ls; padding positions are ignored.
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch.labels.flatten(), ignore_index=PAD,
                                   label_smoothing=spec.train.label_smoothing, reduction="sum")
            weight = context.world_size / tokens if counts else 0.0
            (loss * weight).backward()
        if counts:
            total += loss.detach()
    return float(total)


def _eta(progress: Progress, cfg) -> str:
    per_step = progress.train_seconds / max(progress.step, 1)
    left = (cfg.max_steps - progress.step) * per_step
    if cfg.max_minutes is not None:
        left = min(left, cfg.max_minutes * 60 - progress.train_seconds)
    left = max(int(left), 0)
    return f"{left // 60:d}:{left % 60:02d}"


def _diverged(run: _Run, progress: Progress, loss: float) -> None:
    kept = f"the last good checkpoint is {progress.last_checkpoint}" if progress.last_checkpoint \
        else f"no checkpoint was written yet in {run.run_dir}"
    _record_stop(run, {**_stop_record("diverged", progress), "loss": str(loss)})
    raise UserError(f"the training loss became {loss} at step {progress.step + 1}; stopped without updating "
                    f"the model ({kept}); try a lower learning rate or train.clip_norm")


@torch.no_grad()
def _validate(model, valid: EncodedPairs, spec, context: distributed.Context) -> float | None:
    """Cross entropy per target token (nats, no label smoothing) on the validation split; rank 0 only."""
    result = None
    if context.is_main:
        model.eval()
        lens = [len(t) for t in valid.target]
        total, tokens = 0.0, 0
        for indices in micro_batches([len(s) for s in valid.source], lens, spec.train.max_batch_tokens or 4000):
            batch = collate(indices, valid.source, valid.target).to(context.device)
            with _autocast(context.device):
                logits = model(batch.src, batch.tgt_in, batch.src_padding)
            total += float(F.cross_entropy(logits.float().flatten(0, 1), batch.labels.flatten(),
                                           ignore_index=PAD, reduction="sum"))
            tokens += batch.target_tokens
        model.train()
        result = round(total / tokens, 5)
    distributed.barrier(context)
    return result


# --- checkpoints -------------------------------------------------------------------------------

def _checkpoint_step(path: Path) -> int:
    return int(path.name.split("-")[1].split(".")[0])


def _save_checkpoint(spec, model, optimizer, scheduler, vocab: Vocab, progress: Progress, run_dir: Path,
                     context: distributed.Context) -> None:
    """§6.1: checkpoints at intervals; the last K kept. Rank 0 writes; the weights are the same everywhere."""
    path = run_dir / ckpt.CHECKPOINT_DIR / f"step-{progress.step:08d}.safetensors"
    if context.is_main:
        path.parent.mkdir(parents=True, exist_ok=True)
        ckpt.save_state(ckpt.state_path(path), {"optimizer": optimizer.state_dict(),
                                                "scheduler": scheduler.state_dict(), "progress": progress.state()})
        ckpt.save_weights(path, model.state_dict(), spec.resolved_source, spec.params, vocab.model_proto,
                          progress.step)
        ckpt.prune(run_dir, spec.train.keep_checkpoints)
    progress.last_checkpoint = path


def model_params(params: dict) -> dict:
    """The parameters that shape the model (section settings such as train.max_steps may change on resume)."""
    return {k: v for k, v in params.items() if not k.startswith(("train.", "data.", "decode."))}


def _resume(checkpoint: ckpt.Checkpoint, model, optimizer, scheduler) -> Progress:
    """The model, optimizer and scheduler as the checkpoint left them; where training stands."""
    ckpt.load_into(model, checkpoint)
    path = ckpt.state_path(checkpoint.path)
    record = ckpt.restore_training_state(path, ckpt.load_state(path), optimizer, scheduler)
    progress = Progress.from_state(record, path)
    if progress.step != checkpoint.step:
        raise UserError(f"{path}: the training state of step {progress.step}, beside the weights of "
                        f"step {checkpoint.step}")
    progress.last_checkpoint = checkpoint.path
    return progress


# --- the test split ----------------------------------------------------------------------------

def _test(model, vocab: Vocab, spec, corpus: Corpus, context: distributed.Context, run_dir: Path,
          show_progress: bool) -> Scores:
    """§6.1: beam search on the held-out split, scored with sacrebleu."""
    translator = Translator(model, vocab, spec.decode, context.device, max_sequence_tokens(spec))
    hypotheses = translator.translate(corpus.test_src, progress=show_progress)
    write_atomically(run_dir / TEST_OUTPUT, "".join(h + "\n" for h in hypotheses))
    return score(hypotheses, corpus.test_ref)


@contextmanager
def _stop_on_signals():
    """Ctrl-C / SIGTERM end training at the next update boundary, after a checkpoint; a second Ctrl-C
    interrupts at once."""
    received: list[int] = []

    def handler(signum, frame):
        if received:
            raise KeyboardInterrupt
        received.append(signum)
        print(f"\nxspec: stopping after this update (signal {signum}); Ctrl-C again to quit at once",
              file=sys.stderr)

    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:        # not the main thread: leave signals alone
        previous = {}
    try:
        yield lambda: bool(received)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
