"""Training any compiled spec with the paper's recipe (§5), then scoring the test split (§6.1).

The flow of `train()`: check the run (on resume: the recorded data and the checkpoint's model; a prepared
corpus's vocabulary sizes the model) -> data -> shared vocabulary (trained by rank 0, sent to the others)
-> the model and its loss, replicated or sharded over the processes and compiled if asked, Adam and the
eq. 3 schedule (or the last checkpoint's state) -> only then write the run's spec.xspec and run.json -> the
updates (loop.py) until a limit, Ctrl-C or a non-finite loss stops them (recorded in run.json) -> the test
split scored (BLEU for translation, perplexity for a language model). Nothing here depends on the
architecture (the model is whatever `spec.build()` returns) or on the task (runtime/tasks: what the data
is, how it is scored).
"""

from __future__ import annotations

import copy
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from xspec.base.errors import UserError
from xspec.base.files import read_regular_file, write_bytes_atomically
from xspec.base.process import find_tcmalloc, uses_tcmalloc
from xspec.base.text import shown
from xspec.base.threads import ThreadChoice, ThreadWatch
from . import checkpoint as ckpt
from . import distributed, state_dicts
from .activation_checkpoint import checkpoint_layers
from .attention_kernels import use_flex_attention
from .compile_choice import use_compile
from .dropout_masks import dropout_masks
from .best import Criterion, best_checkpoint
from .batching import micro_batch_cap
from .length_buckets import LengthBuckets
from .lora import apply_lora, lora_footprint, trainable_share
from .residual_init import scale_residual_writers
from .loop import Diverged, Progress, StopRequested, Trainer, epoch_updates, torch_seed
from .memory_plan import USABLE_SHARE, FreeMemory, Layout, MemoryPlan, free_memory, plan_memory
from .precision import choose_precision
from .prepared.examples import Mixture
from .prepared.format import VOCAB_FILE, open_prepared
from .run_log import RunLog
from .run_dir import (DATA_DIR, METRICS_LOG, DataFiles, PreparedSplit, RunRecord, Split, read_metrics_log,
                      read_run_record, rewrite_metrics_log, write_final_metrics, write_run_files, write_run_record)
from .schedule import make_optimizer, make_scheduler, run_length, warmup_warning
from .step import TrainingStep, compile_step, distribute
from .tasks import Corpus, Task, task_for
from .vocab import MODEL_FILE, Tokenizer, Vocab, load_or_train_vocab
from .inference import checkpoint_vocab


class Interrupted(UserError):
    """Ctrl-C (or SIGTERM): a checkpoint was written, the run can be resumed. `str(error)` says how;
    `continued_by` rewords that advice for a command that drives the run (a sweep)."""

    exit_code = 130

    def __init__(self, step: int, checkpoint: Path | None, run_dir: Path) -> None:
        self.step, self.checkpoint = step, checkpoint
        super().__init__(self.continued_by(f"xspec train --resume {run_dir}"))

    def continued_by(self, command: str) -> str:
        return f"interrupted at step {self.step}; checkpoint {self.checkpoint} written; continue with: {command}"


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
    progress: bool = True               # a progress bar, when stderr is a terminal
    tensorboard: bool = True            # TensorBoard event files in RUN/tensorboard/
    evaluate: bool = True               # score the test split at the end
    dist_timeout_minutes: float = distributed.DEFAULT_TIMEOUT_MINUTES
    vocab_file: Path | None = None      # a sentencepiece model to use instead of training one
    init: Path | None = None            # a run or checkpoint whose weights (and vocabulary) training starts from
    threads: ThreadChoice | None = None  # the CPU threads the command chose (xspec/base/threads.py), for the log


def train(spec, options: RunOptions) -> dict:
    """Trains `spec` (a compiled spec: `xspec.compile(...)`) into `options.out_dir`; returns the final figures."""
    task = task_for(spec)
    if spec.train.validate_bleu and task.kind != "translation":
        raise UserError(f"train.validate_bleu: {spec.name} is a {task.kind}, which has no BLEU; "
                        "its validation figure is the loss (perplexity)")
    context = distributed.setup(options.device, options.dist_timeout_minutes)
    log = RunLog(context.is_main, bar=options.progress and sys.stderr.isatty(), tensorboard=options.tensorboard,
                 report_every=spec.train.report_every_steps)
    try:
        with torch.inference_mode(False), torch.enable_grad():   # called under no_grad or inference_mode too
            return _train(spec, task, options, context, log)
    finally:
        log.close()
        distributed.teardown(context)


