"""transformers' `repetition_penalty` (Keskar et al., 2019): the score of a token already in a row's prompt
or continuation is divided by the penalty where positive and multiplied by it where negative (a penalty
above 1 makes repeats less likely). As transformers applies it: to the raw logits when decoding greedily
or sampling, before the temperature and the top-k and top-p filters; to the log-probabilities in beam
search. An ensemble's logits are its mixture's log-probabilities."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .ensemble import Steps


def penalized(scores: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """[R, V] scores, the tokens each row has seen [R, V] (bool)."""
    return torch.where(seen, torch.where(scores < 0, scores * penalty, scores / penalty), scores)


def seen_tokens(rows: int, vocab: int, *token_lists: torch.Tensor) -> torch.Tensor:
    """[rows, vocab] True where a row's tokens ([rows, n] each) hold the token; ids past the vocabulary
    (no candidate's) left out."""
    seen = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=token_lists[0].device)
    for tokens in token_lists:
        seen.scatter_(1, tokens.clamp(max=vocab), True)
    return seen[:, :vocab]


class PenalizedSteps:
    """Beam search's steps (runtime/beam_search.py) with their log-probabilities penalized: each hypothesis
    [R, t] (a placeholder start, then its tokens) and its prompt are the tokens it has seen."""

    def __init__(self, steps: Steps, prompts: torch.Tensor, penalty: float) -> None:
        self.steps, self.prompts, self.penalty = steps, prompts, penalty   # prompts [R, P], a row each
        self.cached = steps.cached

    def log_probs(self, sequences: torch.Tensor) -> torch.Tensor:
        scores = self.steps.log_probs(sequences)
        seen = seen_tokens(scores.size(0), scores.size(1), self.prompts, sequences[:, 1:])
        return penalized(scores, seen, self.penalty)

    def keep(self, rows: torch.Tensor) -> None:
        self.prompts = self.prompts[rows]
        self.steps.keep(rows)

    def reorder(self, rows: torch.Tensor) -> None:
        self.steps.reorder(rows)
