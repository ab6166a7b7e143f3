"""transformers' logits processors for generation_config.json's settings (runtime/score_rules.py): a
repetition penalty, n-gram bans, least lengths and suppressed tokens, against a token-by-token reference
written here, in greedy decoding (on the logits) and beam search (on the log-probabilities)."""

import torch

from xspec.runtime.beam_search import LanguageModelSteps, continue_prompts
from xspec.runtime.sampling import sample
from xspec.runtime.score_rules import ScoreRules

END = 11


class Bigram(torch.nn.Module):
    """A language model whose next token's logits depend on the last token only; END is unlikely, but
    after a 6 it is all but certain."""

    def __init__(self, vocab: int = 12) -> None:
        super().__init__()
        torch.manual_seed(3)
        table = torch.randn(vocab, vocab) * 3
        table[:, END] = -8.0
        table[6, END] = 20.0
        self.table = torch.nn.Parameter(table)

    def decode(self, tokens, cache=None):
        if cache is not None:
            cache.length += tokens.size(1)
        return self.table[tokens]


def test_seen_scores_are_divided_where_positive_and_multiplied_where_negative():
    scores = torch.tensor([[2.0, -2.0, 3.0, -1.0]])
    penalized = ScoreRules(repetition_penalty=2.0).apply(scores, torch.tensor([[0, 1, 9]]), 0)  # 9: past them
    assert penalized.tolist() == [[1.0, -4.0, 3.0, -1.0]]


def test_an_ngram_is_never_repeated_and_no_end_comes_early():
    scores = torch.zeros(1, 6)
    # the bigrams (1, 2) and (1, 4) are held: after a 1, neither 2 nor 4
    banned = ScoreRules(no_repeat_ngram_size=2).apply(scores, torch.tensor([[1, 2, 3, 1, 4, 1]]), 0)
    assert banned.isinf().nonzero()[:, 1].tolist() == [2, 4]
    assert not ScoreRules(no_repeat_ngram_size=3).apply(scores, torch.tensor([[1, 2]]), 0).isinf().any()
    held = ScoreRules(min_new_tokens=2, ends=(5, 3)).apply(scores, torch.tensor([[1]]), 1)
    assert held.isinf().nonzero()[:, 1].tolist() == [3, 5]
    assert not ScoreRules(min_new_tokens=2, ends=(5,)).apply(scores, torch.tensor([[1]]), 2).isinf().any()
    short = ScoreRules(min_length=3, ends=(5,)).apply(scores, torch.tensor([[1, 2]]), 0)
    assert short.isinf().nonzero()[:, 1].tolist() == [5]
    assert not ScoreRules(min_length=3, ends=(5,)).apply(scores, torch.tensor([[1, 2, 3]]), 0).isinf().any()
    assert ScoreRules(suppress=(1, 9)).apply(scores, torch.tensor([[0]]), 4).isinf().nonzero()[:, 1].tolist() == [1]
    begin = ScoreRules(begin_suppress=(2,))
    assert begin.apply(scores, torch.tensor([[0]]), 0)[0, 2].isinf()
    assert not begin.apply(scores, torch.tensor([[0]]), 1).isinf().any()


def reference(model: Bigram, prompt: list[int], steps: int, rules: ScoreRules, on_logits: bool) -> list[int]:
    """One token at a time, the rules over the prompt and the tokens so far, on the logits (greedy) or on
    the log-probabilities (beam search), as transformers' processors see them."""
    tokens = list(prompt)
    for new in range(steps):
        scores = model.table[tokens[-1]].detach().clone()
        scores = scores if on_logits else torch.log_softmax(scores, -1)
        for token in set(tokens):
            penalty = rules.repetition_penalty
            scores[token] = scores[token] * penalty if scores[token] < 0 else scores[token] / penalty
        n = rules.no_repeat_ngram_size
        for i in range(len(tokens) - n + 1 if n else 0):
            if tokens[i:i + n - 1] == tokens[len(tokens) - n + 1:]:
                scores[tokens[i + n - 1]] = float("-inf")
        if new < rules.min_new_tokens or len(tokens) < rules.min_length:
            scores[END] = float("-inf")
        for token in (*rules.suppress, *(rules.begin_suppress if new == 0 else ())):
            scores[token] = float("-inf")
        tokens.append(int(scores.argmax()))
        if tokens[-1] == END:
            break
    return [t for t in tokens[len(prompt):] if t != END]