def _train(spec, task: Task, options: RunOptions, context: distributed.Context, log: RunLog) -> dict:
    """Everything that can be refused is checked before the run directory's spec.xspec and run.json
    are (re)written, so a failed command leaves a run as it was."""
    started = time.time()
    run_dir, cfg = options.out_dir, spec.train
    say = log.message
    existing = ckpt.list_checkpoints(run_dir)
    if existing and not options.resume:
        raise UserError(f"{run_dir} already holds checkpoints: continue it with --resume {run_dir}, "
                        "or choose another --output")
    if options.resume and not existing:
        raise UserError(f"--resume {run_dir}: no checkpoints in {run_dir / ckpt.CHECKPOINT_DIR}")
    record = _resumed_record(run_dir, options) if options.resume else \
        RunRecord(options.data, truncate=bool(options.truncate))
    last = ckpt.load_weights(existing[-1]) if options.resume else None
    sized = _sized_to_prepared_vocab(spec, record.data, options, last, say)
    if sized is not spec:
        spec, task = sized, task_for(sized)
    resumed = _same_model(last, spec) if last is not None else None
    starting = ckpt.load_weights(ckpt.resolve(options.init)) if options.init and not options.resume else None
    adapted = _lora_base(spec, starting, resumed)
    initial, fresh = _same_tensors(ckpt.merged(starting), spec, say) if starting is not None else (None, [])
    if initial is not None and options.vocab_file is not None:
        raise UserError("--init keeps the vocabulary of the run it starts from; drop --vocab")

    if record.data.train is None:
        # Every process writes the demo data (deterministic, written atomically): processes on other
        # machines need no shared filesystem to read it.
        record = replace(record, data=task.demo_files(run_dir))
    data = record.data
    assert data.train is not None           # given, or the demo's
    for note in task.read(data):           # every file checked before any work is done
        say(note)
    if settings := task.settings():        # what the data decides, kept in the run's spec (a classifier's labels)
        spec = spec.with_overrides(settings)
    kept = initial if initial is not None else resumed if resumed is not None and resumed.tokenizer else None
    # Fine-tuning keeps the vocabulary the weights were trained with (an import's own tokenizer).
    vocab = (checkpoint_vocab(kept, spec) if kept is not None
             else _vocab(spec, task, run_dir, context, options.vocab_file))
    if kept is not None and len(vocab) == 0:
        raise UserError(f"{kept.path}: holds no tokenizer (its checkpoint directory had none), so text cannot be "
                        "turned into token ids for training")
    if initial is not None and initial.tokenizer is None and context.is_main:
        # xspec's own vocabulary is kept as every run keeps it, where a resumed run looks for it
        write_bytes_atomically(run_dir / MODEL_FILE, vocab.model_proto)
    if len(vocab) != spec.data.vocab_size:
        # A corpus too small for data.vocab_size pieces, or a sentencepiece model of the user's: the spec
        # saved into the run and its checkpoints says the vocabulary the model is trained with.
        spec = spec.with_overrides({"data.vocab_size": len(vocab)})
    corpus = task.encode(vocab, bool(record.truncate), str(run_dir / MODEL_FILE))
    say(corpus.train.summary(f"train ({', '.join(f.name for f in data.train.files)})"))
    if corpus.valid is not None:
        say(corpus.valid.summary("valid"))

    spec = _with_run_length(spec, corpus, context, say)
    cfg = spec.train
    trainer = make_trainer(spec, run_dir, context, corpus, vocab, options, log, adapted=adapted)
    if resumed is not None:
        trainer.resume(resumed)
    elif initial is not None:
        trainer.start_from(initial, fresh)
        say(f"starting from the weights of {initial.path}")
    resuming = resumed is not None
    # The model holds the checkpoints' weights now; keeping them too would hold a second copy all run long.
    del last, resumed, starting, initial, kept
    if cfg.validate_bleu:
        trainer.bleu = _validation_bleu(spec, task, trainer)
    progress = trainer.progress
    if context.is_main:
        write_run_files(run_dir, spec.resolved_source, record)
        _start_metrics_log(run_dir, progress.step if options.resume else None)
    log.open(run_dir, progress.step, cfg.max_steps, resumed=resuming)
    if resuming:
        say(f"resuming {run_dir} at step {progress.step}")
    where = f"device {context.device}"
    if context.distributed:
        where += f", {context.world_size} processes" + (", parameters sharded (FSDP)" if trainer.sharded else "")
    where += f", {trainer.precision.describe()}"
    if options.threads is not None and context.device.type == "cpu":
        where += f", {options.threads.describe()}"
        if options.threads.from_free_cores:
            trainer.thread_watch = ThreadWatch(options.threads.threads, torch.set_num_threads)
    say(f"{spec.name}: {spec.parameters:,} parameters, vocabulary {len(vocab)}, {where}")
    if context.device.type == "cpu" and not uses_tcmalloc():
        library = find_tcmalloc()
        say("note: CPU training runs several times faster with tcmalloc: " +
            ("install it (Debian/Ubuntu: apt-get install libtcmalloc-minimal4); xspec then uses it" if library is None
             else f"the xspec command uses it unless --no-tcmalloc; from Python, LD_PRELOAD={library}"))

    run = _Run(spec, run_dir, record, context, options)
    with _stop_on_signals() as stop_requested:
        try:
            reason = trainer.run(stop_requested)
        except StopRequested:
            _record_stop(run, _stop_record("interrupted", progress))
            raise Interrupted(progress.step, progress.last_checkpoint, run_dir) from None
        except Diverged as diverged:
            _diverged(run, progress, diverged)
    stopped = _stop_record(reason, progress)
    unfinished = _unfinished(reason, progress, cfg, run_dir) if context.is_main else None
    say(_stop_line(reason, progress, cfg, run_dir) + (f": {unfinished}" if unfinished else ""))
    mix = _mixture_line(corpus.train, progress)
    if mix:
        say(mix)
    _record_stop(run, stopped)

    valid_loss = trainer.validate() if corpus.valid is not None else None
    if progress.last_checkpoint is None or ckpt.step_of(progress.last_checkpoint) != progress.step:
        trainer.save_checkpoint()
    model = _decoding_model(spec, trainer)
    if not context.is_main:
        return {}
    assert model is not None                # rank 0 holds it whole
    metrics = {"steps": progress.step, "valid_loss": valid_loss,
               "train_tokens_per_s": round(progress.train_tokens / max(progress.train_seconds, 1e-9), 1),
               "train_seconds": round(progress.train_seconds, 1), "stopped": stopped}
    if progress.best.best is not None:
        step, value = progress.best.best
        metrics["best"] = {"step": step, Criterion.of(cfg.validate_bleu).metric: value,
                           "checkpoint": str(best_checkpoint(run_dir, step).relative_to(run_dir))}
    outcome = task.evaluate(model, vocab, context, run_dir, options.progress) if options.evaluate else None
    if outcome is not None:
        metrics.update(outcome.metrics)
        log.scalars(progress.step, {f"test/{k}": v for k, v in outcome.metrics.items()
                                    if isinstance(v, (int, float)) and not isinstance(v, bool)})
    metrics["wall_s"] = round(time.time() - started, 1)
    write_final_metrics(run_dir, metrics)
    say(f"run directory: {run_dir}  (steps {progress.step}, valid loss {valid_loss}, "
        f"{metrics['train_tokens_per_s']} target tokens/s, {metrics['wall_s']} s)")
    for line in outcome.lines if outcome is not None else ():
        say(line)
    if unfinished:
        say(f"note: these figures are of a model stopped by train.max_minutes at step {progress.step} of "
            f"{cfg.max_steps}: {unfinished}")
    return metrics


