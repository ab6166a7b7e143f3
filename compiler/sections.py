"""The optional `train`, `data` and `decode` sections of a spec, as typed records.

The compiler parses and validates them; the runtime reads them. Defaults are the paper's recipe
(§5.1-5.4 for training, §6.1 for decoding), so a spec that omits a section trains and decodes as
the paper did. Every key can be set in the spec or from the command line (`--set train.warmup_steps=400`).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# An Adam beta: a decay rate of the moment estimates, 0 <= beta < 1 (torch.optim's bounds).
Beta = Annotated[float, Field(ge=0, lt=1)]


class TrainSection(_Section):
    """Optimizer, schedule, batching and checkpointing (§5)."""

    adam_betas: tuple[Beta, Beta] = Field((0.9, 0.98), description="Adam's beta1, beta2 (§5.3), each in [0, 1)")
    adam_eps: float = Field(1e-9, gt=0, description="Adam's epsilon (§5.3)")
    optimizer: Literal["adam", "adamw"] = Field(
        "adam", description="adam: weight_decay added to the gradients (§5.3's Adam); adamw: weight_decay applied "
                            "to the weights apart from the gradients (Loshchilov & Hutter, 2019)")
    weight_decay: float = Field(0.0, ge=0, description="adam: L2 penalty added to the gradients; adamw: the "
                                                       "decoupled decay; the paper has none")
    lr_schedule: Literal["inverse_sqrt", "constant", "cosine"] = Field(
        "inverse_sqrt", description="inverse_sqrt: eq. 3, lr_scale * d_model^-0.5 * min(step^-0.5, step * "
                                    "warmup_steps^-1.5); constant: `lr` at every step; cosine: `lr` reached "
                                    "linearly over warmup_steps, then decayed to 0 at the last step on a cosine")
    lr_scale: float = Field(1.0, gt=0, description="a factor on eq. 3's learning rate")
    lr: float = Field(1e-4, gt=0, description="the learning rate of the constant and cosine schedules (train "
                                              "--init: 5e-5, or 2e-4 with LoRA)")
    warmup_steps: int = Field(4000, ge=1, description="eq. 3's warmup (§5.3); the cosine schedule's")
    warmup_fraction: Optional[float] = Field(None, gt=0, lt=1, description="the warm-up as this share of the "
                                                                          "run's steps, in place of warmup_steps")
    epochs: Optional[int] = Field(None, ge=1, description="stop after this many passes over the training data: "
                                                          "max_steps counted from the data (the fewer of the two)")
    batch_tokens: int = Field(25000, ge=1, description="target tokens per update (§5.1: about 25000 source and "
                                                       "25000 target tokens)")
    max_batch_tokens: Union[Literal["auto"], Annotated[int, Field(ge=1)]] = Field(
        "auto", description="padded tokens per forward pass at most; an update's gradients accumulate over its "
                            "passes. auto: as many as fit in the memory the device has free, by the spec's "
                            "memory estimate (runtime/memory_plan.py)")
    activation_checkpointing: bool = Field(
        False, description="each layer of the repeated stacks keeps only its inputs for the backward and runs "
                           "its forward again there (torch.utils.checkpoint): about a third more compute for "
                           "the memory of the activations inside the layers")
    length_buckets: int = Field(
        0, ge=0, le=64, description="pad each forward pass's sequence lengths up to one of at most this many "
                                    "lengths, chosen from the training data as those that pad it least (0: up to "
                                    "the pass's longest); few shapes let a CPU's bf16 kernels and torch.compile's "
                                    "code be reused. The log says the padding they add; losses do not change")
    update_parts: Optional[int] = Field(
        None, ge=1, le=4096, description="forward passes an update is split into (default: one per process); "
                                         "fixed, an update is the same sentences on any number of processes")
    label_smoothing: float = Field(0.1, ge=0, lt=1, description="eps_ls (§5.4)")
    router_aux_loss_coef: float = Field(0.01, ge=0, description="the weight of a mixture of experts' load-balancing "
                                                               "loss in the training loss (Switch: 0.01); models "
                                                               "without experts have none")
    expert_bias_update_rate: float = Field(0.0, ge=0, le=1, description="DeepSeek-V3's auxiliary-loss-free "
                                           "balancing (§2.1.2; its gamma, 0.001): after each update, a corrected "
                                           "router's bias per expert moves by this toward the under-loaded experts")
    mtp_loss_weight: float = Field(0.3, ge=0, description="DeepSeek-V3's multi-token prediction (§2.2; its lambda, "
                                   "0.3 then 0.1): the training loss adds this times the mean over its depths of "
                                   "their losses; models without block mtp have none")
    clip_norm: Optional[float] = Field(None, gt=0, description="clip the gradient norm to this (the paper does not)")
    max_steps: int = Field(100_000, ge=1, description="stop after this many updates (§5.2: 100K base, 300K big)")
    max_minutes: Optional[float] = Field(None, gt=0, description="stop after this much training time (counted "
                                                                 "over resumptions)")
    checkpoint_every_minutes: Optional[float] = Field(10.0, gt=0, description="a checkpoint at this interval "
                                                                              "(§6.1: 10 minutes)")
    checkpoint_every_steps: Optional[int] = Field(None, ge=1, description="a checkpoint every this many updates")
    keep_checkpoints: int = Field(20, ge=1, description="the last this many checkpoints are kept")
    average_last: int = Field(5, ge=1, description="`xspec average RUN` averages the last this many "
                                                   "(§6.1: 5 base, 20 big)")
    validate_every_steps: int = Field(1000, ge=1, description="validation loss every this many updates")
    keep_best: int = Field(1, ge=0, description="the best this many validations keep their weights in "
                                                "RUN/checkpoints/best/ (`xspec average --best N`)")
    patience: Optional[int] = Field(None, ge=1, description="stop after this many validations in a row "
                                                            "without a new best")
    validate_bleu: bool = Field(False, description="also translate the validation split at each validation; "
                                                   "BLEU then ranks the best checkpoints (translation)")
    report_every_steps: int = Field(100, ge=1, description="a line in RUN/train.log (and on a console that is not "
                                                           "a terminal) every this many updates")
    log_every_steps: Optional[int] = Field(None, ge=1, description="losses read back from the device every this "
                                                                   "many updates (default: 1 on CPUs, 10 on GPUs)")
    seed: int = Field(1, description="seeds the batches' order, dropout and initialisation")
    residual_init: Literal["default", "depth"] = Field(
        "default", description="depth: each weight that writes into a residual stream (a sublayer's output "
                               "projection) scaled by 1/sqrt(N) after initialisation, N the stream's residual "
                               "additions (GPT-2's, nanoGPT's c_proj); a run that starts from weights is unchanged")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="auto: bf16 autocast on GPUs that have it, fp16 with loss scaling on older ones; on "
                            "CPUs, bf16 autocast where the CPU has AMX or AVX-512 BF16 and every batch is one "
                            "shape (a language model's blocks), or where it has AVX-512 BF16 without AMX (attention "
                            "then in float32), else float32")
    lora_rank: int = Field(0, ge=0, le=4096, description="LoRA (Hu et al., 2021): the rank of the adapters learned "
                           "beside the frozen weights of the lora_targets layers (0: every weight trains); a run's "
                           "checkpoints then hold the adapters and a reference to the weights they adapt (--init)")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA: the adapters' update is scaled by lora_alpha / lora_rank")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA: dropout on the adapters' input")
    lora_base: Literal["float32", "bfloat16", "int8"] = Field(
        "float32", description="LoRA: how the adapted layers' frozen weights are kept while the adapters train "
                               "(bfloat16: half the memory; int8: a quarter, with a scale per row, as QLoRA keeps "
                               "them); merging rounds them alike, so the merged model is the one that trained")
    lora_targets: tuple[str, ...] = Field(
        ("attention", "latent_attention", "linear"), min_length=1,
        description="LoRA: the linear layers adapted, as op kinds (attention: its projections; linear: every linear "
                    "op but the output head) or module names (q_proj, or self_attn.q_proj: names ending so)")
    sharding: Literal["none", "fsdp"] = Field(
        "none", description="fsdp: parameters, gradients and optimizer state sharded over the processes; "
                            "none: the model replicated (DDP)")

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

    vocab_size: int = Field(37000, ge=8, description="pieces of the shared vocabulary (§5.1: about 37000)")
    vocab_model: Literal["bpe", "unigram"] = Field("bpe", description="the sentencepiece algorithm")
    vocab_file: Optional[str] = Field(None, description="a sentencepiece model of your own instead of one trained "
                                                        "on the data (pad, unk, bos, eos: ids 0-3)")
    train_src: Optional[str] = Field(None, description="translation: training source text, a sentence a line")
    train_tgt: Optional[str] = Field(None, description="translation: training target text, aligned")
    valid_src: Optional[str] = Field(None, description="translation: validation source text")
    valid_tgt: Optional[str] = Field(None, description="translation: validation target text")
    test_src: Optional[str] = Field(None, description="translation: test source text (BLEU at the end)")
    test_tgt: Optional[str] = Field(None, description="translation: test target text")
    train_text: Optional[str] = Field(None, description="language model: training text, a document a line")
    valid_text: Optional[str] = Field(None, description="language model: validation text")
    test_text: Optional[str] = Field(None, description="language model: test text (perplexity at the end)")
    max_tokens: int = Field(256, ge=1, description="sentences longer than this many tokens are skipped "
                                                   "(or truncated with --truncate)")
    examples: Literal["blocks", "lines"] = Field(
        "blocks", description="language model: blocks, documents after each other cut into blocks of block_size; "
                              "lines, a line an example, padded")
    block_size: Optional[int] = Field(None, ge=1, description="tokens a block predicts (default: max_tokens, "
                                                              "within the model's positions)")
    document_boundaries: Literal["cross", "separate"] = Field(
        "cross", description="language model, blocks: whether a position reads the documents packed before it in "
                             "its block (cross), or only its own (separate: attention masks the others and each "
                             "recurrent layer starts every document from its zero state)")


TokenId = Annotated[int, Field(ge=0)]


class DecodeSection(_Section):
    """Beam search (§6.1) and, for language models, sampling."""

    beam: int = Field(4, ge=1, description="beam size (§6.1: 4; 1: greedy)")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="translating, generating and scoring: auto is bf16 autocast on GPUs that have it, "
                            "fp16 on older ones, float32 on CPUs (bf16: autocast on a CPU with AMX or AVX-512 "
                            "BF16)")
    weights: Literal["auto", "fp32", "bf16", "int8"] = Field(
        "auto", description="translating, generating and scoring: the linear layers' weights kept as trained "
                            "(fp32), in bf16, or in int8 with a scale per output channel: fewer bytes read per "
                            "token, logits slightly changed (CPUs with bf16 matrix instructions, GPUs); auto: "
                            "bf16 on such a CPU when the weights outgrow its last-level cache, else as trained")
    length_penalty: float = Field(0.6, ge=0, description="alpha of lp(Y) = ((5 + |Y|) / 6)^alpha (§6.1: 0.6); "
                                  "with beam_scoring \"transformers\", |Y|^alpha")
    beam_scoring: Literal["gnmt", "transformers"] = Field(
        "gnmt", description="how beam search scores and stops: \"gnmt\" (§6.1, tensor2tensor's), or as "
                            "transformers' generate does (an import's: |Y|^alpha, only the best `beam` candidates "
                            "of a step may end, a sentence done by early_stopping's rule)")
    early_stopping: Union[bool, Literal["never"]] = Field(
        False, description="beam_scoring \"transformers\": done when `beam` hypotheses have ended (true), when no "
                           "live one scores better at its present length (false), or at its longest (\"never\")")
    max_len_a: float = Field(1.0, ge=0, description="output length at most a * input length + b")
    max_len_b: int = Field(50, ge=0, description="... + b (§6.1: input length + 50)")
    nbest: int = Field(1, ge=1, description="hypotheses written per input (at most beam)")
    max_new_tokens: int = Field(100, ge=1, description="language model: tokens a continuation adds at most")
    sample: bool = Field(False, description="draw outputs token by token instead of beam search, one a prompt or "
                                            "line")
    beam_sampling: bool = Field(False, description="sampling: `beam` hypotheses a prompt, each step's candidates "
                                                   "drawn among them (transformers' beam sampling: do_sample with "
                                                   "num_beams), instead of one continuation")
    speculative: bool = Field(True, description="language model, greedy (beam 1): draft with the model's "
                                                "multi-token prediction where it has one (DeepSeek-V3 §2.2), the "
                                                "continuation unchanged")
    temperature: float = Field(1.0, gt=0, description="sampling: logits divided by this")
    top_k: Optional[int] = Field(None, ge=0, description="sampling: among the k likeliest tokens only (0: all, "
                                                        "as transformers' top_k 0)")
    top_p: float = Field(1.0, gt=0, le=1, description="sampling: among the smallest likeliest set whose "
                                                      "probability reaches p")
    min_p: Optional[float] = Field(None, ge=0, le=1, description="sampling: among the tokens at least min_p times "
                                   "as likely as the likeliest (Nguyen et al., 2024; after top-k and top-p)")
    typical_p: float = Field(1.0, gt=0, le=1, description="sampling: among the tokens whose information is "
                             "nearest the distribution's entropy, up to this mass (locally typical sampling, Meister "
                             "et al., 2023; 1: all)")
    epsilon_cutoff: float = Field(0.0, ge=0, lt=1, description="sampling: among the tokens of probability at least "
                                  "this (Hewitt et al., 2022; 0: all)")
    eta_cutoff: float = Field(0.0, ge=0, lt=1, description="sampling: among the tokens of probability at least "
                              "min(eta, sqrt(eta) exp(-entropy)) (Hewitt et al., 2022; 0: all)")
    repetition_penalty: float = Field(1.0, gt=0, description="the score of a token already in "
                                      "the prompt or continuation divided by this where positive, multiplied "
                                      "where negative (transformers' repetition_penalty; 1: none)")
    no_repeat_ngram_size: int = Field(0, ge=0, description="never a token that would repeat an "
                                      "n-gram of this size the prompt or continuation holds (0: none)")
    min_new_tokens: int = Field(0, ge=0, description="no end token before the continuation holds "
                                "this many tokens")
    min_length: int = Field(0, ge=0, description="no end token before the prompt (a translation's start token) "
                            "and the continuation together hold this many tokens (transformers' min_length)")
    suppress_tokens: tuple[TokenId, ...] = Field((), description="token ids never generated")
    decoder_start: Optional[TokenId] = Field(None, description="translation: the token every output starts from "
                                             "(a checkpoint's decoder_start_token_id); none: the vocabulary's BOS")
    forced_bos: Optional[TokenId] = Field(None, description="translation: the first token of every output, "
                                          "whatever its score (a checkpoint's forced_bos_token_id)")
    source_code: Optional[TokenId] = Field(None, description="translation: the source language's code in place "
                                           "of the one a multilingual checkpoint's tokenizer frames each source "
                                           "with (NLLB's eng_Latn, mBART's en_XX)")
    force_end: bool = Field(True, description="translation: the maximum length ends an output with the end token "
                                              "(transformers' forced_eos_token_id); false: it is cut there")
    begin_suppress_tokens: tuple[TokenId, ...] = Field((), description="token ids a "
                                                       "continuation never starts with")

    @property
    def searched_beams(self) -> int:
        """The hypotheses a search keeps: `beam`, but 1 where sampling draws one output."""
        return 1 if self.sample and not self.beam_sampling else self.beam

    @model_validator(mode="after")
    def _nbest_within_beam(self) -> "DecodeSection":
        if self.nbest > self.beam:
            raise ValueError(f"nbest ({self.nbest}) cannot exceed beam ({self.beam})")
        if self.beam_sampling and not self.sample:
            raise ValueError("beam_sampling draws the beams' candidates: it needs sample = true")
        return self


# `xspec train --init RUN` (a fine-tune of an import, or of any run) starts from this recipe in place of
# the spec's from-scratch one; --set overrides any of it. AdamW with weight decay, a small learning rate
# with a short warm-up and a cosine decay, no label smoothing, one pass over the data; the gradient norm
# clipped at 1 (transformers' Trainer's defaults, with its usual decay and warm-up). Every weight trains, even
# from a LoRA run, unless this run sets train.lora_rank; LoRA's adapters, which start from zero, then take a
# larger learning rate (LORA_LR, as in PEFT's and litgpt's examples) unless one is set.
FINE_TUNING: dict[str, object] = {
    "train.optimizer": "adamw", "train.adam_betas": (0.9, 0.999), "train.adam_eps": 1e-8,
    "train.weight_decay": 0.01, "train.lr_schedule": "cosine", "train.lr": 5e-5, "train.warmup_fraction": 0.03,
    "train.label_smoothing": 0.0, "train.clip_norm": 1.0, "train.epochs": 1, "train.lora_rank": 0,
}
LORA_LR = 2e-4

SECTIONS: dict[str, type[_Section]] = {
    "train": TrainSection,
    "data": DataSection,
    "decode": DecodeSection,
}
