"""Beam search (§6.1): beam 4, length penalty alpha = 0.6, output up to input length + 50, early stop.

Batched over sentences and beams: every tensor is [sentences, beam, ...] and one `decode` call per
step extends every hypothesis, using the decoder's key/value cache. Like the paper's implementation
(tensor2tensor), each step takes the best 2*beam extensions: those ending in EOS join the sentence's
finished set, scored by log P(Y) / lp(Y) with lp(Y) = ((5 + |Y|) / 6)^alpha (GNMT; |Y| counts EOS);
the best `beam` others stay alive. A sentence is done when no alive hypothesis can beat its worst
finished one (its log-probability can only fall, and lp is largest at the maximum length); done
sentences leave the batch. At the maximum length only EOS is allowed, so every sentence finishes.
With beam 1 this is greedy decoding: a sentence stops at its first argmax EOS.

The search is the same for both kinds of model; what it extends differs: a translation model's
hypotheses read the encoder's output of their sentence (`EncoderDecoderSteps`), a language model's
continue their prompt (`LanguageModelSteps`). Several models with one vocabulary search as an ensemble
(a list of models for `model`): their steps are averaged by `EnsembleSteps` (runtime/ensemble.py).

A step waits for the device once, to learn which sentences are done (and, when some are, once more per
tensor it reads their hypotheses from).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from xspec.compiler.sections import DecodeSection
from .cache import new_cache
from .ensemble import ModelOrEnsemble, Steps, ensemble_steps, members
from .score_rules import RuledSteps, ScoreRules
from .top_k import top_k
from .vocab import BOS, EOS, PAD


@dataclass
class Hypothesis:
    tokens: list[int]       # the hypothesis alone: no start or end token
    score: float            # log P(Y) / lp(Y)
    log_prob: float


def length_penalty(length: torch.Tensor | int, alpha: float) -> torch.Tensor | float:
    return _power((5 + length) / 6, alpha)


def _power(base: torch.Tensor | float, exponent: float) -> torch.Tensor | float:
    """base ** exponent, infinite past a float's range (a huge alpha), as a tensor's power is, not an error."""
    try:
        return base ** exponent
    except OverflowError:
        return math.inf


@dataclass(frozen=True)
class Scoring:
    """How ended hypotheses are scored and when a sentence is done. "gnmt" (§6.1, tensor2tensor's): log P(Y) /
    ((5 + |Y|) / 6)^alpha, any of a step's best 2K candidates may end, done when no live hypothesis could beat
    the worst ended one even at the maximum length. "transformers" (its generate's beam search, which an
    import decodes as): log P(Y) / |Y|^alpha, only the best K candidates of a step may end, the end token
    forced at the maximum length scores 0 (its ForcedEOSTokenLogitsProcessor), and a sentence is done, once K
    hypotheses have ended, as `early_stopping` says: at once (true), when the best live one scores no better
    at its present length (false), or at its longest ("never")."""

    alpha: float = 0.6
    form: str = "gnmt"
    early_stopping: bool | str = False

    @classmethod
    def of(cls, decode: DecodeSection) -> "Scoring":
        """A decode section's (compiler/sections.py)."""
        return cls(decode.length_penalty, decode.beam_scoring, decode.early_stopping)

    def penalty(self, length: torch.Tensor | int) -> torch.Tensor | float:
        return length_penalty(length, self.alpha) if self.form == "gnmt" else _power(length, self.alpha)

    def done(self, worst_ended: torch.Tensor, best_alive: torch.Tensor, step: int,
             max_lens: torch.Tensor) -> torch.Tensor:
        """[A] whether each sentence is done, from its worst ended score (-inf while fewer than K ended) and its
        best live log-probability after `step` tokens."""
        if self.form == "gnmt":
            return worst_ended >= best_alive / self.penalty(max_lens.float())
        full = worst_ended > float("-inf")
        if self.early_stopping is True:
            return full
        longest = max_lens.float() if self.early_stopping == "never" and self.alpha > 0 else step
        return full & (worst_ended >= best_alive / self.penalty(longest))


class Selection(Protocol):
    """How a step's candidates are chosen where not as the best by their scores: sampling's, with one beam
    or several (runtime/sampling.py's Drawing). `warped`: each row's log-probabilities [R, V] as the
    candidates' scores add them (tempered, filtered); `choose`: `count` of each sentence's candidates [A, N]
    (their scores), best first, for the sentences `sentences` (their indices in the batch) -> scores
    [A, count], columns."""

    def warped(self, log_probs: torch.Tensor) -> torch.Tensor: ...

    def choose(self, candidates: torch.Tensor, count: int, sentences: list[int]
               ) -> tuple[torch.Tensor, torch.Tensor]: ...


@torch.no_grad()
def beam_search(model: ModelOrEnsemble, src: torch.Tensor, src_padding: torch.Tensor, beam: int,
                alpha: float | Scoring,
                max_len_a: float, max_len_b: int, nbest: int = 1, use_cache: bool = True,
                max_positions: int | None = None, vocab_size: int | None = None, start: int = BOS, end: int = EOS,
                never: tuple[int, ...] = (PAD, BOS), rules: ScoreRules = ScoreRules(),
                force_end: bool = True, selection: Optional[Selection] = None) -> list[list[Hypothesis]]:
    """Best `nbest` translations of each sentence of `src` [B, S], best first, by a model or an ensemble
    (a list of models); with a `selection`, drawn (sampling).

    `max_positions` caps the output length where the model's positions end; `vocab_size`, the tokens
    chosen from, where the model has more rows than the vocabulary has pieces. An output starts from
    `start`, ends at `end` and never holds `never` (xspec's vocabulary's; an imported checkpoint has its own);
    `rules` apply to each output after its start token (runtime/score_rules.py). `force_end`: the maximum length
    ends an output with `end` (transformers' forced_eos_token_id), else cuts it there.
    """
    # Longest output (EOS included): a * source length (EOS included) + b.
    max_lens = (((~src_padding).sum(1).float() * max_len_a).long() + max_len_b).clamp(min=1, max=max_positions)
    longest = int(max_lens.max())      # the start token and all but the last output token are decoded
    steps: Steps = ensemble_steps([EncoderDecoderSteps(m, src, src_padding, beam, use_cache, vocab_size, longest)
                                   for m in members(model)])
    if rules.any:       # the start token is the rows' prompt: transformers' min_length counts it
        steps = RuledSteps(steps, torch.full((src.size(0) * beam, 1), start, device=src.device), rules,
                           on_logits=beam == 1)
    return search(steps, src.size(0), beam, alpha, max_lens, nbest, end, never,
                  start=start, force_end=force_end, selection=selection)


@torch.no_grad()
def continue_prompts(model: ModelOrEnsemble, prompts: torch.Tensor, beam: int, alpha: float | Scoring,
                     max_new_tokens: int,
                     nbest: int = 1, use_cache: bool = True, max_positions: int | None = None,
                     vocab_size: int | None = None, end: int = EOS, never: tuple[int, ...] = (PAD, BOS),
                     also_end: tuple[int, ...] = (), rules: ScoreRules = ScoreRules(),
                     padding: torch.Tensor | None = None,
                     selection: Optional[Selection] = None,
                     output_head: Optional[str] = None) -> list[list[Hypothesis]]:
    """Best `nbest` continuations of each prompt of a decoder-only model or an ensemble of them, `prompts`
    [B, P] (each starting with EOS, the start of a document), up to `max_new_tokens` tokens each (fewer where
    the positions end), choosing among the first `vocab_size` tokens (default: all the model's). A
    continuation ends at `end` or any of `also_end`, and never holds the tokens `never` (a checkpoint's own
    tokenizer has its own). `rules` apply to the log-probabilities, each hypothesis after its prompt
    (runtime/score_rules.py). `padding` [B]: prompts of different lengths, each padded on the left by so many
    positions (runtime/cache.py; no rule may read them then). `selection`: candidates chosen otherwise than
    as the best (beam sampling). `output_head`: the path of the module that makes a single model's logits
    (CompiledSpec.output_head), which the prompts' pass has make the last position's alone."""
    room = max_new_tokens if max_positions is None else min(max_new_tokens, max_positions - prompts.size(1))
    if room < 1:
        raise ValueError(f"a prompt of {prompts.size(1)} tokens leaves no room within {max_positions} positions")
    max_lens = torch.full((prompts.size(0),), room + 1, device=prompts.device)   # + the EOS that ends it
    head = output_module(model, output_head)
    steps: Steps = ensemble_steps([LanguageModelSteps(m, prompts, beam, use_cache, vocab_size, padding, room, head)
                                   for m in members(model)])
    if rules.any:
        if padding is not None:
            raise ValueError("score rules read the prompts: they are not padded")
        steps = RuledSteps(steps, prompts.repeat_interleave(beam, dim=0), rules)
    return search(steps, prompts.size(0), beam, alpha, max_lens, nbest, end, never, also_end, selection=selection)


def output_module(model: ModelOrEnsemble, output_head: Optional[str]) -> Optional[torch.nn.Module]:
    """The module at `output_head` of a single model; None for an ensemble or where none is named."""
    return model.get_submodule(output_head) if output_head is not None and isinstance(model, torch.nn.Module) \
        else None


def _last_position(head: torch.nn.Module, inputs: tuple) -> tuple:
    """A forward pre-hook: the head reads the last position of its states [B, T, d] alone."""
    return (inputs[0][:, -1:], *inputs[1:])


class EncoderDecoderSteps:
    """A translation model's next-token logits for every hypothesis: the encoder runs once, and each
    hypothesis row reads its sentence's memory. Only the first `vocab_size` tokens are candidates (None: all):
    a model may have more embedding rows than its vocabulary has pieces."""

    def __init__(self, model, src: torch.Tensor, src_padding: torch.Tensor, beam: int, use_cache: bool,
                 vocab_size: int | None = None, positions: int | None = None) -> None:
        rows = torch.arange(src.size(0), device=src.device).repeat_interleave(beam)   # [B*K] sentence of each row
        self.model = model
        self.memory = model.encode(src, src_padding)[rows]
        # Without padding, attention over the memory needs no mask (one check per batch, not per step).
        self.memory_padding = src_padding[rows] if bool(src_padding.any()) else None
        self.cache = new_cache(model, positions) if use_cache else None   # positions: the longest output's
        self.cached = use_cache
        self.vocab_size = vocab_size

    def __call__(self, sequences: torch.Tensor) -> torch.Tensor:
        """[R, t] hypotheses (BOS first) -> [R, V] logits of their next token."""
        if self.cache is None:
            return self.model.decode(sequences, self.memory, self.memory_padding)[:, -1]
        last = sequences[:, -1:].contiguous()   # a compiled step sees one stride, not t's
        return self.model.decode(last, self.memory, self.memory_padding, cache=self.cache)[:, -1]

    def logits(self, sequences: torch.Tensor) -> torch.Tensor:
        """[R, t] hypotheses -> [R, V] logits (float32) of their next token (V: the vocabulary's)."""
        return self(sequences)[:, :self.vocab_size].float()

    def log_probs(self, sequences: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits(sequences), dim=-1)

    def keep(self, rows: torch.Tensor) -> None:
        """Only these rows stay (sentences left the batch). The beams of a sentence share its memory
        rows: they are copied only here."""
        self.memory = self.memory[rows]
        self.memory_padding = self.memory_padding[rows] if self.memory_padding is not None else None

    def reorder(self, rows: torch.Tensor) -> None:
        """Each row of the cache becomes the given old row (beams follow their origin)."""
        if self.cache is not None:
            self.cache.reorder(rows)


class LanguageModelSteps:
    """A decoder-only model's next-token logits for every hypothesis: the first call reads the whole
    prompt (filling the cache), later ones the last token; the first `vocab_size` tokens are candidates.
    `head`: the module that makes the model's logits (CompiledSpec.output_head); a pass over several
    positions then has it read the last position's states alone, as transformers' `generate` asks a model
    for the last position's logits only: a prompt of P tokens costs one row of the vocabulary's product,
    not P (and not P x vocab floats)."""

    def __init__(self, model, prompts: torch.Tensor, beam: int, use_cache: bool, vocab_size: int | None = None,
                 padding: torch.Tensor | None = None, new_tokens: int | None = None,
                 head: Optional[torch.nn.Module] = None) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.prompts = prompts.repeat_interleave(beam, dim=0)                  # [B*K, P]
        if padding is not None and not use_cache:   # prompts of different lengths, padded on the left
            raise ValueError("prompts padded on the left decode with a cache only")
        positions = None if new_tokens is None else prompts.size(1) + new_tokens
        rows = None if padding is None else padding.repeat_interleave(beam, dim=0)
        self.cache: Any = new_cache(model, positions, rows) if use_cache else None
        self.cached = use_cache
        self.started = False
        self.head = head

    def __call__(self, sequences: torch.Tensor) -> torch.Tensor:
        """[R, t] hypotheses (a start token, then what was generated) -> [R, V] logits of their next token."""
        if self.cache is None:
            return self._last(torch.cat([self.prompts, sequences[:, 1:]], dim=1))
        inputs = sequences[:, -1:].contiguous() if self.started else self.prompts   # one stride for every step
        self.started = True
        return self._last(inputs, self.cache)

    def _last(self, inputs: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """The logits [R, V] after the last of `inputs`' positions."""
        if self.head is None or inputs.size(1) == 1:
            return self.model.decode(inputs, cache=cache)[:, -1]
        hook = self.head.register_forward_pre_hook(_last_position)
        try:
            return self.model.decode(inputs, cache=cache)[:, -1]
        finally:
            hook.remove()

    def logits(self, sequences: torch.Tensor) -> torch.Tensor:
        """[R, t] hypotheses -> [R, V] logits (float32) of their next token (V: the vocabulary's)."""
        return self(sequences)[:, :self.vocab_size].float()

    def log_probs(self, sequences: torch.Tensor) -> torch.Tensor:
        """[R, t] hypotheses -> [R, V] log-probabilities (float32) of their next token."""
        return torch.log_softmax(self.logits(sequences), dim=-1)

    def keep(self, rows: torch.Tensor) -> None:
        self.prompts = self.prompts[rows]

    def reorder(self, rows: torch.Tensor) -> None:
        if self.cache is not None:
            self.cache.reorder(rows)


@torch.no_grad()
def search(steps: Steps, B: int, K: int, alpha: float | Scoring, max_lens: torch.Tensor, nbest: int = 1, end: int = EOS,
           never: tuple[int, ...] = (PAD, BOS), also_end: tuple[int, ...] = (), start: int = BOS,
           force_end: bool = True, selection: Optional[Selection] = None) -> list[list[Hypothesis]]:
    """The beam search itself, over `steps` (EncoderDecoderSteps, LanguageModelSteps or an ensemble of
    either) for B sentences; `max_lens` [B]: each one's longest output, `end` included. Rows start with `start`
    (the decoder's first input; a placeholder for a language model, whose steps read the prompts) and are
    padded with PAD once finished: a hypothesis is read by position, so these ids may be real tokens of a
    checkpoint's own vocabulary. Ending at any of `also_end` counts as ending at `end`, with the likeliest
    of their probabilities (the best hypothesis that ends, as a search over each would find). A `selection`
    chooses a step's 2K candidates among every token of every row, scored as it warps them (beam sampling),
    or with one beam the one token of a step (sampling); else they are the best 2K."""
    scoring = alpha if isinstance(alpha, Scoring) else Scoring(alpha)     # a number: GNMT's alpha
    transformers = scoring.form == "transformers"
    device = max_lens.device
    greedy = K == 1
    sentence = list(range(B))                                            # original index of each active one
    alive = torch.full((B, K, 1), start, dtype=torch.long, device=device)  # [A, K, t]
    alive_logp = torch.full((B, K), float("-inf"), device=device)
    alive_logp[:, 0] = 0.0                                               # one real beam at the start
    finished = torch.full((B, K, 1), PAD, dtype=torch.long, device=device)
    finished_score = torch.full((B, K), float("-inf"), device=device)
    finished_logp = torch.full((B, K), float("-inf"), device=device)
    results: list[list[Hypothesis]] = [[] for _ in range(B)]

    step = 0
    while sentence:
        step += 1
        A, t = alive.shape[0], alive.shape[2]
        logp = steps.log_probs(alive.view(A * K, t))                            # [A*K, V]
        V = logp.size(-1)
        logp[:, list(never)] = float("-inf")
        if also_end:
            logp[:, end] = logp[:, [end, *also_end]].max(dim=-1).values
            logp[:, list(also_end)] = float("-inf")
        # The best extensions of a sentence are among the best 2K tokens of each of its rows; sampled, any.
        row_token: Optional[torch.Tensor] = None                                 # None: the column is the token
        if selection is None:
            per_row = min(2 * K, V)
            row_best, row_token = top_k(logp, per_row)                           # [A*K, 2K]
        else:
            per_row, row_best = V, selection.warped(logp)                        # [A*K, V]
        # At its maximum length a sentence may only end: `end`, with its probability, is each row's one choice;
        # where a rule forbids `end` (a least length beyond the maximum), the row ends there by its length.
        # Without `force_end`, the maximum length cuts the hypotheses at their last token instead.
        at_max = (max_lens <= step).repeat_interleave(K)[:, None]              # [A*K, 1]
        if force_end:
            ending = (logp[:, end] if row_token is not None else row_best[:, end]).nan_to_num(neginf=0.0)
            only_eos = torch.full_like(row_best, float("-inf"))
            only_eos[:, 0 if row_token is not None else end] = 0.0 if transformers else ending
            row_best = torch.where(at_max, only_eos, row_best)
            if row_token is not None:
                row_token = torch.where(at_max, end, row_token)
        candidates = (alive_logp.view(A * K, 1) + row_best).view(A, K * per_row)
        if selection is None:
            top_logp, top = candidates.topk(min(2 * K, K * per_row), dim=1)      # [A, 2K]
        else:   # one beam draws one token, as sampling does
            top_logp, top = selection.choose(candidates, 1 if greedy else min(2 * K, K * per_row), sentence)
        origin = top // per_row
        token = top % per_row if row_token is None else row_token.view(A, K * per_row).gather(1, top)
        sequences = torch.cat([alive.gather(1, origin[:, :, None].expand(-1, -1, t)), token[:, :, None]], dim=2)

        # Finished set: the best K of (already finished, candidates ending in `end`).
        is_eos = token == end
        if not force_end:
            is_eos |= (max_lens <= step)[:, None]        # cut: every candidate ends at the maximum length
        if greedy or transformers:
            is_eos[:, K:] = False                        # only the best K may end (greedy: the argmax)
        eos_score = torch.where(is_eos, top_logp / scoring.penalty(step), float("-inf"))
        finished = torch.cat([finished, torch.full((A, K, 1), PAD, dtype=torch.long, device=device)], dim=2)
        pool_score = torch.cat([finished_score, eos_score], dim=1)
        pool_logp = torch.cat([finished_logp, torch.where(is_eos, top_logp, float("-inf"))], dim=1)
        finished_score, keep = pool_score.topk(K, dim=1)
        finished_logp = pool_logp.gather(1, keep)
        finished = torch.cat([finished, sequences], dim=1).gather(1, keep[:, :, None].expand(-1, -1, t + 1))

        # Alive set: the best K candidates that did not end.
        alive_logp, keep = torch.where(token == end, float("-inf"), top_logp).topk(K, dim=1)
        alive = sequences.gather(1, keep[:, :, None].expand(-1, -1, t + 1))
        beam_origin = origin.gather(1, keep)                                     # [A, K]

        if greedy:
            done = finished_score[:, 0] > float("-inf")
        else:
            done = scoring.done(finished_score[:, -1], alive_logp[:, 0], step, max_lens)
        done |= at_max.view(A, K)[:, 0]
        flags = done.tolist()                                # the step's one wait for the device
        if any(flags):
            ended = [a for a, flag in enumerate(flags) if flag]
            for a, hyps in zip(ended, _hypotheses(finished[ended], finished_score[ended], finished_logp[ended],
                                                  nbest, end, force_end)):
                results[sentence[a]] = hyps
            kept = [a for a, flag in enumerate(flags) if not flag]
            sentence = [sentence[a] for a in kept]
            active = torch.tensor(kept, dtype=torch.long, device=device)     # [A']
            alive, alive_logp, beam_origin = alive[active], alive_logp[active], beam_origin[active]
            max_lens = max_lens[active]
            finished, finished_score, finished_logp = finished[active], finished_score[active], finished_logp[active]
            steps.keep((active[:, None] * K + torch.arange(K, device=device)).view(-1))
        else:
            active = torch.arange(A, device=device)
        if steps.cached and sentence and not (greedy and len(sentence) == A):
            # Rows follow their beams (greedy rows follow none: they move only when a sentence leaves).
            steps.reorder((active[:, None] * K + beam_origin).view(-1))          # [A'*K] rows of the old batch
    return results


def _hypotheses(tokens: torch.Tensor, scores: torch.Tensor, log_probs: torch.Tensor,
                nbest: int, end: int, force_end: bool = True) -> list[list[Hypothesis]]:
    """The best `nbest` finished hypotheses of each of some sentences ([N, K, t] tokens, [N, K] scores): each
    row is the start, the hypothesis, `end`, then padding; or, cut at the maximum length (not `force_end`),
    the start and the hypothesis to the row's last token."""
    found = []
    for rows, row_scores, row_logps in zip(tokens.tolist(), scores.tolist(), log_probs.tolist()):
        out: list[Hypothesis] = []
        for row, score, logp in zip(rows, row_scores, row_logps):
            if score == float("-inf") or len(out) == nbest:
                break
            stop = row.index(end, 1) if force_end or end in row[1:] else len(row)
            out.append(Hypothesis(row[1:stop], score, logp))
        found.append(out)
    return found