@dataclass(frozen=True)
class _Run:
    """What the training loop needs to know about the run besides the model and the data."""

    spec: object
    run_dir: Path
    record: RunRecord
    context: distributed.Context
    options: RunOptions


# --- the run record: what a resumed run must keep --------------------------------------------------

def _resumed_record(run_dir: Path, options: RunOptions) -> RunRecord:
    """run.json as recorded; data files or --truncate given now must be what the run was started with."""
    recorded = read_run_record(run_dir)
    for name, given in options.data.splits().items():
        was = recorded.data.splits()[name]
        if given is None:
            continue
        if was is None or type(given) is not type(was) or \
                [f.resolve() for f in given.files] != [f.resolve() for f in was.files] or \
                (isinstance(given, PreparedSplit) and isinstance(was, PreparedSplit) and given.weights != was.weights):
            raise UserError(f"--resume {run_dir}: this run was started {_describe_split(name, was, run_dir)}; "
                            f"resuming with {given.describe()} would change the {_ROLES[name]}")
    if options.truncate is not None and recorded.truncate is not None and options.truncate != recorded.truncate:
        raise UserError(f"--resume {run_dir}: this run was started {'with' if recorded.truncate else 'without'} "
                        f"--truncate; resuming {'with' if options.truncate else 'without'} it would change "
                        "the training data")
    truncate = recorded.truncate if recorded.truncate is not None else bool(options.truncate)
    return RunRecord(recorded.data, truncate)


