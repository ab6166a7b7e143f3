"""A trained run or checkpoint, loaded for use (`xspec.load`): everything comes from the checkpoint itself.
Several, with one vocabulary, load as an ensemble that translates and scores as one (`load_ensemble`).

A checkpoint is untrusted data: its spec goes through the compiler's checks like any spec file and
may not import other files, its vocabulary must parse and fit the model, and its tensors must
match the model the spec builds (checkpoint.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
from pydantic import ValidationError

from xspec.base.errors import UserError
from xspec.compiler.sections import DecodeSection
from xspec.compiler.spec import compile_source
from . import checkpoint as ckpt
from .attention_kernels import use_flex_attention
from .compile_choice import compiled, use_compile
from .corpus import EncodedPairs, encode_source
from .distributed import pick_device
from .expert_products import register_expert_products
from .generation import Generator
from .ensemble import ModelOrEnsemble
from .scoring import LineScores, example_log_probs, score_lines
from .tasks import max_sequence_tokens
from .translation import Translator
from .vocab import Vocab
from .precision import choose_precision
from .sampling import sampling_choice
from .weight_formats import choose_weight_format, linear_weight_bytes, store_weights, weight_format_notice


def compile_checkpoint_spec(checkpoint: ckpt.Checkpoint):
    """The spec the checkpoint was trained with (its resolved source is stored in the checkpoint)."""
    return compile_source(checkpoint.spec_source, name=f"{checkpoint.path}:spec.xspec", allow_imports=False)


def checkpoint_vocab(checkpoint: ckpt.Checkpoint, spec) -> Vocab:
    """The checkpoint's sentencepiece model (or an imported checkpoint's own tokenizer), which must produce no
    id past the model's embedding."""
    if checkpoint.tokenizer is not None:
        from xspec.base.text import shown
        from .tokenizer import CheckpointTokenizer, check_against_embedding

        # Made again and probed as at import; its ids and special ids checked against this model's embedding.
        where = shown(checkpoint.path)
        tokenizer = CheckpointTokenizer.from_description(checkpoint.tokenizer, checkpoint.vocab_proto, where)
        check_against_embedding(tokenizer, spec.vocab_size, where)
        return tokenizer  # type: ignore[return-value]
    vocab = Vocab.from_bytes(checkpoint.vocab_proto, f"{checkpoint.path}: its sentencepiece model")
    if len(vocab) > spec.vocab_size:
        raise UserError(f"{checkpoint.path}: its sentencepiece model has {len(vocab)} pieces, but the model's "
                        f"embedding has {spec.vocab_size} rows")
    return vocab


def build_from_checkpoint(checkpoint: ckpt.Checkpoint, spec, device: torch.device | str):
    """(model in eval mode, vocabulary) of a checkpoint whose spec is `spec`."""
    vocab = checkpoint_vocab(checkpoint, spec)
    model = spec.build(device=str(device), init=False)  # every tensor is the checkpoint's
    ckpt.load_into(model, checkpoint)
    if torch.device(device).type == "cuda":
        use_flex_attention(model, spec)  # soft caps, sinks and windows fused
    return model.eval(), vocab


