"""The unigram floor: how well a model does that knows the training data's token frequencies and nothing
else. A language model's run reports it beside its test perplexity; the Table 3 sweep judges from it
whether a model learned. Plain Python (no torch), so the sweep's report can use it cheaply."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence

from xspec.base.errors import UserError


def token_counts(sequences: Iterable[Sequence[int]]) -> Counter[int]:
    return Counter(token for sequence in sequences for token in sequence)


def unigram_perplexity(counts: Counter[int], dev: Iterable[Sequence[int]], vocab_size: int) -> float:
    """Perplexity of the dev sequences' tokens under the frequencies `counts`, add-one smoothed over the
    vocabulary. Each sequence is its token ids as the loss counts them (with the EOS that ends it)."""
    total = sum(counts.values()) + vocab_size
    tokens = [token for sequence in dev for token in sequence]
    if not tokens:
        raise UserError("the dev text is empty: there is no perplexity to judge a model by")
    return math.exp(-statistics.fmean(math.log((counts[t] + 1) / total) for t in tokens))