_ROLES = {"train": "training data", "valid": "validation data", "test": "test data"}


def _describe_split(name: str, split: Split | PreparedSplit | None, run_dir: Path) -> str:
    if split is None:
        return f"without {name} files"
    if name == "train" and isinstance(split, Split) and split.src.resolve().parent == (run_dir / DATA_DIR).resolve():
        return "on the built-in demo task"
    return f"with {name} files {split.describe()}"


def _same_tensors(saved: ckpt.Checkpoint, spec, say: Callable[[str], None]) -> tuple[ckpt.Checkpoint, list[str]]:
    """The checkpoint a fine-tune starts from, and the tensors that start fresh. Its tensors must be the spec's
    model's, name for name and shape for shape (a variant of its spec that adds no weight, a schedule parameter
    say, starts from it); the first that differs is named. A classifier may start from a model with another
    head (a masked LM's): the tensors both have are read, the classifier's own start fresh and the other
    head's are not read, each list said."""
    expected = {**spec.param_shapes, **spec.state_shapes}
    why = "--init starts from weights of the same names and shapes"
    if spec.classes is None or set(saved.tensors) == set(expected):
        ckpt.check_tensors(saved, expected, f"the model of {spec.name}", why)
        return saved, []
    shared = replace(saved, tensors={n: t for n, t in saved.tensors.items() if n in expected})
    fresh = [name for name in expected if name not in shared.tensors]
    ckpt.check_tensors(shared, {n: expected[n] for n in shared.tensors}, f"the model of {spec.name}", why)
    unread = [name for name in saved.tensors if name not in expected]
    say(f"--init: the classifier's own tensors start fresh ({', '.join(fresh)}); "
        f"{saved.path}'s other head is not read ({', '.join(unread) or 'nothing'})")
    return shared, fresh


def _lora_base(spec, starting: ckpt.Checkpoint | None, resumed: ckpt.Checkpoint | None) -> ckpt.BaseRef | None:
    """The checkpoint a LoRA run's adapters adapt (train.lora_rank > 0): the --init checkpoint of a new run, the
    one its checkpoints name when resumed; None when every weight trains."""
    cfg = spec.train
    if resumed is not None and (resumed.base is not None) != (cfg.lora_rank > 0):
        had = "LoRA adapters" if resumed.base is not None else "whole weights"
        raise UserError(f"{resumed.path}: the run trained {had}; resuming it with train.lora_rank = "
                        f"{cfg.lora_rank} would change that (drop the --set)")
    if cfg.lora_rank == 0:
        if cfg.lora_base != "float32":
            raise UserError(f"train.lora_base = \"{cfg.lora_base}\" keeps the frozen weights of a LoRA run; set "
                            "train.lora_rank too")
        return None
    if cfg.sharding == "fsdp":
        raise UserError("train.lora_rank with train.sharding = \"fsdp\": LoRA's adapters train beside a frozen, "
                        "replicated base; set train.sharding = \"none\"")
    scaling = cfg.lora_alpha / cfg.lora_rank
    if resumed is not None:
        assert resumed.base is not None
        if abs(resumed.base.scaling - scaling) > 1e-9 * scaling:
            raise UserError(f"{resumed.path}: its adapters were trained with lora_alpha / lora_rank = "
                            f"{resumed.base.scaling:g}; train.lora_alpha {cfg.lora_alpha:g} and lora_rank "
                            f"{cfg.lora_rank} give {scaling:g}")
        if resumed.base.stored != cfg.lora_base:
            raise UserError(f"{resumed.path}: its adapters were trained beside weights kept in "
                            f"{resumed.base.stored}; train.lora_base = \"{cfg.lora_base}\" would change them")
        return resumed.base
    if starting is None:
        raise UserError(f"train.lora_rank = {cfg.lora_rank}: LoRA adapts trained weights; start from them with "
                        "--init RUN (a run, a checkpoint or an import)")
    if starting.base is not None:
        raise UserError(f"{starting.path}: holds LoRA adapters, which new adapters cannot adapt; merge them "
                        f"first (xspec average RUN --last 1 --output merged.safetensors) and --init from that")
    return ckpt.BaseRef.of(starting.path, scaling, cfg.lora_base)


