"""Continuing many prompts with a decoder-only model: prompts of similar lengths batched together, the
shorter padded on the left where the model allows (else prompts of one length), beam search or sampling,
results in input order as soon as they are done."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, Iterator, Optional

import torch

from xspec.base.errors import UserError
from xspec.compiler.sections import DecodeSection
from .beam_search import Scoring, continue_prompts
from .decode_batches import in_input_order, length_sorted_chunks
from .cache import pads_rows
from .ensemble import ModelOrEnsemble, eval_members, members
from .multi_token import prediction_depths
from .precision import choose_precision
from .sampling import Drawing, Sampling, sample
from .score_rules import ScoreRules
from .speculative import Drafts, can_draft, speculative_greedy
from .vocab import EOS, Tokenizer


@dataclass(frozen=True)
class Generator:
    model: ModelOrEnsemble          # one model, or several as an ensemble (runtime/ensemble.py)
    vocab: Tokenizer                # xspec's vocabulary, or an imported checkpoint's tokenizer
    decode: DecodeSection
    device: torch.device
    max_tokens: int                 # the model's positions: prompt and continuation together
    batch_tokens: int = 4000        # prompt tokens per batch
    seed: int = 0
    output_head: Optional[str] = None  # the module that makes the logits, which multi-token prediction shares
    drafts: Drafts = field(default_factory=Drafts)  # speculative decoding's proposals and acceptances so far
    chat: bool = False              # each prompt a user's message in the checkpoint's chat template
    system: Optional[str] = None    # with `chat`: a system message before each

    def __post_init__(self) -> None:
        d, ids = self.decode, len(self.vocab)
        for key, tokens in (("suppress_tokens", d.suppress_tokens), ("begin_suppress_tokens", d.begin_suppress_tokens)):
            outside = [token for token in tokens if token >= ids]
            if outside:
                raise UserError(f"decode.{key}: {outside[0]} is not a token id (the vocabulary has {ids:,})")

    @property
    def sampling(self) -> Optional[Sampling]:
        """How tokens are drawn (beam sampling's candidates too); None: beam search (beam 1: greedy)."""
        return Sampling.of(self.decode) if self.decode.sample else None

    def prompt_tokens(self, lines: list[str]) -> tuple[list[list[int]], list[tuple[int, int]]]:
        """Each prompt as the model reads it (the tokenizer's encode_prompts: xspec's vocabulary starts it with
        EOS, the start of a document; a checkpoint's tokenizer encodes it as its own does), and the (index,
        tokens) of those too long to leave room for a new token: they keep their first token where it is
        the document's start, and their last ones. A prompt of no tokens at all is the start alone. With
        `chat`, each prompt is a user's message rendered by the checkpoint's chat template."""
        room = self.max_tokens - 1
        start = self.vocab.document_start
        prompts, too_long = [], []
        encoded = self.vocab.encode_chat(lines, self.system) if self.chat else self.vocab.encode_prompts(lines)
        for i, ids in enumerate(encoded):
            ids = ids or [start]
            if len(ids) > room:
                too_long.append((i, len(ids)))
                head = ids[:1] if ids[0] in (start, self.vocab.bos_id) else []
                ids = head + ids[len(ids) - room + len(head):]
            prompts.append(ids)
        return prompts, too_long

    @torch.no_grad()
    def stream(self, lines: list[str], on_too_long: Optional[Callable[[int, int], None]] = None, first: int = 0,
               on_tokens: Optional[Callable[[list[int]], None]] = None) -> Iterator[list[list[int]]]:
        """Each prompt's continuation (token ids), in input order, as soon as it and those before it are
        done. `first` numbers the first line for the random streams of sampling (line i draws from stream
        first + i). `on_tokens(ids so far)` follows the continuation of a single prompt token by token
        (not with beam search)."""
        prompts, too_long = self.prompt_tokens(lines)
        if on_too_long is not None:
            for index, tokens in too_long:
                on_too_long(index, tokens)
        follow = _follower(on_tokens, self.vocab.end_tokens) if on_tokens is not None and len(lines) == 1 else None

        def continue_chunk(chunk: list[int]) -> list[list[int]]:
            longest = max(len(prompts[i]) for i in chunk)
            pads = [longest - len(prompts[i]) for i in chunk]
            # Shorter prompts padded on the left (with their own first token: any id serves, none is seen).
            rows = [[prompts[i][0]] * pad + prompts[i] for i, pad in zip(chunk, pads)]
            batch = torch.tensor(rows, dtype=torch.long, device=self.device)  # [B, P]
            padding = torch.tensor(pads, device=self.device) if any(pads) else None
            return self._continue(batch, [first + i for i in chunk], follow, padding)

        eval_members(self.model)
        lengths = [len(p) for p in prompts]
        # Prompts whose room for new tokens is all of max_new_tokens share batches of any lengths where the
        # models allow it: a longer one beside them then takes none of their room.
        padded = self.pads_prompts()
        free = [padded and n <= self.max_tokens - self.decode.max_new_tokens for n in lengths]
        chunks = chain(length_sorted_chunks([i for i, f in enumerate(free) if f], lengths, self.batch_tokens),
                       length_sorted_chunks([i for i, f in enumerate(free) if not f], lengths, self.batch_tokens,
                                            equal_length=True))
        results: list[Optional[list[int]]] = [None] * len(lines)
        yield from in_input_order(results, chunks, continue_chunk)

    def pads_prompts(self) -> bool:
        """Whether prompts of different lengths decode in one batch, padded on the left (runtime/cache.py):
        where every model keeps its positions in the runtime's cache (no recurrent state, no cache of its
        own), no score rule reads the prompts, and no drafting decodes them one at a time."""
        models = members(self.model)
        return all(pads_rows(m) for m in models) and not self._rules().any and self._drafting_depths() is None

    def _rules(self) -> ScoreRules:
        return ScoreRules.of(self.decode, self.vocab.end_tokens)

    def _drafting_depths(self) -> Optional[torch.nn.ModuleList]:
        """The multi-token prediction depths greedy decoding drafts with (runtime/speculative.py), or None."""
        d, single = self.decode, self.model if isinstance(self.model, torch.nn.Module) else None
        if d.sample or d.beam != 1 or not d.speculative or single is None or not self.output_head \
                or self._rules().any or not can_draft(single):  # drafting applies none of the rules
            return None
        return prediction_depths(single)

    def _continue(self, batch: torch.Tensor, indices: list[int], follow,
                  padding: Optional[torch.Tensor] = None) -> list[list[int]]:
        d = self.decode
        with choose_precision(self.device, self.decode.precision, "decode.precision").context():
            depths = self._drafting_depths()
            end, *also_end = self.vocab.end_tokens
            rules = self._rules()
            if depths is not None:
                return self._speculative(batch, depths, follow)
            if d.searched_beams == 1:
                room = min(d.max_new_tokens, self.max_tokens - batch.size(1) + 1)
                return sample(self.model, batch, room, self.sampling, self.seed, indices, follow,
                              end_token=end, never=self.vocab.never_generated, vocab_size=len(self.vocab),
                              also_end=tuple(also_end), rules=rules, padding=padding, output_head=self.output_head)
            drawn = Drawing.of(d, self.seed, indices, batch.device, self.vocab.never_generated,
                               len(self.vocab.end_tokens))
            hyps = continue_prompts(self.model, batch, d.beam, Scoring.of(d), d.max_new_tokens,
                                    max_positions=self.max_tokens, vocab_size=len(self.vocab),
                                    end=end, never=self.vocab.never_generated, also_end=tuple(also_end),
                                    rules=rules, padding=padding, selection=drawn, output_head=self.output_head)
        return [h[0].tokens if h else [] for h in hyps]

    def _speculative(self, batch: torch.Tensor, depths: torch.nn.ModuleList, follow) -> list[list[int]]:
        """Greedy continuations drafted by the model's multi-token prediction (runtime/speculative.py), one
        prompt at a time: each accepts its own number of drafts per step."""
        assert isinstance(self.model, torch.nn.Module) and self.output_head is not None
        head = self.model.get_submodule(self.output_head)
        room = min(self.decode.max_new_tokens, self.max_tokens - batch.size(1) + 1)
        results = []
        end, *also_end = self.vocab.end_tokens
        for row in range(batch.size(0)):
            heard = (lambda token: follow([0], [token])) if follow is not None else None
            results.append(speculative_greedy(self.model, depths, head, batch[row:row + 1], room, end,
                                              self.vocab.never_generated, len(self.vocab), self.drafts, heard,
                                              also_end=tuple(also_end)))
        return results

    def generate(self, lines: list[str]) -> list[str]:
        return [self.vocab.decode(ids) for done in self.stream(lines) for ids in done]


def _follower(on_tokens: Callable[[list[int]], None], ends: tuple[int, ...] = (EOS,)
              ) -> Callable[[list[int], list[int]], None]:
    """A `sample` listener for one prompt: calls on_tokens with its continuation so far at each new token."""
    so_far: list[int] = []

    def follow(rows: list[int], tokens: list[int]) -> None:
        if tokens[0] not in ends:
            so_far.append(tokens[0])
            on_tokens(so_far)

    return follow
