"""Ensembles: several models with one vocabulary predicting as one.

At every step each model predicts the next token from its own encoder output and its own key/value
cache, and the ensemble's probability of a token is the mean of the models' probabilities: a mixture,
as fairseq's `EnsembleModel` takes it (logsumexp of the log-probabilities minus log M). It is a
distribution again, and an ensemble of a model with itself is that model. Scores of text under an
ensemble (`xspec eval`, `score`) mix token by token the same way, so they measure what decoding
maximises.

`mixture_log_probs` is the one place that average is taken.
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence, Union

import torch

ModelOrEnsemble = Union[torch.nn.Module, list[torch.nn.Module], tuple[torch.nn.Module, ...]]


def members(model: ModelOrEnsemble) -> list[torch.nn.Module]:
    """The models of an ensemble (a list or tuple of models), or the one model."""
    return list(model) if isinstance(model, (list, tuple)) else [model]


def eval_members(model: ModelOrEnsemble) -> list[torch.nn.Module]:
    """The models of `model` (`members`), each put in evaluation mode (no dropout) for decoding or scoring."""
    return [m.eval() for m in members(model)]


def mixture_log_probs(log_probs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The ensemble's log-probabilities from each model's (tensors of one shape): log of the mean probability."""
    stacked = torch.stack(list(log_probs))                                   # [M, ...]
    return torch.logsumexp(stacked, dim=0) - math.log(stacked.size(0))       # [...]


class Steps(Protocol):
    """What beam search drives (runtime/beam_search.py: EncoderDecoderSteps, LanguageModelSteps)."""

    cached: bool

    def logits(self, sequences: torch.Tensor) -> torch.Tensor:
        """[R, t] hypotheses -> [R, V] scores of their next token before normalization (an ensemble's:
        its mixture's log-probabilities)."""
        ...

    def log_probs(self, sequences: torch.Tensor) -> torch.Tensor: ...

    def keep(self, rows: torch.Tensor) -> None: ...

    def reorder(self, rows: torch.Tensor) -> None: ...


class EnsembleSteps:
    """Several models' steps as one: each keeps its own memory and cache; rows leave and move in all."""

    def __init__(self, steps: Sequence[Steps]) -> None:
        assert len(steps) > 1, "a single model decodes without an ensemble"
        self.steps = list(steps)
        self.cached = all(s.cached for s in self.steps)

    def logits(self, sequences: torch.Tensor) -> torch.Tensor:
        return self.log_probs(sequences)

    def log_probs(self, sequences: torch.Tensor) -> torch.Tensor:
        """[R, t] hypotheses -> [R, V] the ensemble's log-probabilities of their next token."""
        each = [s.log_probs(sequences) for s in self.steps]                  # M x [R, V_m]
        # Embeddings may have rows beyond the shared sentencepiece vocabulary (which fits every model):
        # tokens past the smallest are no pieces of it.
        vocab = min(x.size(-1) for x in each)
        return mixture_log_probs([x[:, :vocab] for x in each])

    def keep(self, rows: torch.Tensor) -> None:
        for s in self.steps:
            s.keep(rows)

    def reorder(self, rows: torch.Tensor) -> None:
        for s in self.steps:
            s.reorder(rows)


def ensemble_steps(steps: Sequence[Steps]) -> Steps:
    """One model's steps as they are (no extra work), several averaged."""
    return steps[0] if len(steps) == 1 else EnsembleSteps(steps)
