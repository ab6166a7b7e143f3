"""Translating many sentences: sorted by length into batches, beam search (or sampling), original order
restored.
The model may be an ensemble: a list of models sharing the vocabulary (runtime/ensemble.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
from tqdm import tqdm

from xspec.compiler.sections import DecodeSection
from .batching import pad
from .beam_search import Hypothesis, Scoring, beam_search
from .corpus import encode_source
from .decode_batches import in_input_order, length_sorted_chunks
from .ensemble import ModelOrEnsemble, eval_members
from .precision import choose_precision
from .sampling import Drawing
from .score_rules import ScoreRules
from .vocab import BOS, Tokenizer


def output_start(decode: DecodeSection) -> int:
    """The token an output starts from: an imported checkpoint's decoder start token, else xspec's BOS."""
    return BOS if decode.decoder_start is None else decode.decoder_start


@dataclass(frozen=True)
class Translator:
    model: ModelOrEnsemble          # a model, or a list of models decoding as an ensemble
    vocab: Tokenizer                # xspec's vocabulary, or an imported checkpoint's tokenizer
    decode: DecodeSection
    device: torch.device
    max_tokens: int                 # the model's longest sequence (its positions), source and output; an
                                    # ensemble's is its smallest model's
    batch_tokens: int = 4000        # source tokens per beam-search batch (times the beam in memory)
    prefix: str = ""                # each source's first text: a multilingual model's target language
    seed: int = 0                   # sampling: line i draws from stream (seed, first + i)

    @torch.no_grad()
    def nbest(self, lines: list[str], progress: bool = False) -> list[list[Hypothesis]]:
        results: list[list[Hypothesis]] = []
        with tqdm(total=len(lines), desc="decoding", unit="sent", disable=not progress, leave=False) as bar:
            for done in self.stream(lines):
                results += done
                bar.update(len(done))
        return results

    @torch.no_grad()
    def stream(self, lines: list[str], on_too_long: Optional[Callable[[int, int], None]] = None, first: int = 0
               ) -> Iterator[list[list[Hypothesis]]]:
        """Each line's best hypotheses, in input order, as soon as they are decoded: sentences go in
        batches of similar length, and after each batch come the results it completes (a list per line).
        A line longer than the model's positions is translated from its start, and first reported to
        `on_too_long(index, tokens)`. Sampled, line i draws from the stream of `first` + i."""
        sources, too_long = encode_source([self.prefix + line for line in lines] if self.prefix else lines,
                                          self.vocab, self.max_tokens, self.decode.source_code)
        if on_too_long is not None:
            for index, tokens in too_long:
                on_too_long(index, tokens)

        d = self.decode
        start = output_start(d)
        rules = ScoreRules.of(d, (self.vocab.document_end,), d.forced_bos)

        def translate_chunk(chunk: list[int]) -> list[list[Hypothesis]]:
            rows = [sources[i] for i in chunk]
            src = pad(rows).to(self.device)
            # padding by length: the padding id may be a real token of a checkpoint's own vocabulary
            lengths = torch.tensor([len(row) for row in rows], device=self.device)
            padding = torch.arange(src.size(1), device=self.device)[None, :] >= lengths[:, None]
            drawn = Drawing.of(d, self.seed, [first + i for i in chunk], self.device, self.vocab.never_generated)
            with choose_precision(self.device, self.decode.precision, "decode.precision").context():
                return beam_search(self.model, src, padding, d.searched_beams, Scoring.of(d), d.max_len_a,
                                   d.max_len_b, nbest=d.nbest, max_positions=self.max_tokens,
                                   vocab_size=self.vocab.target_size, start=start, end=self.vocab.document_end,
                                   never=self.vocab.never_generated, rules=rules, force_end=d.force_end,
                                   selection=drawn)

        eval_members(self.model)
        # Empty lines translate to empty lines (and cost nothing).
        results: list[Optional[list[Hypothesis]]] = [None if line.strip() else [] for line in lines]
        chunks = length_sorted_chunks((i for i, line in enumerate(lines) if line.strip()),
                                      [len(s) for s in sources], self.batch_tokens)
        yield from in_input_order(results, chunks, translate_chunk)

    def translate(self, lines: list[str], progress: bool = False) -> list[str]:
        return [self.vocab.decode(h[0].tokens) if h else "" for h in self.nbest(lines, progress)]