def _same_model(saved: ckpt.Checkpoint, spec) -> ckpt.Checkpoint:
    """The checkpoint to resume (or start) from; its model parameters must be the spec's (section settings
    such as train.max_steps may change)."""
    difference = ckpt.params_difference(model_params(saved.params), model_params(spec.params))
    if difference:
        raise UserError(f"{saved.path}: a checkpoint from a different spec ({difference})")
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


def _mixture_line(examples, progress: Progress) -> str | None:
    """Corpora mixed by weight: the share of the training tokens each one gave, against its weight."""
    if not isinstance(examples, Mixture) or not progress.source_tokens:
        return None
    parts = examples.parts
    total = sum(progress.source_tokens) or 1
    shares = ", ".join(f"{shown(p.examples.prepared.path)} {n / total:.1%} (weight {p.weight:.1%})"
                       for p, n in zip(parts, progress.source_tokens))
    return f"data mixture, share of the {total:,} training tokens so far: {shares}"


# A validation loss that fell by less than this (relative) since the one before has settled.
SETTLED = 0.01


def _unfinished(reason: str, progress: Progress, cfg, run_dir: Path) -> str | None:
    """Said of a run that train.max_minutes stopped before train.max_steps, unless its validation loss had
    settled: the same spec trains further on a faster or quieter machine, and its figures would differ."""
    if reason != "max_minutes" or progress.step >= cfg.max_steps:
        return None
    losses = [r["valid_loss"] for r in read_metrics_log(run_dir) if isinstance(r.get("valid_loss"), (int, float))]
    advice = "raise train.max_minutes, or run on a quieter machine"
    if len(losses) < 2:
        return f"too few validations to tell whether the model had finished learning; {advice}"
    before, last = losses[-2:]
    if last < before * (1 - SETTLED):
        return (f"the model has not finished learning (validation loss {before:.3f} -> {last:.3f} at the last two "
                f"validations); {advice}")
    return None


def _stop_line(reason: str, progress: Progress, cfg, run_dir: Path) -> str:
    if reason == "max_steps":
        return f"stopped at step {progress.step}: reached train.max_steps = {cfg.max_steps}"
    if reason == "patience":
        criterion = Criterion.of(cfg.validate_bleu)
        what = "BLEU" if cfg.validate_bleu else "loss"
        line = (f"stopped at step {progress.step}: no better validation {what} in {cfg.patience} validations "
                f"(train.patience = {cfg.patience})")
        if progress.best.best is not None:
            step, value = progress.best.best
            line += f"; the best, {criterion.metric} {value:g} at step {step}"
            if cfg.keep_best:
                line += f", is {best_checkpoint(run_dir, step)}"
        return line
    return (f"stopped at step {progress.step} of {cfg.max_steps}: reached train.max_minutes = {cfg.max_minutes:g} "
            f"({progress.train_seconds:.0f} s of training, counted over resumptions)")


# --- data --------------------------------------------------------------------------------------

def _vocab(spec, task: Task, run_dir: Path, context: distributed.Context, vocab_file: Path | None) -> Vocab:
    """§5.1: one vocabulary for source and target, trained on the training data by rank 0 (or the user's
    own sentencepiece model) and sent to the other processes (which wait up to the process group's
    timeout, `--dist-timeout`). A run keeps it as RUN/sentencepiece.model."""
    proto = None
    prepared = task.prepared_vocab()
    if context.is_main:
        if prepared is not None:
            proto = _users_vocab(*prepared, run_dir)
            if vocab_file is not None and Vocab.load(vocab_file).model_proto != proto:
                raise UserError(f"--vocab {vocab_file}: not the vocabulary the prepared data was made with "
                                f"({prepared[0]}); drop --vocab")
        elif vocab_file is not None:
            proto = _users_vocab(vocab_file, Vocab.load(vocab_file).model_proto, run_dir)
        else:
            proto = load_or_train_vocab(run_dir, task.vocab_text(), spec.data.vocab_size,
                                        spec.data.vocab_model, mask=spec.masked_lm).model_proto
    vocab = Vocab.from_bytes(distributed.share_bytes(context, proto), str(run_dir / MODEL_FILE))
    if len(vocab) > spec.vocab_size:     # (a prepared vocabulary has sized the model: _sized_to_prepared_vocab)
        origin, fix = (f"--vocab {shown(vocab_file)}", f"give one of at most {spec.vocab_size} pieces") \
            if vocab_file is not None else (shown(run_dir / MODEL_FILE), f"set data.vocab_size <= {spec.vocab_size}")
        raise UserError(f"{origin}: {len(vocab)} pieces, but the model's embedding has {spec.vocab_size} rows; "
                        f"{fix}, or --set vocab={len(vocab)}")
    return vocab


