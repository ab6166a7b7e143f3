"""Sampling continuations from a decoder-only model: temperature, then the filters transformers' sampling
applies, in its order: top-k, top-p (nucleus), min-p, typical, epsilon and eta.

Each prompt draws from a random stream of its own, seeded by (seed, the prompt's index), and a token is
drawn by inverting the cumulative distribution at a uniform number from that stream: the same seed
gives the same continuation of a prompt whatever else is in its batch. With top_k = 1 every draw is the
most likely token: greedy decoding.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import torch

from xspec.compiler.sections import DecodeSection
from .beam_search import LanguageModelSteps, output_module
from .ensemble import ModelOrEnsemble, ensemble_steps, members
from .score_rules import ScoreRules
from .top_k import top_k
from .vocab import BOS, EOS, PAD


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: float = 1.0
    min_p: Optional[float] = None
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0

    @classmethod
    def of(cls, d: DecodeSection) -> Sampling:
        """A decode section's (compiler/sections.py); its top_k 0 is none."""
        return cls(d.temperature, d.top_k or None, d.top_p, d.min_p, d.typical_p, d.epsilon_cutoff, d.eta_cutoff)


def sampling_choice(spec: DecodeSection, sample: Optional[bool], beam: Optional[int]) -> dict:
    """The decode settings a generate call's `sample` and `beam` (or its flags') give over the spec's (None:
    the spec's): a beam alone is beam search, `sample=False` alone greedy, sampling with a beam beam sampling,
    and sampling turned on alone draws one continuation a prompt (a spec that samples keeps its way)."""
    if sample is False or (sample is None and beam is not None):
        return {"sample": False, "beam": 1 if beam is None else beam, "beam_sampling": False}
    if sample and beam is not None:
        return {"sample": True, "beam": beam, "beam_sampling": beam > 1}
    if sample and not spec.sample:
        return {"sample": True, "beam_sampling": False}
    return {}


def filtered_probabilities(logits: torch.Tensor, sampling: Sampling,
                           never: tuple[int, ...] = (PAD, BOS)) -> torch.Tensor:
    """[R, V] logits -> [R, V] probabilities (in float32), as `filtered_logits` leaves them."""
    return filtered_logits(logits, sampling, never).softmax(dim=-1)


def filtered_logits(logits: torch.Tensor, sampling: Sampling, never: tuple[int, ...] = (PAD, BOS),
                    keep: int = 1) -> torch.Tensor:
    """[R, V] logits (float32) divided by the temperature, then only the `top_k` most likely tokens kept, the
    smallest most-likely set whose probability reaches `top_p`, the tokens at least `min_p` times as likely
    as the most likely, the locally typical set of mass `typical_p`, and those of probability at least
    `epsilon_cutoff` or eta's bound; the others -inf. Each filter reads what the ones before left
    (renormalized) and keeps `keep` tokens at least (the most likely; typical's, the most typical), as
    transformers' warpers do with their min_tokens_to_keep (in beam sampling: the end tokens and another)."""
    logits = logits.float() / sampling.temperature
    logits[:, list(never)] = float("-inf")        # never a token of the text (xspec's PAD and BOS)
    if sampling.top_k is not None and max(sampling.top_k, keep) < logits.size(-1):
        kth = top_k(logits, max(sampling.top_k, keep))[0][:, -1:]           # [R, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        # A token is dropped when the more likely ones already reach top_p (the most likely `keep` are kept).
        dropped = probs.cumsum(dim=-1) - probs >= sampling.top_p
        dropped[:, :keep] = False
        logits = logits.scatter(1, order, ordered.masked_fill(dropped, float("-inf")))
    if sampling.min_p is not None:
        probs = logits.softmax(dim=-1)
        logits = _keeping_the_likeliest(logits, probs < sampling.min_p * probs.amax(dim=-1, keepdim=True), keep)
    if sampling.typical_p < 1.0:
        logits = _typical(logits, sampling.typical_p, keep)
    if 0.0 < sampling.epsilon_cutoff:
        logits = _keeping_the_likeliest(logits, logits.softmax(dim=-1) < sampling.epsilon_cutoff, keep)
    if 0.0 < sampling.eta_cutoff:
        eta = torch.tensor(sampling.eta_cutoff, device=logits.device)
        entropy = torch.distributions.Categorical(logits=logits).entropy()[:, None]
        bound = torch.minimum(eta, eta.sqrt() * torch.exp(-entropy))
        logits = _keeping_the_likeliest(logits, logits.softmax(dim=-1) < bound, keep)
    return logits


