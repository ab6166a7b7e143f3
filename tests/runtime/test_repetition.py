"""transformers' repetition_penalty (runtime/repetition.py): the scores of seen tokens, divided where positive
and multiplied where negative; greedy decoding and beam search penalize what each row has seen, the prompt
included."""

import torch

from xspec.runtime.beam_search import LanguageModelSteps, continue_prompts
from xspec.runtime.repetition import penalized, seen_tokens
from xspec.runtime.sampling import sample

END = 11


class Bigram(torch.nn.Module):
    """A language model whose next token's logits depend on the last token only; it never ends (END)."""

    def __init__(self, vocab: int = 12) -> None:
        super().__init__()
        torch.manual_seed(3)
        table = torch.randn(vocab, vocab) * 3
        table[:, END] = -50.0
        self.table = torch.nn.Parameter(table)

    def decode(self, tokens, cache=None):
        if cache is not None:
            cache.length += tokens.size(1)
        return self.table[tokens]


def test_seen_scores_are_divided_where_positive_and_multiplied_where_negative():
    scores = torch.tensor([[2.0, -2.0, 3.0, -1.0]])
    seen = seen_tokens(1, 4, torch.tensor([[0, 1, 9]]))          # 9: past the vocabulary, left out
    assert seen.tolist() == [[True, True, False, False]]
    assert penalized(scores, seen, 2.0).tolist() == [[1.0, -4.0, 3.0, -1.0]]


def reference_greedy(model: Bigram, prompt: list[int], steps: int, penalty: float, on_logits: bool) -> list[int]:
    """One token at a time: the penalty over the prompt and the tokens so far, on the logits (greedy) or on
    the log-probabilities (beam search), as transformers' processors see them."""
    tokens = list(prompt)
    for _ in range(steps):
        scores = model.table[tokens[-1]].detach().clone()
        scores = scores if on_logits else torch.log_softmax(scores, -1)
        for token in set(tokens):
            scores[token] = scores[token] * penalty if scores[token] < 0 else scores[token] / penalty
        tokens.append(int(scores.argmax()))
    return tokens[len(prompt):]


def test_greedy_decoding_and_beam_search_penalize_what_each_row_has_seen():
    model = Bigram()
    prompts = torch.tensor([[4, 5, 6], [7, 7, 2]])
    for penalty in (1.0, 1.8, 0.6, 6.0):
        greedy = sample(model, prompts, 8, None, end_token=END, never=(), repetition_penalty=penalty)
        one_beam = [h[0].tokens for h in continue_prompts(model, prompts, 1, 0.0, 8, end=END, never=(),
                                                          repetition_penalty=penalty)]
        for row, prompt in enumerate(prompts.tolist()):
            assert greedy[row] == reference_greedy(model, prompt, 8, penalty, on_logits=True)
            assert one_beam[row] == reference_greedy(model, prompt, 8, penalty, on_logits=False)
    unpenalized = sample(model, prompts, 8, None, end_token=END, never=())
    assert sample(model, prompts, 8, None, end_token=END, never=(), repetition_penalty=6.0) != unpenalized


def test_the_logits_are_the_log_probabilities_before_their_softmax():
    model = Bigram()
    steps = LanguageModelSteps(model, torch.tensor([[1, 2]]), 1, True)
    logits = steps.logits(torch.tensor([[0]]))
    again = LanguageModelSteps(model, torch.tensor([[1, 2]]), 1, True)
    assert torch.allclose(again.log_probs(torch.tensor([[0]])), torch.log_softmax(logits, -1))