# The parameter that sizes the embedding and the output projection in every shipped spec (and import).
VOCAB_PARAM = "vocab"


def _sized_to_prepared_vocab(spec, data: DataFiles, options: RunOptions, last: ckpt.Checkpoint | None,
                             say: Callable[[str], None]):
    """The spec whose embedding has a row for each piece of the prepared data's vocabulary: its `vocab` set to
    that vocabulary's size, as `--set vocab=N` sets it (the run's spec.xspec keeps it). Where the spec cannot
    take it, the embedding must at least hold every piece. A run that starts from other weights (--init) keeps
    their vocabulary and size; a resumed run takes the size only where the run it continues did."""
    found = None if options.init is not None and not options.resume else _prepared_vocab_size(data)
    if found is None or found[1] == spec.vocab_size:
        return spec
    path, pieces = found
    if last is not None and last.params.get(VOCAB_PARAM) != pieces:
        return spec                     # the run kept the spec's size; the checkpoint check says if it differs
    rows = spec.vocab_size
    if VOCAB_PARAM in spec.overrides:   # said on the command line (or by the caller): kept, if it holds the pieces
        if pieces > rows:
            raise UserError(f"{path}: the prepared data's vocabulary has {pieces} pieces, but the model's embedding "
                            f"has {rows} rows; prepare it with --vocab-size <= {rows}, or drop --set {VOCAB_PARAM}="
                            f"{spec.overrides[VOCAB_PARAM]} (the model then takes the prepared vocabulary's size)")
        return spec
    # The resolved spec holds data.vocab_size as a number: it follows `vocab` as it does in the spec file.
    sized = spec.with_overrides({VOCAB_PARAM: pieces, "data.vocab_size": pieces}) if VOCAB_PARAM in spec.params \
        else None
    if sized is None or sized.vocab_size != pieces:
        if pieces > rows:
            raise UserError(f"{path}: the prepared data's vocabulary has {pieces} pieces, but the model's embedding "
                            f"has {rows} rows, and {spec.name} has no `{VOCAB_PARAM}` parameter that sizes it; "
                            f"prepare it with --vocab-size <= {rows}, or set the parameter that sizes the embedding "
                            f"with --set NAME={pieces}")
        return spec                     # rows beyond the vocabulary are never used
    say(f"{VOCAB_PARAM} = {pieces} (the spec says {spec.params[VOCAB_PARAM]}), as --set {VOCAB_PARAM}={pieces} "
        f"would set it: the model's embedding takes the prepared data's vocabulary, {path}, of {pieces} pieces")
    return sized


def _prepared_vocab_size(data: DataFiles) -> tuple[Path, int] | None:
    """The vocabulary file of the run's first prepared directory and its number of pieces (read from the file
    itself); None when no split is prepared. The task checks later that every directory has this vocabulary."""
    for split in data.splits().values():
        if isinstance(split, PreparedSplit):
            prepared = open_prepared(split.dirs[0], verify=False)     # verified in full when the task reads it
            return prepared.path / VOCAB_FILE, prepared.pieces               # read from the vocabulary itself
    return None


def _users_vocab(path: Path, proto: bytes, run_dir: Path) -> bytes:
    """A sentencepiece model given to the run (--vocab, or the prepared data's), read from `path`; a run
    resumed with another one than it started with is refused (its token ids would mean other pieces)."""
    Vocab.from_bytes(proto, str(path))
    kept = run_dir / MODEL_FILE
    if not kept.exists():
        write_bytes_atomically(kept, proto)
    elif read_regular_file(kept) != proto:
        raise UserError(f"{path}: not the vocabulary {run_dir} was trained with ({kept})")
    return proto


# --- training ----------------------------------------------------------------------------------

def _with_run_length(spec, corpus: Corpus, context: distributed.Context, say: Callable[[str], None]):
    """The spec with its run's length in steps where train.epochs counts it in passes over the data (and the
    warm-up from train.warmup_fraction); a warm-up longer than the run is said."""
    cfg = spec.train
    counted = epoch_updates(corpus.train, cfg, cfg.update_parts or context.world_size) if cfg.epochs else None
    train = run_length(cfg, counted)
    if counted is not None:
        say(f"train.epochs = {cfg.epochs}: {counted:,} updates a pass over the training data, {train.max_steps:,} "
            f"steps" + (f" (train.max_steps = {cfg.max_steps:,})" if train.max_steps == cfg.max_steps else ""))
    warning = warmup_warning(train)
    if warning is not None:
        say(warning)
    if train == cfg:
        return spec
    lengthened = copy.copy(spec)      # the spec as compiled, the run's length resolved
    lengthened.train = train
    return lengthened