def test_greedy_decoding_and_beam_search_apply_the_rules_to_what_each_row_holds():
    model = Bigram()
    prompts = torch.tensor([[4, 5, 6], [7, 7, 2]])
    cases = [ScoreRules(), ScoreRules(repetition_penalty=1.8), ScoreRules(repetition_penalty=0.6),
             ScoreRules(repetition_penalty=6.0), ScoreRules(no_repeat_ngram_size=2, ends=(END,)),
             ScoreRules(no_repeat_ngram_size=1, ends=(END,)), ScoreRules(min_new_tokens=5, ends=(END,)),
             ScoreRules(min_new_tokens=8, ends=(END,)),
             ScoreRules(repetition_penalty=6.0, min_new_tokens=8, ends=(END,)),
             ScoreRules(no_repeat_ngram_size=2, min_new_tokens=8, ends=(END,)),
             ScoreRules(min_length=9, ends=(END,)), ScoreRules(suppress=(0, 3), ends=(END,)),
             ScoreRules(begin_suppress=(END, 3), ends=(END,))]
    for rules in cases:
        greedy = sample(model, prompts, 8, None, end_token=END, never=(), rules=rules)
        one_beam = [h[0].tokens[:-1] if h[0].tokens[-1:] == [END] else h[0].tokens for h in continue_prompts(
            model, prompts, 1, 0.0, 8, end=END, never=(), rules=rules)]
        for row, prompt in enumerate(prompts.tolist()):
            assert greedy[row] == reference(model, prompt, 8, rules, on_logits=True), rules
            assert one_beam[row] == reference(model, prompt, 8, rules, on_logits=False), rules
    plain = sample(model, prompts, 8, None, end_token=END, never=())
    assert plain[0] == []                                                    # the prompt ends in a 6
    assert len(sample(model, prompts, 8, None, end_token=END, never=(),
                      rules=ScoreRules(min_new_tokens=5, ends=(END,)))[0]) >= 5
    held = sample(model, prompts, 8, None, end_token=END, never=(), rules=ScoreRules(min_new_tokens=8, ends=(END,)))
    for rules in (ScoreRules(repetition_penalty=6.0, min_new_tokens=8, ends=(END,)),
                  ScoreRules(no_repeat_ngram_size=2, min_new_tokens=8, ends=(END,))):
        assert sample(model, prompts, 8, None, end_token=END, never=(), rules=rules) != held


def test_the_logits_are_the_log_probabilities_before_their_softmax():
    model = Bigram()
    logits = LanguageModelSteps(model, torch.tensor([[1, 2]]), 1, True).logits(torch.tensor([[0]]))
    again = LanguageModelSteps(model, torch.tensor([[1, 2]]), 1, True)
    assert torch.allclose(again.log_probs(torch.tensor([[0]])), torch.log_softmax(logits, -1))


def test_beam_search_that_may_not_end_before_its_maximum_ends_there_by_its_length():
    """An end held back past the maximum length (a least length beyond it, or the end suppressed): every
    beam's continuation is its maximum length, the likeliest first, where it had nothing to return."""
    model = Bigram()
    prompts = torch.tensor([[4, 5, 6], [7, 7, 2]])
    for rules in (ScoreRules(min_new_tokens=20, ends=(END,)), ScoreRules(suppress=(END,), ends=(END,))):
        for beam in (1, 3):
            found = continue_prompts(model, prompts, beam, 0.6, 5, nbest=beam, end=END, never=(), rules=rules)
            assert all(len(hyps) == beam for hyps in found), (rules, beam)
            assert all(len(h.tokens) == 5 and END not in h.tokens for hyps in found for h in hyps)
            assert all(hyps[0].score >= hyps[-1].score for hyps in found)
        greedy = sample(model, prompts, 5, None, end_token=END, never=(), rules=rules)
        assert [hyps[0].tokens for hyps in continue_prompts(model, prompts, 1, 0.6, 5, end=END, never=(),
                                                             rules=rules)] == greedy
