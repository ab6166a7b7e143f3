"""Greedy decoding that drafts with the model's own multi-token prediction (DeepSeek-V3 §2.2, after
Leviathan et al., 2023): the depths propose the next tokens, and one pass of the model over them keeps
those it would have chosen itself, then adds its own next token. The continuation is greedy decoding's;
what drafting saves is one pass of the model per accepted token.

At each step, with tokens x_0 .. x_{m-1} settled (x_{m-1} not yet read by the model): depth j, at position
m - 2, reads depth j - 1's state there and x_{m-2+j}, and proposes x_{m-1+j} (depth 1 reads the state the
model's head read). Each depth decodes with a cache of its own holding the positions whose inputs are
settled tokens; positions that read a draft are appended, then dropped (the cache's length set back), as
the model's cache drops the drafts the model rejects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn

from xspec.nn.contracts import CachedDecoder, RecurrentMixer
from .cache import new_cache
from .multi_token import HeadReads


@dataclass
class Drafts:
    """Tokens proposed by the depths, and those the model accepted, over a decoding run."""

    proposed: int = 0
    accepted: int = 0

    @property
    def rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def __str__(self) -> str:
        return (f"speculative decoding: {self.accepted:,} of {self.proposed:,} drafted tokens accepted "
                f"({self.rate:.1%})")


def can_draft(model: nn.Module) -> bool:
    """Rejected drafts are dropped by setting the caches' length back, which a recurrent layer's state (kept
    whole, not per position: a RecurrentMixer, xspec/nn/contracts.py) cannot follow: a model with one decodes
    without drafting."""
    return not any(isinstance(module, RecurrentMixer) for module in model.modules())


class _Chooser:
    """The greedy choice from logits, exactly as runtime/sampling.py makes it: log-probabilities over the
    first `vocab_size` tokens, never the tokens `never`, the first of equal maxima."""

    def __init__(self, vocab_size: Optional[int], never: tuple[int, ...]) -> None:
        self.vocab_size, self.never = vocab_size, list(never)

    def __call__(self, logits: torch.Tensor) -> list[int]:
        """[N, V] logits -> N tokens."""
        log_probs = torch.log_softmax(logits[:, :self.vocab_size].float(), dim=-1)
        log_probs[:, self.never] = float("-inf")
        return log_probs.argmax(dim=-1).tolist()


@torch.no_grad()
def speculative_greedy(model: nn.Module, depths: nn.ModuleList, head: nn.Module, prompt: torch.Tensor,
                       max_new_tokens: int, end_token: int, never: tuple[int, ...], vocab_size: Optional[int],
                       drafts: Drafts, on_token: Optional[Callable[[int], None]] = None,
                       also_end: tuple[int, ...] = ()) -> list[int]:
    """The greedy continuation (without the end token, or any of `also_end`) of one prompt [1, P], drafting
    with `depths` (the model's `mtp`) through `head` (the module that makes its logits). `drafts` counts the
    proposals and acceptances; `on_token` hears each token of the continuation as it is settled."""
    ends = (end_token, *also_end)
    choose = _Chooser(vocab_size, never)
    if not isinstance(model, CachedDecoder):
        raise TypeError(f"{type(model).__name__} has no decode(tokens, cache=...) to draft with")
    reads = HeadReads(head)
    try:
        positions = prompt.size(1) + max_new_tokens + len(depths)   # the last check may draft past the end
        cache = new_cache(model, positions)
        logits = model.decode(prompt, cache=cache)                       # [1, P, V]
        levels = [reads.take()]           # each depth's states at the settled positions (0: the model's)
        depth_caches = [new_cache(model, positions) for _ in depths]
        tokens = prompt[0].tolist()
        continuation: list[int] = []
        token = choose(logits[:, -1])[0]
        while True:
            if token in ends:
                return continuation
            continuation.append(token)
            tokens.append(token)
            if on_token is not None:
                on_token(token)
            room = max_new_tokens - len(continuation)
            if room <= 0:
                return continuation
            proposed = _draft(depths, head, depth_caches, levels, tokens, choose, min(len(depths), room - 1))
            inputs = torch.tensor([[tokens[-1], *proposed]], dtype=prompt.dtype, device=prompt.device)
            start = cache.length
            logits = model.decode(inputs, cache=cache)                   # [1, 1 + drafts, V]
            chosen = choose(logits[0])
            accepted = 0
            while accepted < len(proposed) and proposed[accepted] == chosen[accepted] and \
                    proposed[accepted] not in ends and len(continuation) + accepted < max_new_tokens:
                accepted += 1
            drafts.proposed += len(proposed)
            drafts.accepted += accepted
            cache.length = start + 1 + accepted                          # the rejected drafts' positions go
            levels[0] = torch.cat([levels[0], reads.take()[:, :1 + accepted]], dim=1)
            for draft in proposed[:accepted]:
                continuation.append(draft)
                tokens.append(draft)
                if on_token is not None:
                    on_token(draft)
            if len(continuation) >= max_new_tokens:
                return continuation
            token = chosen[accepted]
    finally:
        reads.remove()


def _draft(depths: nn.ModuleList, head: nn.Module, caches: list, levels: list[torch.Tensor], tokens: list[int],
           choose: _Chooser, count: int) -> list[int]:
    """Up to `count` tokens proposed after `tokens` (the last not yet read by the model): each depth first
    reads the positions its inputs settle (kept in `levels`), then, from the first on, those that read the
    drafts before its own (dropped again)."""
    device = levels[0].device
    m = len(tokens)
    proposed: list[int] = []
    speculative: Optional[torch.Tensor] = None  # depth j - 1's states at the positions that read drafts
    for j, (depth, cache) in enumerate(zip(depths, caches), 1):
        if j > count:
            break
        if len(levels) <= j:
            levels.append(levels[0].new_zeros(1, 0, levels[0].size(-1)))
        settled = min(m - j, levels[j - 1].size(1))  # positions 0 .. m - 1 - j read settled tokens only
        fed = levels[j].size(1)
        if settled > fed:
            read = torch.tensor([tokens[fed + j:settled + j]], device=device)
            out = depth(levels[j - 1][:, fed:settled], read, cache=cache)
            cache.length += settled - fed
            levels[j] = torch.cat([levels[j], out], dim=1)
        if j == 1:
            state = levels[1][:, -1:]
            speculative = levels[1][:, :0]
        else:
            assert speculative is not None
            # positions settled .. m - 2 read drafts: depth j - 1's states there, and the drafts
            states = torch.cat([levels[j - 1][:, settled:], speculative], dim=1)
            read = torch.tensor([(tokens + proposed)[settled + j:m - 1 + j]], device=device)
            speculative = depth(states, read, cache=cache)  # the cache's length stays: these positions go again
            state = speculative[:, -1:]
        proposed.append(choose(head(state)[0])[0])
    return proposed