class _Scoring:
    """What a trained model and an ensemble share: translating, generating and scoring through their
    `members` (one module, or a tuple of them, runtime/ensemble.py), `tokenizer`, `device`, `max_tokens`
    and `label`."""

    tokenizer: Vocab
    device: torch.device

    @property
    def members(self) -> ModelOrEnsemble:
        raise NotImplementedError

    @property
    def output_head(self) -> Optional[str]:
        """The module that makes a single model's logits, which its multi-token prediction shares (greedy
        decoding drafts with it); None for an ensemble."""
        return None

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def is_language_model(self) -> bool:
        raise NotImplementedError

    @property
    def is_masked_lm(self) -> bool:
        """An encoder alone returning logits (BERT's), which fills masks rather than decoding."""
        raise NotImplementedError

    @property
    def classes(self) -> Optional[int]:
        """A classifier's number of classes; None for other models."""
        raise NotImplementedError

    @property
    def max_tokens(self) -> int:
        raise NotImplementedError

    def decode_settings(self, **overrides) -> DecodeSection:
        raise NotImplementedError

    def _decodes(self, doing: str) -> None:
        """Refuses `doing` for an encoder alone (a masked language model, a classifier), which decodes nothing."""
        if self.is_masked_lm:
            raise UserError(f"{self.label}: a masked language model (an encoder alone) {doing}; use xspec fill, "
                            "or xspec eval --text")
        if self.classes is not None:
            raise UserError(f"{self.label}: a classifier (an encoder alone) {doing}; use xspec classify, or xspec "
                            "eval --text --labels")

    def translator(self, batch_tokens: int = 4000, target_language: Optional[str] = None,
                   source_language: Optional[str] = None, seed: int = 0, **overrides) -> Translator:
        """`target_language`, `source_language`: a multilingual model's (its tokenizer's codes: Marian's `fr` for
        `>>fr<<`, NLLB's `deu_Latn`). `sample` and `beam` choose as `xspec translate`'s flags do
        (runtime/sampling.py's sampling_choice); `seed` seeds sampling."""
        self._decodes("does not translate")
        if self.is_language_model:
            raise UserError(f"{self.label}: a language model (no encoder) does not translate; use generate")
        if source_language is not None:
            overrides["source_code"] = self.tokenizer.language_code(source_language)
        language = self.tokenizer.target_language(target_language) if target_language is not None else None
        if language is not None and language.forced_bos is not None:
            overrides["forced_bos"] = language.forced_bos
        decode = self._chosen_decode(overrides)
        if decode.nbest > decode.searched_beams:
            raise UserError(f"nbest {decode.nbest}: sampling draws one translation a line (with a beam, beam "
                            "sampling draws that many)")
        return Translator(self.members, self.tokenizer, decode, self.device, self.max_tokens, batch_tokens,
                          language.prefix if language is not None else "", seed)

    def translate(self, lines: list[str], beam: Optional[int] = None, alpha: Optional[float] = None,
                  max_len_b: Optional[int] = None, sample: Optional[bool] = None, seed: int = 0,
                  temperature: Optional[float] = None, top_k: Optional[int] = None,
                  top_p: Optional[float] = None) -> list[str]:
        """Each line translated with beam search, or sampled (the spec's decode settings unless given; `sample`
        and `beam` as `xspec translate`'s flags)."""
        return self.translator(seed=seed, beam=beam, length_penalty=alpha, max_len_b=max_len_b, sample=sample,
                               temperature=temperature, top_k=top_k, top_p=top_p).translate(lines)

    def generator(self, batch_tokens: int = 4000, seed: int = 0, chat: bool = False, system: Optional[str] = None,
                  **overrides) -> Generator:
        self._decodes("continues no prompts")
        if not self.is_language_model:
            raise UserError(f"{self.label}: a translation model continues no prompts; use translate")
        if system is not None and not chat:
            raise UserError("a system message is part of a chat: give chat=True (--chat) with it")
        return Generator(self.members, self.tokenizer, self._chosen_decode(overrides), self.device,
                         self.max_tokens, batch_tokens, seed, self.output_head, chat=chat, system=system)

    def _chosen_decode(self, overrides: dict) -> DecodeSection:
        """The decode settings `overrides` give, their `sample` and `beam` combined with the spec's as the
        flags of `xspec generate` and `translate` combine them (runtime/sampling.py's sampling_choice)."""
        chosen = sampling_choice(self.decode_settings(), overrides.get("sample"), overrides.get("beam"))
        return self.decode_settings(**{**overrides, **chosen})

    def generate(self, prompts: list[str], max_new_tokens: Optional[int] = None, sample: Optional[bool] = None,
                 temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
                 beam: Optional[int] = None, seed: int = 0, chat: bool = False,
                 system: Optional[str] = None, repetition_penalty: Optional[float] = None,
                 min_p: Optional[float] = None) -> list[str]:
        """Each prompt's continuation (the spec's decode settings unless given); the same seed, the same text.
        `sample` and `beam` choose as `xspec generate`'s flags do (runtime/sampling.py's sampling_choice).
        `chat`: each prompt is a user's message (after `system`'s) in the checkpoint's chat template, and the
        continuation the assistant's reply."""
        return self.generator(seed=seed, chat=chat, system=system, max_new_tokens=max_new_tokens, sample=sample,
                              temperature=temperature, top_k=top_k, top_p=top_p, beam=beam,
                              repetition_penalty=repetition_penalty, min_p=min_p).generate(prompts)

    def score(self, texts: list[str], targets: Optional[list[str]] = None) -> list[float]:
        """log P (nats) of each text under a language model, or of each target given its source text
        under a translation model."""
        self._decodes("gives no text a probability")
        if self.is_language_model:
            if targets is not None:
                raise UserError("a language model scores texts alone; targets are for translation models")
            return self.score_lines(texts).log_probs
        return score_pairs(self.members, self.tokenizer, self.max_tokens, self.device, texts, targets,
                           self.decode_settings().precision)

    def score_lines(self, lines: list[str], batch_tokens: int = 4000) -> LineScores:
        """A language model's log-probability of each line (in windows of its positions), with perplexity
        over them all."""
        self._decodes("gives no text a perplexity")
        if not self.is_language_model:
            raise UserError(f"{self.label}: perplexity of text is for language models; a translation model "
                            "is scored with score(sources, targets) or BLEU")
        return score_lines(self.members, self.tokenizer, lines, self.device, self.max_tokens, batch_tokens,
                           self.decode_settings().precision)


