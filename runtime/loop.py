"""The training loop (§5): updates of about `batch_tokens` target tokens, each split over the processes,
until a limit, Ctrl-C or a non-finite loss stops it; validation and checkpoints on the way.

The host never waits for the device inside an update: the next update's batches are prepared on a
background thread (on GPUs), an update whose gradients are not finite is skipped by the optimizer on the
device, and losses are read back every `train.log_every_steps` updates (every update on CPUs, where
reading costs nothing). The processes agree, at those reads, on whether to stop.
"""

from __future__ import annotations

import json

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from xspec.base.errors import UserError
from xspec.base.files import link_atomically
from xspec.base.threads import ThreadWatch
from . import checkpoint as ckpt
from . import distributed, state_dicts
from .batching import Batch, micro_batch_cap, micro_batches, plan_epoch, rank_passes, shard
from .data_order import Window
from .length_buckets import LengthBuckets
from .lora import adapter_tensors, store_frozen_base
from .precision import Precision
from .prefetch import Prefetcher
from .best import BestRecord, Criterion, best_checkpoint, remove_unkept
from .run_log import RunLog, StepFigures
from .schedule import skip_if
from .step import TrainingStep
from .tasks import Examples
from .vocab import Vocab

if TYPE_CHECKING:
    from xspec.compiler.spec import CompiledSpec


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint for exact resumption.

    The data position is (window, update): the next update of that window's plan (runtime/data_order.py;
    for a corpus in memory a window is an epoch), planned for `parts` ranks sharing an update. A run
    resumed with another number of ranks finishes that window as it was planned, then plans for its own."""

    step: int = 0
    epoch: int = 0
    update: int = 0                     # next update of the window's plan
    train_tokens: int = 0
    train_seconds: float = 0.0
    best: BestRecord = field(default_factory=BestRecord)
    last_checkpoint: Path | None = None
    window: int = 0
    parts: int = 0                      # ranks the current window was planned for (0: not yet planned)
    source_tokens: list[int] = field(default_factory=list)   # a mixture: training tokens from each corpus

    def state(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "update": self.update, "window": self.window,
                "parts": self.parts, "train_tokens": self.train_tokens, "train_seconds": self.train_seconds,
                "source_tokens": list(self.source_tokens), "best": self.best.state()}

    @classmethod
    def from_state(cls, state: dict, path: Path) -> "Progress":
        """The progress record of a training state file, checked: counts and a duration, none negative,
        and the best validations (absent from the states of earlier versions, as are the window, which
        was then the epoch, the parts and the mixture's tokens)."""
        counts = ("step", "epoch", "update", "train_tokens")
        later: dict[str, Any] = {"window": state.get("epoch"), "parts": 0, "source_tokens": []}
        state = {**later, **state}
        seconds = state.get("train_seconds")
        best = BestRecord.from_state(state["best"]) if "best" in state else BestRecord()
        sources = state["source_tokens"]
        if set(state) - {"best"} != {*counts, *later, "train_seconds"} or \
                not all(_is_count(state[k]) for k in (*counts, "window", "parts")) or \
                not isinstance(sources, list) or len(sources) > 64 or not all(_is_count(n) for n in sources) or \
                isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
                not 0 <= seconds < math.inf or best is None:
            raise UserError(f"{path}: unusable training state (progress: expected {', '.join(counts)}, window and "
                            "parts as whole numbers, train_seconds, none negative, and the best validations)")
        return cls(**{k: state[k] for k in counts}, train_seconds=float(seconds), best=best, window=state["window"],
                   parts=state["parts"], source_tokens=list(sources))


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Diverged(Exception):
    """The loss of an update was not finite (the optimizer skipped it); `step` is the first such update."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"loss {loss} at step {step}")
        self.step, self.loss = step, loss


class StopRequested(Exception):
    """Ctrl-C or SIGTERM was received (by any process); a checkpoint has been written."""


@dataclass
class Prepared:
    """One update, ready to run: this process's passes (on the device) and the update's target tokens."""

    window: Window
    index: int
    parts: int
    passes: list[tuple[Batch, bool]]   # (batch, counts): a filler pass has zero weight
    tokens: int                        # target tokens (with EOS) of the whole update, over all processes
    source_tokens: list[int]           # a mixture: those tokens by corpus


@dataclass
class _Pending:
    """An update whose loss has not been read back yet."""

    step: int
    lr: float
    tokens: int
    loss_sum: torch.Tensor
    grad_norm: torch.Tensor
    # The model's own losses (MoE load balancing, multi-token prediction: TrainingStep.side_names),
    # token-summed; and read back, summed over processes.
    side_sums: Optional[torch.Tensor] = None
    side_read: Optional[list[float]] = None


@dataclass
class Trainer:
    """What the loop works with. `step` is the model and its loss; `wrapped` is it replicated (DDP) or
    sharded (FSDP) over the processes; `runner` is `wrapped`, compiled or not, which updates call."""

    spec: CompiledSpec
    run_dir: Path
    context: distributed.Context
    precision: Precision
    step: TrainingStep
    wrapped: nn.Module
    runner: nn.Module
    optimizer: torch.optim.Adam          # fused (runtime/schedule.py): skip_if needs it
    scheduler: torch.optim.lr_scheduler.LRScheduler
    examples: Examples                  # the training split's (runtime/tasks)
    valid: Optional[Examples]
    vocab: Vocab
    progress: Progress
    log: RunLog
    pass_tokens: int                    # padded tokens of one forward pass at most (runtime/memory_plan.py)
    scaler: Optional[torch.amp.GradScaler] = field(default=None)
    # BLEU of the validation split (train.validate_bleu): called on every process, returns it on every one.
    bleu: Optional[Callable[[], float]] = None
    # The step whose weights save_best wrote last: a checkpoint of the same step links that file.
    best_written_at: Optional[int] = None
    # Chooses the CPU threads again when the machine's load changes (where they came from the free cores).
    thread_watch: Optional[ThreadWatch] = None
    # A LoRA run's base checkpoint: its checkpoints hold the adapters and this reference.
    adapted: Optional[ckpt.BaseRef] = None
    # The lengths passes are padded up to (train.length_buckets); None: each pass's longest.
    buckets: Optional[LengthBuckets] = None
    # Where a training pass draws dropout's masks (runtime/dropout_masks.py: hashed on a CPU).
    dropout: ContextManager = field(default_factory=nullcontext)

    @property
    def sharded(self) -> bool:
        return self.context.distributed and self.spec.train.sharding == "fsdp"

    # --- the loop -------------------------------------------------------------------------------------
    def run(self, stop_requested: Callable[[], bool]) -> str:
        """Updates until a limit is reached; returns which ("max_steps", "max_minutes" or "patience").
        Raises Interrupted (after a checkpoint) or Diverged."""
        cfg, context, progress = self.spec.train, self.context, self.progress
        reason = _limit_reached(progress, cfg)  # a resumed run may be past its limits already
        if reason is not None:
            return reason
        log_every = cfg.log_every_steps or (10 if context.device.type == "cuda" else 1)
        pending: list[_Pending] = []
        last_checkpoint, last_read = time.time(), time.time()
        updates = Prefetcher(self.planned_updates(), self._prepare, ahead=context.device.type == "cuda")
        interrupted = over_time = due_by_time = False
        compiling = self.runner is not self.wrapped
        if compiling:
            self.log.message("torch.compile: the first update compiles the training step (tens of seconds on a "
                             "CPU; a pass of a new shape may compile again)")
        for update in updates:
            started = time.time()
            pending.append(self._update(update))
            seconds = time.time() - started
            if compiling:
                self.log.message(f"torch.compile: the first update, compiling included, took {seconds:.1f} s")
                compiling = False
            progress.train_seconds += seconds
            if self.thread_watch is not None and (line := self.thread_watch.observe(seconds / max(update.tokens, 1))):
                self.log.message(line)
            at_limit = progress.step >= cfg.max_steps
            validate_now = self.valid is not None and progress.step % cfg.validate_every_steps == 0
            read_now = at_limit or validate_now or progress.step % log_every == 0
            if read_now:
                # Every process reads back its losses and learns what the others decided, at once.
                flags = [stop_requested(),
                         cfg.max_minutes is not None and progress.train_seconds >= cfg.max_minutes * 60,
                         cfg.checkpoint_every_minutes is not None and
                         time.time() - last_checkpoint >= cfg.checkpoint_every_minutes * 60]
                losses, norms, (interrupted, over_time, due_by_time) = self._read_back(pending, flags)
                self._log_steps(pending, losses, norms, time.time() - last_read)
                pending, last_read = [], time.time()
            out_of_patience = self._validate_and_keep_best() if validate_now else False
            due_by_steps = cfg.checkpoint_every_steps and progress.step % cfg.checkpoint_every_steps == 0
            if due_by_steps or out_of_patience or (read_now and (interrupted or over_time or due_by_time)):
                self.save_checkpoint()
                last_checkpoint = time.time()
            if read_now and interrupted:
                raise StopRequested()
            if out_of_patience:
                return "patience"
            if read_now and (at_limit or over_time):
                return "max_steps" if at_limit else "max_minutes"
        raise AssertionError("the plan of updates never ends")

    def planned_updates(self) -> Iterator[tuple[Window, int, int, list[list[int]]]]:
        """(window, index, parts, micro-batches) of every update from where the run stands, window after
        window (runtime/data_order.py); micro-batches in the window's local example ids."""
        cfg, progress = self.spec.train, self.progress
        parts = cfg.update_parts or self.context.world_size
        number, index = progress.window, progress.update
        window_parts = progress.parts or parts      # a window goes on as it was planned
        while True:
            window = self.examples.window(number, cfg.seed)
            plan = window_plan(window, cfg, window_parts)
            for i in range(index, len(plan)):
                yield window, i, window_parts, plan[i]
            number, index, window_parts = number + 1, 0, parts

    def _prepare(self, planned: tuple[Window, int, int, list[list[int]]]) -> Prepared:
        """Collates this process's passes of an update and moves them to the device (from pinned memory
        on a GPU, so the copy does not wait)."""
        window, index, parts, update = planned
        context = self.context
        passes = [(_to_device(self._collated(self.examples, window.global_ids(indices)), context.device), counts)
                  for indices, counts in rank_passes(update, context.rank, context.world_size,
                                                     window.padded_in(self.buckets), self.pass_tokens)]
        tokens = [window.tgt_lens[i] + 1 for micro_batch in update for i in micro_batch]
        by_source: list[int] = []
        if window.source_of is not None:
            sources = window.source_of[[i for micro_batch in update for i in micro_batch]]
            counted = np.bincount(sources, weights=tokens, minlength=int(window.source_of.max()) + 1)
            by_source = [int(n) for n in counted]
        return Prepared(window, index, parts, passes, sum(tokens), by_source)

    def _collated(self, examples: Examples, indices: list[int]) -> Batch:
        batch = examples.collate(indices)
        return batch if self.buckets is None else self.buckets.padded(batch)

    def _update(self, update: Prepared) -> _Pending:
        """One optimizer step over one update (§5: gradients accumulated over its passes)."""
        cfg, progress = self.spec.train, self.progress
        # Dropout is seeded from (seed, step, rank), so a resumed run replays exactly.
        torch.manual_seed(torch_seed((cfg.seed * 1_000_003 + progress.step) * 1_009 + self.context.rank))
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = self._accumulate(update)
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = self._optimizer_step()
        self.step.correct_routers(self.context)
        self.scheduler.step()
        progress.step += 1
        progress.window, progress.epoch, progress.update = update.window.number, update.window.epoch, update.index + 1
        progress.parts = update.parts
        progress.train_tokens += update.tokens
        if update.source_tokens:
            totals = progress.source_tokens + [0] * (len(update.source_tokens) - len(progress.source_tokens))
            progress.source_tokens = [a + b for a, b in zip(totals, update.source_tokens)]
        return _Pending(progress.step, lr, update.tokens, loss_sum, grad_norm, self.step.take_side_losses())

    def _accumulate(self, update: Prepared) -> torch.Tensor:
        """Forward/backward over this process's passes of an update; its summed token loss (on the device).

        The loss is normalised by the update's target tokens over all processes (§5.1 counts tokens per
        batch); DDP and FSDP average gradients over processes, so each scales by world_size to sum them."""
        context = self.context
        total = torch.zeros((), device=context.device)
        for i, (batch, counts) in enumerate(update.passes):
            with self._gradient_sync(last=i == len(update.passes) - 1):
                with self.precision.context(), self.dropout:
                    loss = self.runner(batch.labels, *batch.inputs)
                weighted = loss * (context.world_size / update.tokens if counts else 0.0)
                (self.scaler.scale(weighted) if self.scaler is not None else weighted).backward()
            if counts:
                total += loss.detach()
        return total

    def _gradient_sync(self, last: bool) -> ContextManager:
        """Gradients are reduced over processes once per update, at its last pass."""
        if not self.context.distributed:
            return nullcontext()
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        if self.sharded:
            assert isinstance(self.wrapped, FSDPModule)         # runtime/step.py: distribute
            self.wrapped.set_requires_gradient_sync(last)
            return nullcontext()
        # `runner` may be the compiled `wrapped`, whose no_sync is the wrapped module's.
        assert isinstance(self.wrapped, DistributedDataParallel)
        return nullcontext() if last else self.wrapped.no_sync()

    def _optimizer_step(self) -> torch.Tensor:
        """Clip (if asked), then step, skipping an update whose gradients are not finite: decided on the
        device, from the gradient norm, which is the same on every process after the reduction. Returns
        that norm (before clipping; a 0-d tensor on the device)."""
        cfg = self.spec.train
        if self.scaler is not None:  # fp16: the scaler skips overflowing steps itself
            self.scaler.unscale_(self.optimizer)
        parameters = [p for p in self.wrapped.parameters() if p.grad is not None]
        if cfg.clip_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(parameters, cfg.clip_norm)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            skip_if(self.optimizer, ~torch.isfinite(norm))
            self.optimizer.step()
        return (norm.full_tensor() if isinstance(norm, DTensor) else norm).detach()  # sharded: a DTensor

    def _read_back(self, pending: list[_Pending], flags: list[bool]) -> tuple[list[float], list[float], list[bool]]:
        """The pending updates' losses summed over processes, their gradient norms (the same on every
        process), and each flag as any process set it: one transfer."""
        n, world = len(pending), self.context.world_size
        # A model's own losses ride along after the losses (summed over processes, as they are).
        sides = [p.side_sums for p in pending if p.side_sums is not None]
        values = torch.cat([torch.stack([p.loss_sum for p in pending]), *sides,
                            torch.stack([p.grad_norm for p in pending]),
                            torch.tensor([float(f) for f in flags], device=self.context.device)])
        summed = distributed.all_sum_tensor(self.context, values.double()).tolist()
        width = len(sides[0]) if sides else 0
        side_values, summed = summed[n:n + width * len(sides)], summed[:n] + summed[n + width * len(sides):]
        for i, update in enumerate(p for p in pending if p.side_sums is not None):
            update.side_read = side_values[i * width:(i + 1) * width]
        return summed[:n], [v / world for v in summed[n:2 * n]], [v > 0 for v in summed[2 * n:]]

    def _log_steps(self, pending: list[_Pending], losses: list[float], norms: list[float], seconds: float) -> None:
        tokens_per_s = sum(p.tokens for p in pending) / max(seconds, 1e-9)
        figures: list[StepFigures] = []
        for update, loss_sum, norm in zip(pending, losses, norms):
            loss = loss_sum / update.tokens
            if not math.isfinite(loss):
                self.log.steps(figures, _eta_seconds(self.progress, self.spec.train))
                raise Diverged(update.step, loss)
            sides = dict(zip(self.step.side_names, [v / update.tokens for v in update.side_read or []]))
            figures.append(StepFigures(update.step, loss, update.lr, update.tokens, tokens_per_s, norm, sides))
        self.log.steps(figures, _eta_seconds(self.progress, self.spec.train))

    # --- validation and checkpoints -----------------------------------------------------------------
    def _validate_and_keep_best(self) -> bool:
        """Validation figures logged, the best validations' weights kept; True when `train.patience`
        validations in a row brought no new best."""
        cfg, progress = self.spec.train, self.progress
        figures = {"valid_loss": self.validate()}
        if self.bleu is not None:
            figures["valid_bleu"] = round(self.bleu(), 2)
        criterion = Criterion.of(cfg.validate_bleu)
        kept, dropped = progress.best.observe(progress.step, figures[criterion.metric], criterion, cfg.keep_best)
        if kept:
            self.save_best(dropped)
        best = progress.best.best
        self.log.validation(progress.step, figures, " (best so far)" if best and best[0] == progress.step else "")
        return cfg.patience is not None and progress.best.stale >= cfg.patience

    @torch.no_grad()
    def validate(self) -> float:
        """Cross entropy per target token (nats, no label smoothing) on the validation split, its
        batches shared among the processes."""
        assert self.valid is not None
        valid, context = self.valid, self.context
        # Without gradients a pass holds less than in training: the training pass size fits.
        batches = micro_batches(valid.src_lens, valid.tgt_lens, self.pass_tokens)
        totals = torch.zeros(2, dtype=torch.float64, device=context.device)  # loss, target tokens
        self.wrapped.eval()
        for indices, counts in shard(batches, context.rank, context.world_size):
            batch = self._collated(valid, indices).to(context.device)
            with self.precision.context():
                loss = self.wrapped(batch.labels, *batch.inputs, smoothed=False)
            if counts:
                totals += torch.stack([loss.double(), torch.tensor(float(batch.target_tokens), device=context.device,
                                                                   dtype=torch.float64)])
        self.wrapped.train()
        loss, tokens = distributed.all_sum_tensor(context, totals).tolist()
        return round(loss / tokens, 5)

    def save_best(self, dropped: list[int]) -> None:
        """The model's weights as RUN/checkpoints/best/step-N.safetensors; the checkpoints of `dropped`
        steps (no longer among the best) deleted. Every process takes part in gathering sharded state."""
        tensors = state_dicts.model_state(self.step, self.wrapped, self.sharded)
        if self.context.is_main:
            self._write_weights(best_checkpoint(self.run_dir, self.progress.step), tensors)
            for step in dropped:
                best_checkpoint(self.run_dir, step).unlink(missing_ok=True)
        self.best_written_at = self.progress.step

    def save_checkpoint(self) -> None:
        """§6.1: checkpoints at intervals; the last K kept. Every process takes part in gathering sharded
        state; rank 0 writes."""
        progress, context, spec = self.progress, self.context, self.spec
        # The same step's best checkpoint holds these very weights (every process knows, so none gathers).
        same_as_best = self.best_written_at == progress.step
        tensors = None if same_as_best else state_dicts.model_state(self.step, self.wrapped, self.sharded)
        optimizer = state_dicts.optimizer_state(self.wrapped, self.optimizer, self.sharded)
        path = ckpt.weights_file(self.run_dir / ckpt.CHECKPOINT_DIR, progress.step)
        if context.is_main:
            path.parent.mkdir(parents=True, exist_ok=True)
            state = {"optimizer": optimizer, "scheduler": self.scheduler.state_dict(), "progress": progress.state()}
            if self.scaler is not None:     # fp16: the loss scale it has found, so a resumed run goes on with it
                state[ckpt.SCALER_KEY] = self.scaler.state_dict()
            ckpt.save_state(ckpt.state_path(path), state)
            # Last: a checkpoint exists once its weights do.
            if same_as_best:
                link_atomically(best_checkpoint(self.run_dir, progress.step), path)
            else:
                assert tensors is not None          # gathered unless same_as_best
                self._write_weights(path, tensors)
            ckpt.prune(self.run_dir, spec.train.keep_checkpoints)
        progress.last_checkpoint = path

    def _write_weights(self, path: Path, tensors: dict[str, torch.Tensor]) -> None:
        """A self-contained checkpoint of the model at this step (its spec, parameters and vocabulary)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        described = self.vocab.describe()        # an imported checkpoint's own tokenizer
        if self.adapted is not None:
            tensors = adapter_tensors(tensors)
        ckpt.save_weights(path, tensors, self.spec.resolved_source, self.spec.params, self.vocab.model_proto,
                          self.progress.step, json.dumps(described) if described is not None else None,
                          self.adapted)

    def start_from(self, checkpoint: ckpt.Checkpoint, fresh: Sequence[str] = ()) -> None:
        """The model's weights from another run's checkpoint (fine-tuning); optimizer and schedule start anew,
        and a LoRA run's adapters as made (B = 0: the first forward is the checkpoint's model's), and the
        tensors named `fresh` (a classifier's new head) as initialized."""
        own = self.step.model.state_dict()
        made = {name: own[name] for name in fresh}
        if self.adapted is not None:
            made |= adapter_tensors(own)
        if made:
            checkpoint = replace(checkpoint, tensors={**checkpoint.tensors, **made})
        self._load(checkpoint)

    def resume(self, checkpoint: ckpt.Checkpoint) -> None:
        """The model, optimizer, scheduler (and fp16 loss scaler) as the checkpoint left them; where training
        stands."""
        if self.adapted is not None:       # the base's weights, then the run's adapters
            checkpoint = replace(checkpoint, tensors={**ckpt.load_base(checkpoint).tensors, **checkpoint.tensors})
        self._load(checkpoint)
        path = ckpt.state_path(checkpoint.path)
        record = ckpt.restore_training_state(
            path, ckpt.load_state(path), self.optimizer, self.scheduler,
            lambda state: state_dicts.load_optimizer_state(self.wrapped, self.optimizer, self.sharded, state),
            self.scaler)
        self.progress = Progress.from_state(record, path)
        if self.progress.step != checkpoint.step:
            raise UserError(f"{path}: the training state of step {self.progress.step}, beside the weights of "
                            f"step {checkpoint.step}")
        self.progress.last_checkpoint = checkpoint.path
        if self.context.is_main:
            remove_unkept(self.run_dir, [step for step, _ in self.progress.best.kept])

    def _load(self, checkpoint: ckpt.Checkpoint) -> None:
        """The checkpoint's weights into the model; then a LoRA run's frozen ones kept as train.lora_base says."""
        ckpt.load_into(self.step.model, checkpoint,
                       lambda tensors: state_dicts.load_model_state(self.step, self.wrapped, self.sharded, tensors))
        if self.adapted is not None and self.adapted.stored != "float32":
            self.log.message(store_frozen_base(self.step.model, self.adapted.stored))


def window_plan(window: Window, cfg, parts: int) -> list[list[list[int]]]:
    """The updates of a window (each a list of micro-batches), planned for `parts` ranks sharing an update."""
    batches = micro_batches(window.src_lens, window.tgt_lens, micro_batch_cap(cfg.batch_tokens, parts))
    return plan_epoch(batches, window.tgt_lens, cfg.batch_tokens, cfg.seed, window.number, parts,
                      src_lens=window.src_lens)


def epoch_updates(examples, cfg, parts: int) -> int:
    """The updates of one pass over the training examples: those of the windows the first epoch starts
    (a corpus in memory: its one window; a prepared one: each window of its first permutation)."""
    total, number = 0, 0
    while (window := examples.window(number, cfg.seed)).epoch == 0:
        total += len(window_plan(window, cfg, parts))
        number += 1
    return total


def _to_device(batch: Batch, device: torch.device) -> Batch:
    if device.type == "cuda":
        batch = Batch(tuple(x.pin_memory() for x in batch.inputs), batch.labels.pin_memory(), batch.target_tokens)
    return batch.to(device)


def _limit_reached(progress: Progress, cfg) -> str | None:
    if progress.step >= cfg.max_steps:
        return "max_steps"
    if cfg.max_minutes is not None and progress.train_seconds >= cfg.max_minutes * 60:
        return "max_minutes"
    return None


def torch_seed(value: int) -> int:
    """A seed `torch.manual_seed` accepts, whatever integer the spec gives: the same value for
    seeds in [0, 2**63), the rest reduced into that range."""
    return value % 2**63


def _eta_seconds(progress: Progress, cfg) -> float:
    """Training time left until train.max_steps or train.max_minutes, at the mean pace so far."""
    per_step = progress.train_seconds / max(progress.step, 1)
    left = (cfg.max_steps - progress.step) * per_step
    if cfg.max_minutes is not None:
        left = min(left, cfg.max_minutes * 60 - progress.train_seconds)
    return max(left, 0.0)
