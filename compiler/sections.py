"""The optional `train`, `data` and `decode` sections of a spec, as typed records.

The compiler parses and validates them; the runtime reads them. Defaults are the paper's recipe
(§5.1-5.4 for training, §6.1 for decoding), so a spec that omits a section trains and decodes as
the paper did. Every key can be set in the spec or from the command line (`--set train.warmup_steps=400`).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainSection(_Section):
    """Optimizer, schedule, batching and checkpointing (§5)."""

    # §5.3: Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9.
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = Field(1e-9, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    # §5.3, eq. 3: lr = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
    # "constant" uses `lr` for every step.
    lr_schedule: Literal["inverse_sqrt", "constant"] = "inverse_sqrt"
    lr_scale: float = Field(1.0, gt=0)
    lr: float = Field(1e-4, gt=0)
    warmup_steps: int = Field(4000, ge=1)
    # §5.1: about 25000 source and 25000 target tokens per update. An update is split into
    # `update_parts` forward passes (default: one per process), each capped at `max_batch_tokens`
    # padded tokens (what fits in memory); smaller caps accumulate gradients over more passes.
    batch_tokens: int = Field(25000, ge=1)
    max_batch_tokens: Optional[int] = Field(None, ge=1)
    update_parts: Optional[int] = Field(None, ge=1, le=4096)
    # §5.4: label smoothing eps_ls = 0.1.
    label_smoothing: float = Field(0.1, ge=0, lt=1)
    clip_norm: Optional[float] = Field(None, gt=0)
    max_steps: int = Field(100_000, ge=1)
    max_minutes: Optional[float] = Field(None, gt=0)
    # §6.1: checkpoints every 10 minutes; the last 5 (base) or 20 (big) are averaged.
    checkpoint_every_minutes: Optional[float] = Field(10.0, gt=0)
    checkpoint_every_steps: Optional[int] = Field(None, ge=1)
    keep_checkpoints: int = Field(20, ge=1)
    average_last: int = Field(5, ge=1)
    validate_every_steps: int = Field(1000, ge=1)
    # The best `keep_best` validations keep their weights in RUN/checkpoints/best/ (by validation loss,
    # or BLEU with validate_bleu, which decodes the validation split with the decode section's beam
    # search at every validation); `patience` stops training after that many validations in a row
    # without a new best.
    keep_best: int = Field(1, ge=0)
    patience: Optional[int] = Field(None, ge=1)
    validate_bleu: bool = False
    # A line in RUN/train.log (and on a console that is not a terminal) every this many updates.
    report_every_steps: int = Field(100, ge=1)
    # Losses are read back from the device every this many updates (default: 1 on CPU, 10 on GPUs,
    # where each read waits for the GPU to finish).
    log_every_steps: Optional[int] = Field(None, ge=1)
    seed: int = 1
    # Computation: "auto" is bf16 autocast on GPUs that support it, fp16 with loss scaling on older
    # ones, float32 on CPUs.
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    # "fsdp" shards parameters, gradients and optimizer state over the processes (torch's fully_shard),
    # for models that do not fit one device; "none" replicates the model (DistributedDataParallel).
    sharding: Literal["none", "fsdp"] = "none"

    @model_validator(mode="after")
    def _average_within_kept(self) -> "TrainSection":
        if self.average_last > self.keep_checkpoints:
            raise ValueError(
                f"average_last ({self.average_last}) is larger than keep_checkpoints "
                f"({self.keep_checkpoints}): the checkpoints to average would be deleted"
            )
        return self


class DataSection(_Section):
    """Corpus paths and the shared sentencepiece vocabulary (§5.1). Paths are relative to the spec file.

    A translation model reads aligned `*_src` / `*_tgt` files; a language model (a spec without an
    encoder) reads `*_text` files, one document (or sentence) a line."""

    vocab_size: int = Field(37000, ge=8)
    vocab_model: Literal["bpe", "unigram"] = "bpe"
    # A sentencepiece model of the user's instead of one trained on the training data (its pad, unk,
    # bos and eos ids must be 0, 1, 2, 3).
    vocab_file: Optional[str] = None
    train_src: Optional[str] = None
    train_tgt: Optional[str] = None
    valid_src: Optional[str] = None
    valid_tgt: Optional[str] = None
    test_src: Optional[str] = None
    test_tgt: Optional[str] = None
    train_text: Optional[str] = None
    valid_text: Optional[str] = None
    test_text: Optional[str] = None
    # Sentences longer than this many subword tokens are skipped (or truncated, if asked).
    max_tokens: int = Field(256, ge=1)
    # Language models: "blocks" concatenates the documents, each after an EOS, and cuts the stream into
    # blocks of `block_size` tokens (default: max_tokens, within the model's positions), every token
    # predicted; "lines" makes each line an example of its own, padded, as long as max_tokens allows.
    examples: Literal["blocks", "lines"] = "blocks"
    block_size: Optional[int] = Field(None, ge=1)


class DecodeSection(_Section):
    """Beam search (§6.1): beam 4, length penalty alpha 0.6, output length up to input length + 50.

    A language model continues a prompt by up to `max_new_tokens` tokens, with beam search (beam 1:
    greedy) or, with `sample = true`, by sampling: logits divided by `temperature`, then only the
    `top_k` most likely tokens and the smallest set whose probability reaches `top_p` kept."""

    beam: int = Field(4, ge=1)
    length_penalty: float = Field(0.6, ge=0)
    max_len_a: float = Field(1.0, ge=0)
    max_len_b: int = Field(50, ge=0)
    nbest: int = Field(1, ge=1)
    max_new_tokens: int = Field(100, ge=1)
    sample: bool = False
    temperature: float = Field(1.0, gt=0)
    top_k: Optional[int] = Field(None, ge=1)
    top_p: float = Field(1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _nbest_within_beam(self) -> "DecodeSection":
        if self.nbest > self.beam:
            raise ValueError(f"nbest ({self.nbest}) cannot exceed beam ({self.beam})")
        return self


SECTIONS: dict[str, type[_Section]] = {
    "train": TrainSection,
    "data": DataSection,
    "decode": DecodeSection,
}