class TrainedModel(_Scoring):
    """A trained model with its vocabulary and spec: `xspec.load("runs/tiny")`.

        trained = xspec.load("runs/lm", device="cpu")
        trained.generate(["the cat"], max_new_tokens=20, sample=True, top_p=0.9, seed=1)
        trained.score(["a sentence to score"])       # log-probabilities (nats), one per line
        xspec.load("runs/tiny").translate(["a sentence to translate"], beam=4)

    `model` is the torch module (docs/model-interface.md), `tokenizer` the sentencepiece vocabulary
    (`encode(lines) -> ids`, `decode(ids) -> text`), `spec` the compiled spec it was trained from.
    """

    def __init__(self, spec, model: torch.nn.Module, vocab: Vocab, device: torch.device, path: Path) -> None:
        self.spec, self.model, self.tokenizer, self.device, self.path = spec, model, vocab, device, path

    @property
    def members(self) -> torch.nn.Module:
        return self.model

    @property
    def output_head(self) -> Optional[str]:
        return self.spec.output_head

    @property
    def label(self) -> str:
        return str(self.path)

    @property
    def is_language_model(self) -> bool:
        return not self.spec.has_encoder

    @property
    def is_masked_lm(self) -> bool:
        return self.spec.masked_lm

    @property
    def classes(self) -> Optional[int]:
        return self.spec.classes

    @property
    def max_tokens(self) -> int:
        return max_sequence_tokens(self.spec)

    def __repr__(self) -> str:
        kind = "language model" if self.is_language_model else "translation model" if self.spec.has_decoder \
            else "masked language model" if self.is_masked_lm else "classifier"
        return f"<TrainedModel {self.spec.name} ({kind}, {self.spec.parameters:,} parameters) from {self.path}>"

    def decode_settings(self, **overrides) -> DecodeSection:
        """The spec's `decode` section with `overrides` (None values ignored) checked like the spec's own."""
        chosen = {k: v for k, v in overrides.items() if v is not None}
        try:
            return DecodeSection(**{**self.spec.decode.model_dump(), **chosen})
        except (ValidationError, TypeError) as error:
            message = error.errors()[0]["msg"] if isinstance(error, ValidationError) else str(error)
            raise UserError(f"decoding options: {message}") from None


class TrainedEnsemble(_Scoring):
    """Trained models with one vocabulary that translate, generate and score as one (runtime/ensemble.py):
    `load_ensemble(["runs/a", "runs/b"])`.

        ensemble.translate(["a sentence"], beam=4)    # each step mixes the models' next-token distributions
        ensemble.generate(["the cat"], sample=True)   # language models: sampling draws from the mixture
        ensemble.score(sources, targets)              # log P(target | source), the same mixture token by token
        ensemble.score_lines(lines).perplexity        # language models

    `models` are the TrainedModels; the decode settings are the first one's spec's, and the longest
    sequence (`max_tokens`) is the smallest model's.
    """

    def __init__(self, models: list[TrainedModel], names: list[str]) -> None:
        assert len(models) > 1 and len(names) == len(models), "an ensemble of one is its model"
        self.models, self.names = models, names
        self.tokenizer, self.device = models[0].tokenizer, models[0].device

    @property
    def members(self) -> tuple[torch.nn.Module, ...]:
        """The torch modules, as decoding and scoring take an ensemble."""
        return tuple(m.model for m in self.models)

    @property
    def label(self) -> str:
        return " + ".join(self.names)

    @property
    def is_language_model(self) -> bool:
        return self.models[0].is_language_model

    @property
    def is_masked_lm(self) -> bool:
        return self.models[0].is_masked_lm

    @property
    def classes(self) -> Optional[int]:
        return self.models[0].classes

    @property
    def max_tokens(self) -> int:
        return min(m.max_tokens for m in self.models)

    def __repr__(self) -> str:
        return f"<TrainedEnsemble of {len(self.models)}: {', '.join(repr(m) for m in self.models)}>"

    def decode_settings(self, **overrides) -> DecodeSection:
        return self.models[0].decode_settings(**overrides)


