"""Beam search (§6.1): beam 4, length penalty alpha = 0.6, output up to input length + 50, early stop.

Batched over sentences and beams: every tensor is [sentences, beam, ...] and one `decode` call per
step extends every hypothesis, using the decoder's key/value cache. Like the paper's implementation
(tensor2tensor), each step takes the best 2*beam extensions: those ending in EOS join the sentence's
finished set, scored by log P(Y) / lp(Y) with lp(Y) = ((5 + |Y|) / 6)^alpha (GNMT; |Y| counts EOS);
the best `beam` others stay alive. A sentence is done when no alive hypothesis can beat its worst
finished one (its log-probability can only fall, and lp is largest at the maximum length); done
sentences leave the batch. At the maximum length only EOS is allowed, so every sentence finishes.
With beam 1 this is greedy decoding: a sentence stops at its first argmax EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xspec.runtime.vocab import BOS, EOS, PAD


@dataclass
class Hypothesis:
    tokens: list[int]       # without BOS/EOS
    score: float            # log P(Y) / lp(Y)
    log_prob: float


def length_penalty(length: torch.Tensor | int, alpha: float) -> torch.Tensor | float:
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(model, src: torch.Tensor, src_padding: torch.Tensor, beam: int, alpha: float,
                max_len_a: float, max_len_b: int, nbest: int = 1, use_cache: bool = True,
                max_positions: int | None = None) -> list[list[Hypothesis]]:
    """Best `nbest` hypotheses of each sentence of `src` [B, S], best first.

    `max_positions` caps the output length where the model's positions end.
    """
    B, K, device = src.size(0), beam, src.device
    greedy = K == 1
    # Longest output (EOS included): a * source length (EOS included) + b.
    max_lens = ((~src_padding).sum(1).float() * max_len_a).long() + max_len_b
    max_lens = max_lens.clamp(min=1, max=max_positions)

    rows = torch.arange(B, device=device).repeat_interleave(K)           # [B*K] sentence of each row
    memory, memory_padding = model.encode(src, src_padding)[rows], src_padding[rows]
    cache = model.new_cache() if use_cache else None

    sentence = torch.arange(B, device=device)                            # [A] original index, A active
    alive = torch.full((B, K, 1), BOS, dtype=torch.long, device=device)  # [A, K, t]
    alive_logp = torch.full((B, K), float("-inf"), device=device)
    alive_logp[:, 0] = 0.0                                               # one real beam at the start
    finished = torch.full((B, K, 1), PAD, dtype=torch.long, device=device)
    finished_score = torch.full((B, K), float("-inf"), device=device)
    finished_logp = torch.full((B, K), float("-inf"), device=device)
    results: list[list[Hypothesis]] = [[] for _ in range(B)]

    step = 0
    while sentence.numel():
        step += 1
        A, t = alive.shape[0], alive.shape[2]
        inputs = alive.view(A * K, t)[:, -1:] if use_cache else alive.view(A * K, t)
        logits = model.decode(inputs, memory, memory_padding, cache=cache) if use_cache \
            else model.decode(inputs, memory, memory_padding)
        logp = torch.log_softmax(logits[:, -1].float(), dim=-1).view(A, K, -1)   # [A, K, V]
        V = logp.size(-1)
        logp[:, :, PAD] = float("-inf")
        logp[:, :, BOS] = float("-inf")
        at_max = max_lens[sentence] <= step                                      # [A]
        logp[at_max] = torch.where(torch.arange(V, device=device) == EOS, logp[at_max], float("-inf"))

        candidates = (alive_logp[:, :, None] + logp).view(A, K * V)
        top_logp, top = candidates.topk(min(2 * K, K * V), dim=1)               # [A, 2K]
        origin, token = top // V, top % V
        sequences = torch.cat([alive.gather(1, origin[:, :, None].expand(-1, -1, t)), token[:, :, None]], dim=2)

        # Finished set: the best K of (already finished, candidates ending in EOS).
        is_eos = token == EOS
        if greedy:
            is_eos[:, 1:] = False                        # only the argmax may end a greedy hypothesis
        eos_score = torch.where(is_eos, top_logp / length_penalty(step, alpha), float("-inf"))
        finished = torch.cat([finished, torch.full((A, K, 1), PAD, dtype=torch.long, device=device)], dim=2)
        pool_score = torch.cat([finished_score, eos_score], dim=1)
        pool_logp = torch.cat([finished_logp, torch.where(is_eos, top_logp, float("-inf"))], dim=1)
        finished_score, keep = pool_score.topk(K, dim=1)
        finished_logp = pool_logp.gather(1, keep)
        finished = torch.cat([finished, sequences], dim=1).gather(1, keep[:, :, None].expand(-1, -1, t + 1))

        # Alive set: the best K candidates that did not end.
        alive_logp, keep = torch.where(token == EOS, float("-inf"), top_logp).topk(K, dim=1)
        alive = sequences.gather(1, keep[:, :, None].expand(-1, -1, t + 1))
        beam_origin = origin.gather(1, keep)                                     # [A, K]

        if greedy:
            done = finished_score[:, 0] > float("-inf")
        else:
            best_possible = alive_logp[:, 0] / length_penalty(max_lens[sentence].float(), alpha)
            done = finished_score[:, -1] >= best_possible
        done |= at_max
        for a in done.nonzero().flatten().tolist():          # once per sentence, when it finishes
            results[sentence[a]] = _hypotheses(finished[a], finished_score[a], finished_logp[a], nbest)

        # Drop done sentences and reorder the remaining rows to follow their beams, in one step.
        active = (~done).nonzero().flatten()                                     # [A']
        reorder = (active[:, None] * K + beam_origin[active]).view(-1)           # [A'*K] rows of the old batch
        sentence, alive, alive_logp = sentence[active], alive[active], alive_logp[active]
        finished, finished_score, finished_logp = finished[active], finished_score[active], finished_logp[active]
        if active.numel() < A:  # the beams of a sentence share its memory rows: copy them only when it leaves
            rows = (active[:, None] * K + torch.arange(K, device=device)).view(-1)
            memory, memory_padding = memory[rows], memory_padding[rows]
        # Greedy rows follow no beam: the cache moves only when a sentence leaves.
        if cache is not None and sentence.numel() and not (greedy and active.numel() == A):
            cache.reorder(reorder)
    return results


def _hypotheses(tokens: torch.Tensor, scores: torch.Tensor, log_probs: torch.Tensor, nbest: int) -> list[Hypothesis]:
    out = []
    for row, score, logp in zip(tokens.tolist(), scores.tolist(), log_probs.tolist()):
        if score == float("-inf") or len(out) == nbest:
            break
        out.append(Hypothesis([x for x in row if x not in (PAD, BOS, EOS)], score, logp))
    return out
