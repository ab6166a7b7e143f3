"""What transformers' logits processors change before a continuation's next token is chosen, for the
settings a checkpoint's generation_config.json may hold:
- `repetition_penalty` (Keskar et al., 2019): the score of a token already in the row (prompt or
  continuation) divided by the penalty where positive, multiplied by it where negative;
- `no_repeat_ngram_size` n: never a token that would repeat an n-gram the row already holds;
- `min_new_tokens`: no end token before the continuation holds that many; `min_length`, before the
  prompt and the continuation together do;
- `suppress_tokens`: never these; `begin_suppress_tokens`: not these as the continuation's first token;
- `forced_bos_token_id` (an encoder-decoder's): this as the first token, scoring 0.

As transformers applies them: to the raw logits when decoding greedily or sampling (before the
temperature and the top-k and top-p filters), to the log-probabilities in beam search. An ensemble's
logits are its mixture's log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from xspec.compiler.sections import DecodeSection
    from .ensemble import Steps


@dataclass(frozen=True)
class ScoreRules:
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_new_tokens: int = 0
    min_length: int = 0
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    ends: tuple[int, ...] = ()          # the tokens a continuation ends at (the least lengths hold them back)
    forced_first: int | None = None     # the continuation's first token, whatever the scores (forced_bos_token_id)

    @classmethod
    def of(cls, decode: DecodeSection, ends: tuple[int, ...], forced_first: int | None = None) -> "ScoreRules":
        """A decode section's rules (compiler/sections.py), ending at `ends`."""
        return cls(decode.repetition_penalty, decode.no_repeat_ngram_size, decode.min_new_tokens, decode.min_length,
                   decode.suppress_tokens, decode.begin_suppress_tokens, ends, forced_first)

    @property
    def any(self) -> bool:
        return self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0 or self.min_new_tokens > 0 \
            or self.min_length > 0 or bool(self.suppress) or bool(self.begin_suppress) or self.forced_first is not None

    def apply(self, scores: torch.Tensor, rows: torch.Tensor, new: int) -> torch.Tensor:
        """[R, V] scores of the next token of rows whose tokens so far (prompt, then continuation) are
        `rows` [R, L], the continuations `new` tokens long."""
        vocab = scores.size(1)
        if new == 0 and self.forced_first is not None:    # as transformers' ForcedBOSTokenLogitsProcessor
            forced = torch.full_like(scores, float("-inf"))
            forced[:, self.forced_first] = 0.0
            return forced
        if self.repetition_penalty != 1.0:      # the seen tokens' scores, gathered, changed, put back
            padded = torch.cat([scores, scores.new_zeros(scores.size(0), 1)], dim=1)  # ids past V: the last
            seen = rows.clamp(max=vocab)
            picked = padded.gather(1, seen)
            penalty = self.repetition_penalty
            scores = padded.scatter(1, seen, torch.where(picked < 0, picked * penalty, picked / penalty))[:, :vocab]
        held = new < self.min_new_tokens or rows.size(1) < self.min_length
        columns = [token for token in (*self.suppress, *(self.begin_suppress if new == 0 else ()),
                                       *(self.ends if held else ())) if 0 <= token < vocab]
        repeats = [(r, token) for r, tokens in enumerate(rows.tolist() if self.no_repeat_ngram_size else [])
                   for token in self._repeats(tokens) if token < vocab]
        if columns or repeats:
            scores = scores.clone()
            scores[:, columns] = float("-inf")
            if repeats:
                at = torch.tensor(repeats, device=scores.device)
                scores[at[:, 0], at[:, 1]] = float("-inf")
        return scores

    def _repeats(self, tokens: list[int]) -> set[int]:
        """The tokens that would end an n-gram `tokens` already holds (n: no_repeat_ngram_size)."""
        n = self.no_repeat_ngram_size
        if n == 0 or len(tokens) + 1 < n:
            return set()
        last = tokens[len(tokens) - n + 1:]
        return {tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tokens[i:i + n - 1] == last}


class RuledSteps:
    """Beam search's steps (runtime/beam_search.py) with the rules applied to their log-probabilities: each
    hypothesis [R, t] (a placeholder start, then its tokens) after its prompt is the row's tokens."""

    def __init__(self, steps: Steps, prompts: torch.Tensor, rules: ScoreRules, on_logits: bool = False) -> None:
        self.steps, self.prompts, self.rules = steps, prompts, rules   # prompts [R, P], a row each
        self.cached = steps.cached
        self.on_logits = on_logits      # greedy decoding: the rules change the logits, as transformers' do

    def logits(self, sequences: torch.Tensor) -> torch.Tensor:
        rows = torch.cat([self.prompts, sequences[:, 1:]], dim=1)
        return self.rules.apply(self.steps.logits(sequences), rows, sequences.size(1) - 1)

    def log_probs(self, sequences: torch.Tensor) -> torch.Tensor:
        if self.on_logits:
            return torch.log_softmax(self.logits(sequences), dim=-1)
        rows = torch.cat([self.prompts, sequences[:, 1:]], dim=1)
        return self.rules.apply(self.steps.log_probs(sequences), rows, sequences.size(1) - 1)

    def keep(self, rows: torch.Tensor) -> None:
        self.prompts = self.prompts[rows]
        self.steps.keep(rows)

    def reorder(self, rows: torch.Tensor) -> None:
        self.steps.reorder(rows)