def _document_start(spec, vocab: Tokenizer) -> Optional[int]:
    """The token that starts a document, where a language model keeps its packed documents apart."""
    if spec.data.document_boundaries == "cross":
        return None
    if spec.has_encoder:
        raise UserError(f"{spec.name}: data.document_boundaries = \"separate\" is for language models, whose "
                        "documents are packed into blocks")
    return vocab.document_start


def _one_shape(spec) -> Optional[str]:
    """What makes every batch of a run one shape, where something does: a language model's blocks."""
    if spec.has_encoder or spec.data.examples != "blocks":
        return None
    return "a language model's blocks"


def make_trainer(spec, run_dir: Path, context: distributed.Context, corpus: Corpus, vocab: Vocab,
                 options: RunOptions, log: RunLog, free: FreeMemory | None = None,
                 adapted: ckpt.BaseRef | None = None) -> Trainer:
    """The model and its loss, spread over the processes (and compiled, if asked), with Adam and the
    eq. 3 schedule: everything the loop needs. Before any of it is allocated, the memory plan: how many
    tokens a forward pass may hold on this device (`free`: what it has free, measured when not given).
    `adapted`: a LoRA run's base checkpoint; the model then trains adapters beside its frozen weights."""
    cfg = spec.train
    precision = choose_precision(context.device, cfg.precision, one_shape=_one_shape(spec), training=True)
    plan = _memory_plan(spec, context, precision, corpus, free or free_memory(context.device), log,
                        adapted is not None)
    torch.manual_seed(torch_seed(cfg.seed))
    model = spec.build(device=str(context.device))
    if cfg.residual_init == "depth":
        log.message(scale_residual_writers(model, spec.residual_writers()))
    if context.device.type == "cuda":
        use_flex_attention(model, spec)  # soft caps, sinks and windows fused
    if adapted is not None:
        log.message(_adapters(model, spec))
    dropout = dropout_masks(context.device, model)
    if cfg.activation_checkpointing:
        @contextmanager
        def recompute() -> Iterator[None]:
            with precision.modes(), dropout:
                yield

        layers = checkpoint_layers(model, spec, recompute)
        log.message(f"activation checkpointing: {len(layers)} layers recompute their activations in the backward")
    step = TrainingStep(model, cfg.label_smoothing, cfg.router_aux_loss_coef, cfg.expert_bias_update_rate,
                        cfg.mtp_loss_weight, spec.output_head, _document_start(spec, vocab))
    wrapped = distribute(step, context, cfg.sharding)
    optimizer = make_optimizer([p for p in wrapped.parameters() if p.requires_grad], cfg)
    runner = compile_step(wrapped) if use_compile(options.compile, context.device) else wrapped
    return Trainer(spec, run_dir, context, precision, step, wrapped, runner, optimizer,
                   make_scheduler(optimizer, cfg, spec.model_dim), corpus.train, corpus.valid, vocab, Progress(),
                   log, plan.cap, precision.grad_scaler(), adapted=adapted,
                   buckets=_length_buckets(cfg, corpus, cfg.update_parts or context.world_size, log), dropout=dropout)


def _length_buckets(cfg, corpus: Corpus, parts: int, log: RunLog) -> LengthBuckets | None:
    """train.length_buckets' lengths, chosen from the first window of training examples, and the padding
    they add to its micro-batches, as the log says it."""
    if not cfg.length_buckets:
        return None
    first = corpus.train.window(0, cfg.seed)
    buckets = LengthBuckets.chosen(first.src_lens, first.tgt_lens, cfg.length_buckets)
    added = buckets.added(first.src_lens, first.tgt_lens, micro_batch_cap(cfg.batch_tokens, parts))
    log.message(f"length buckets (train.length_buckets = {cfg.length_buckets}): {buckets.describe()}; padding "
                f"up to them adds {added:.1%} to the padded positions of the first epoch's micro-batches")
    return buckets