def score_pairs(model: ModelOrEnsemble, tokenizer: Vocab, max_tokens: int, device: torch.device, sources: list[str],
                targets: Optional[list[str]], precision: str = "auto") -> list[float]:
    """log P (nats) of each target given its source, under a translation model or an ensemble of them."""
    if targets is None or len(targets) != len(sources):
        raise UserError("a translation model scores targets given their sources: score(sources, targets) "
                        "with one target per source")
    encoded_sources, too_long = encode_source(sources, tokenizer, max_tokens)
    encoded = tokenizer.encode(targets)
    longer = [i for i, ids in enumerate(encoded) if len(ids) + 1 > max_tokens]
    if too_long or longer:
        line = (too_long[0][0] if too_long else longer[0]) + 1
        raise UserError(f"line {line}: longer than the model's {max_tokens} positions")
    return example_log_probs(model, EncodedPairs(encoded_sources, encoded), device, precision=precision)


def load(run_or_checkpoint: Union[str, Path], device: Union[str, torch.device, None] = None,
         compile: str = "off", weights: Optional[str] = None, *, say_compiling: bool = True) -> TrainedModel:
    """The latest checkpoint of a run directory, or a checkpoint file. `compile` (auto, on, off): whether
    the decoder's step runs through torch.compile (lengths and batch sizes dynamic), which it says on
    stderr where `say_compiling` (an ensemble says it once). `weights` (auto, fp32, bf16, int8; default:
    the spec's decode.weights): what the linear layers' weights are kept in."""
    checkpoint = ckpt.load_merged(ckpt.resolve(Path(run_or_checkpoint)))
    spec = compile_checkpoint_spec(checkpoint)
    chosen = pick_device(str(device) if device is not None else None)
    model, vocab = build_from_checkpoint(checkpoint, spec, chosen)
    setting = "--weights" if weights is not None else "decode.weights"
    requested, linear_bytes = weights or spec.decode.weights, linear_weight_bytes(model)
    weight_format = choose_weight_format(chosen, requested, setting, linear_bytes)
    store_weights(model, weight_format, chosen)
    for notice in (weight_format_notice(weight_format, requested, setting, linear_bytes),
                   _precision_notice(chosen, spec.decode.precision)):
        if notice is not None:      # a precision below float32 is never chosen silently
            print(notice, file=sys.stderr)
    if use_compile(compile, chosen):
        register_expert_products()
        model.decode = compiled(model.decode, dynamic=True)  # the step decoding repeats
        if say_compiling:
            print(COMPILING, file=sys.stderr)    # else the first step's wait looks like a hang
    return TrainedModel(spec, model, vocab, chosen, checkpoint.path)


# What a decoding compiled says before its first step, which compiles.
COMPILING = ("xspec: torch.compile: the decoder compiles in its first two steps, the prompt's and the next's "
             "(tens of seconds; torch's cache keeps the code for later runs)")


def _precision_notice(device: torch.device, requested: str) -> Optional[str]:
    """The line a decoding says on stderr when it computes below float32 (autocast): which, why, and how to
    compute in float32 instead (None: float32)."""
    precision = choose_precision(device, requested, "decode.precision")
    if precision.dtype is None:
        return None
    return (f"xspec: decoding under {precision.describe()}; logits differ slightly from float32's: "
            "decode.precision = \"fp32\" in the spec (or --set decode.precision=fp32 where a command takes it) "
            "computes in float32")


def load_ensemble(runs: Sequence[Union[str, Path]], device: Union[str, torch.device, None] = None,
                  compile: str = "off", weights: Optional[str] = None) -> Union[TrainedModel, TrainedEnsemble]:
    """One run or checkpoint: `load`'s model. Several: an ensemble of them, which must share one vocabulary
    (the same sentencepiece model) and one task (all translation models, or all language models); their
    architectures may differ."""
    if not runs:
        raise UserError("no run or checkpoint to load")
    first = load(runs[0], device, compile, weights)
    if len(runs) == 1:
        return first
    if use_compile(compile, first.device):
        # Members of one spec share its generated classes' code, whose compiled versions torch counts
        # together: past its limit (8) it would run the later members uncompiled, saying so only in a log.
        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, 8 * len(runs))
    models = [first]
    for run in runs[1:]:
        model = load(run, first.device, compile, weights, say_compiling=False)
        if model.tokenizer.model_proto != first.tokenizer.model_proto:
            raise UserError(f"{runs[0]} and {run} have different vocabularies (their sentencepiece models differ); "
                            "the models of an ensemble must share one")
        if model.is_language_model != first.is_language_model:
            kinds = ["a language model" if m.is_language_model else "a translation model" for m in (first, model)]
            raise UserError(f"{runs[0]} is {kinds[0]} but {run} is {kinds[1]}; the models of an ensemble do "
                            "one task")
        models.append(model)
    return TrainedEnsemble(models, [str(run) for run in runs])