def _keeping_the_likeliest(logits: torch.Tensor, dropped: torch.Tensor, keep: int) -> torch.Tensor:
    """`logits` with the `dropped` tokens at -inf, but for each row's `keep` most likely tokens."""
    dropped = dropped.scatter(1, top_k(logits, keep)[1], False)
    return logits.masked_fill(dropped, float("-inf"))


def _typical(logits: torch.Tensor, mass: float, keep: int) -> torch.Tensor:
    """Locally typical sampling (Meister et al., 2023): the tokens whose information, -log p, is nearest the
    distribution's entropy, taken nearest first until their probability reaches `mass` (the first `keep`
    always)."""
    log_probs = logits.log_softmax(dim=-1)
    entropy = -(log_probs * log_probs.exp()).nansum(dim=-1, keepdim=True)
    distance, order = (-log_probs - entropy).abs().sort(dim=-1)
    reached = logits.gather(1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (reached < mass).sum(dim=1, keepdim=True).clamp(max=logits.size(1) - 1)
    dropped = distance > distance.gather(1, last)
    dropped[:, :keep] = False
    return logits.masked_fill(dropped.scatter(1, order, dropped), float("-inf"))


class Drawing:
    """A search's candidates drawn rather than taken best first (runtime/beam_search.py's `Selection`), as
    transformers' generate draws them with do_sample: each hypothesis's scores are its log-probabilities
    tempered and filtered (`filtered_logits`, keeping `keep` tokens at least: in beam sampling, the end
    tokens and another). With one beam, one token is drawn a step, as sampling draws it; with K beams
    (beam sampling), 2K of a sentence's extensions, without replacement, each as likely as the softmax of
    its hypothesis's summed scores, by the Gumbel-top-k rule. Each sentence draws from streams of its own,
    seeded by (seed, its index), as `sample`'s: the same seed draws the same output whatever else is in
    the batch."""

    def __init__(self, sampling: Sampling, seed: int, indices: list[int], device: torch.device,
                 never: tuple[int, ...] = (PAD, BOS), keep: int = 1) -> None:
        self.sampling, self.never, self.keep = sampling, never, keep
        seeds = stream_seeds(seed, indices)
        self.streams = [random.Random(each) for each in seeds]                    # one draw a step
        self.generators = [torch.Generator(device=device).manual_seed(each) for each in seeds]  # Gumbel noise

    @classmethod
    def of(cls, d: DecodeSection, seed: int, indices: list[int], device: torch.device,
           never: tuple[int, ...], ends: int = 1) -> Optional[Drawing]:
        """How a decode section's search draws its outputs' tokens; None where it does not sample. Beams keep
        a token besides the `ends` end tokens (transformers' min_tokens_to_keep there)."""
        return cls(Sampling.of(d), seed, indices, device, never, keep=1 + ends if d.searched_beams > 1 else 1) \
            if d.sample else None

    def warped(self, log_probs: torch.Tensor) -> torch.Tensor:
        return filtered_logits(log_probs, self.sampling, self.never, self.keep)

    def choose(self, candidates: torch.Tensor, count: int, sentences: list[int]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if count == 1:
            drawn = draw(candidates.softmax(dim=-1), [self.streams[s].random() for s in sentences])[:, None]
            return candidates.gather(1, drawn), drawn
        uniform = torch.stack([torch.rand(candidates.size(1), generator=self.generators[s],
                                          device=candidates.device) for s in sentences])     # [A, N]
        keys = candidates - torch.log(-torch.log(uniform))                      # + Gumbel(0, 1) noise
        drawn = keys.topk(count, dim=1).indices
        scores, order = candidates.gather(1, drawn).sort(dim=1, descending=True)
        return scores, drawn.gather(1, order)


def stream_seeds(seed: int, indices: Iterable[int]) -> list[int]:
    """The seed of each numbered prompt's (or line's) random stream: a seed draws the same output for a prompt
    whatever else is in its batch."""
    return [seed * 1_000_003 + i for i in indices]


def draw(probabilities: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """[R, V] probabilities, one uniform number in [0, 1) per row -> [R] tokens."""
    cumulative = probabilities.double().cumsum(dim=-1)                      # [R, V]
    targets = torch.tensor(uniforms, dtype=torch.float64, device=probabilities.device) * cumulative[:, -1]
    tokens = torch.searchsorted(cumulative, targets[:, None], right=True)[:, 0]
    return tokens.clamp(max=probabilities.size(-1) - 1)


@torch.no_grad()
def sample(model: ModelOrEnsemble, prompts: torch.Tensor, max_new_tokens: int, sampling: Optional[Sampling],
           seed: int = 0, indices: Optional[list[int]] = None,
           on_tokens: Optional[Callable[[list[int], list[int]], None]] = None, end_token: int = EOS,
           never: tuple[int, ...] = (PAD, BOS), vocab_size: Optional[int] = None,
           also_end: tuple[int, ...] = (), rules: ScoreRules = ScoreRules(),
           padding: Optional[torch.Tensor] = None, output_head: Optional[str] = None) -> list[list[int]]:
    """Continuations (without EOS) of `prompts` [B, P] (each starting with EOS), up to `max_new_tokens`
    tokens, by a model or an ensemble (a list of models: their mixture, runtime/ensemble.py); `sampling`
    None is greedy. `indices` number the prompts for their random streams (default 0..B-1).
    `on_tokens(rows, tokens)` hears each step's new tokens of the rows still going. A continuation stops
    at `end_token` (or any of `also_end`), and the tokens `never` are never chosen (a checkpoint's own
    tokenizer has its own), nor
    any beyond the first `vocab_size` (a model may have more embedding rows than the vocabulary pieces).
    `rules` (runtime/score_rules.py: a repetition penalty, n-gram bans, a least length) apply to the logits.
    `padding` [B]: prompts of different lengths, each padded on the left by so many positions
    (runtime/cache.py; no rule may read them then). `output_head`: the path of the module that makes a
    single model's logits (CompiledSpec.output_head), which the prompts' pass has make the last position's alone."""
    B = prompts.size(0)
    if rules.any and padding is not None:
        raise ValueError("score rules read the prompts: they are not padded")
    streams = [random.Random(each) for each in stream_seeds(seed, indices if indices is not None else range(B))]
    head = output_module(model, output_head)
    steps = ensemble_steps([LanguageModelSteps(m, prompts, 1, True, vocab_size, padding, max_new_tokens, head)
                            for m in members(model)])
    so_far = prompts                                                        # each active row's tokens

    def next_log_probs(inputs: torch.Tensor, new: int) -> torch.Tensor:
        if not rules.any:
            return steps.log_probs(inputs)
        scores = steps.logits(inputs) if isinstance(steps, LanguageModelSteps) else steps.log_probs(inputs)
        return torch.log_softmax(rules.apply(scores, so_far, new), dim=-1)

    log_probs = next_log_probs(prompts[:, -1:], 0)                          # [A, V]: the first call reads the prompts
    going = list(range(B))                                                  # the prompt of each active row
    results: list[list[int]] = [[] for _ in range(B)]
    for step in range(max_new_tokens):
        if sampling is None:
            log_probs[:, list(never)] = float("-inf")
            tokens = log_probs.argmax(dim=-1)
        else:
            # Log-probabilities are logits of the same distribution (softmax(log p / T) is p tempered).
            tokens = draw(filtered_probabilities(log_probs, sampling, never), [streams[b].random() for b in going])
        if rules.any:
            so_far = torch.cat([so_far, tokens[:, None]], dim=1)
        chosen = tokens.tolist()                                            # the step's one wait for the device
        ended = [t == end_token or t in also_end for t in chosen]
        for b, token, end in zip(going, chosen, ended):
            if not end:
                results[b].append(token)
        if on_tokens is not None:
            on_tokens(going, chosen)
        if step == max_new_tokens - 1:
            break
        if any(ended):
            kept = [a for a, end in enumerate(ended) if not end]
            if not kept:
                break
            rows = torch.tensor(kept, device=prompts.device)
            steps.keep(rows)
            steps.reorder(rows)
            tokens, going = tokens[rows], [going[a] for a in kept]
            so_far = so_far[rows]
        log_probs = next_log_probs(tokens[:, None], step + 1)               # [A, V]
    return results