def _adapters(model: torch.nn.Module, spec) -> str:
    """LoRA's adapters put into `model` (its other weights frozen), as the log says it."""
    cfg = spec.train
    names = apply_lora(model, spec, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
    trainable, total = trainable_share(model)
    ends = ", ".join(sorted({name.rsplit(".", 1)[-1] for name in names}))
    return (f"LoRA: rank {cfg.lora_rank}, alpha {cfg.lora_alpha:g}, on {len(names)} linear layers ({ends}); "
            f"{trainable:,} of {total:,} parameters train ({trainable / total:.2%})")


def _memory_plan(spec, context: distributed.Context, precision, corpus: Corpus, free: FreeMemory,
                 log: RunLog, adapted: bool = False) -> MemoryPlan:
    """The pass cap every rank uses: the smallest that the ranks' devices plan (runtime/memory_plan.py).
    A rank where nothing fits stops them all (the others learn it from the agreed cap, 0). `adapted`: a LoRA
    run, whose adapters alone train."""
    cfg = spec.train
    longest = corpus.train.longest_padded
    parts = cfg.update_parts or context.world_size
    trained, weight_bytes = lora_footprint(spec) if adapted else (None, None)
    layout = Layout.of(context, precision, cfg.sharding, trained, weight_bytes, cfg.activation_checkpointing)
    plan, refusal = None, None
    try:
        plan = plan_memory(spec, layout, parts, longest, free)
    except UserError as error:
        refusal = error
    cap = distributed.all_min_int(context, plan.cap if plan is not None else 0)
    if refusal is not None:
        raise refusal
    if plan is None or cap == 0:
        raise UserError("train: another process has not enough memory for one sequence of the training data "
                        "(its error says how much it needs)")
    if cap != plan.cap:
        plan = replace(plan, cap=cap)
    log.message(f"{'train.max_batch_tokens' if plan.explicit else 'memory plan'}: {plan.describe()}")
    if not plan.fits:
        log.message(f"warning: train.max_batch_tokens = {spec.train.max_batch_tokens}: the estimated peak is more "
                    f"than {USABLE_SHARE:.0%} of the free memory, so the run may run out of it; "
                    "train.max_batch_tokens = \"auto\" plans passes that fit")
    return plan


def _decoding_model(spec, trainer: Trainer) -> torch.nn.Module | None:
    """The trained model for beam search on rank 0: the model itself, or, when its parameters are sharded
    over the processes, a copy holding them whole (gathering takes every process; the others get None)."""
    if not trainer.sharded:
        return trainer.step.model
    tensors = state_dicts.model_state(trainer.step, trainer.wrapped, sharded=True)
    model = spec.build(device=str(trainer.context.device), init=False) if trainer.context.is_main else None
    if model is not None:
        model.load_state_dict(tensors)
    return model


def _validation_bleu(spec, task: Task, trainer: Trainer):
    """train.validate_bleu: the validation split translated by rank 0 (the model gathered whole when it is
    sharded), its BLEU sent to every process."""
    from .tasks.translation import Translation

    assert isinstance(task, Translation)    # train.validate_bleu is refused for other tasks (train)
    context = trainer.context

    def bleu() -> float:
        model = _decoding_model(spec, trainer)
        value = 0.0
        if context.is_main:
            assert model is not None            # rank 0 holds it whole
            value = task.validation_bleu(model, trainer.vocab, context.device)
        trainer.wrapped.train()                     # decoding left the model in eval mode
        total = torch.tensor([value], dtype=torch.float64, device=context.device)
        return distributed.all_sum_tensor(context, total).item()

    return bleu


def _diverged(run: _Run, progress: Progress, diverged: Diverged) -> None:
    kept = f"the last good checkpoint is {progress.last_checkpoint}" if progress.last_checkpoint \
        else f"no checkpoint was written yet in {run.run_dir}"
    _record_stop(run, {**_stop_record("diverged", progress), "loss": str(diverged.loss), "at_step": diverged.step})
    raise UserError(f"the training loss became {diverged.loss} at step {diverged.step}; the optimizer skipped that "
                    f"update, so the model never took it in, and training stopped at step {progress.step} ({kept}); "
                    "try a lower learning rate or train.clip_norm")


# --- checkpoints -------------------------------------------------------------------------------

def model_params(params: dict) -> dict:
    """The parameters that shape the model (section settings such as train.max_steps may change on resume)."""
    return {k: v for k, v in params.items() if not k.startswith(("train.", "data.", "decode."))}


@contextmanager
def _stop_on_signals() -> Iterator[Callable[[], bool]]:
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
