"""Prompts of different lengths decode in one batch padded on the left: each row's logits are those of its
prompt decoded alone, through the prompt and the steps after it (positions follow each row)."""

import pytest
import torch

import xspec
from float32 import assert_close
from xspec.runtime.cache import DecoderCache, pads_rows
from xspec.runtime.generation import Generator
from xspec.runtime.vocab import BOS, EOS, PAD

# Each family of positions and attention a padded row must get right; the window of 8 is outgrown, so
# its ring of keys wraps.
SPECS = {
    "rotary": ("specs/modern/llama.xspec", {}),
    "partial rotary, fused projections": ("specs/modern/phi3.xspec", {}),
    "sliding window": ("specs/modern/mistral.xspec", {}),
    "soft caps, windows and global layers": ("specs/modern/gemma2.xspec", {}),
    "latent attention": ("specs/modern/deepseek_v3.xspec", {}),
    "alibi": ("specs/modern/alibi.xspec", {}),
    "sinusoids": ("specs/lm.xspec", {"d_model": 64, "d_ff": 128, "heads": 4, "layers": 2}),
    "learned positions": ("specs/lm.xspec", {"d_model": 64, "d_ff": 128, "heads": 4, "layers": 2,
                                             "positions": "learned"}),
}
LENGTHS = [7, 2, 5]
STEPS = 6


def _logits_alone(model, prompt, steps):
    cache = DecoderCache()
    logits = [model.decode(prompt[None], cache=cache)[0]]
    for token in steps:
        logits.append(model.decode(token.view(1, 1), cache=cache)[0])
    return torch.cat(logits)  # [P + steps, V]


@pytest.mark.parametrize("name", SPECS)
@torch.no_grad()
def test_each_padded_row_decodes_as_its_prompt_alone(name):
    path, overrides = SPECS[name]
    spec = xspec.compile(path, overrides=overrides)
    torch.manual_seed(0)
    model = spec.build(device="cpu").eval()
    assert pads_rows(model)
    prompts = [torch.randint(3, spec.vocab_size, (n,)) for n in LENGTHS]
    steps = torch.randint(3, spec.vocab_size, (len(LENGTHS), STEPS))
    longest = max(LENGTHS)
    padding = torch.tensor([longest - n for n in LENGTHS])
    batch = torch.stack([torch.cat([torch.zeros(longest - len(p), dtype=torch.long), p]) for p in prompts])

    cache = DecoderCache(padding=padding)
    together = [model.decode(batch, cache=cache)]
    for t in range(STEPS):
        together.append(model.decode(steps[:, t:t + 1], cache=cache))
    together = torch.cat(together, dim=1)  # [B, longest + STEPS, V]
    for row, prompt in enumerate(prompts):
        alone = _logits_alone(model, prompt, steps[row])
        assert_close(together[row, int(padding[row]):], alone)


@torch.no_grad()
def test_reordered_rows_keep_their_padding():
    spec = xspec.compile("specs/modern/llama.xspec")
    torch.manual_seed(0)
    model = spec.build(device="cpu").eval()
    prompts = [torch.randint(3, spec.vocab_size, (n,)) for n in (6, 3)]
    batch = torch.stack([prompts[0], torch.cat([torch.zeros(3, dtype=torch.long), prompts[1]])])
    cache = DecoderCache(padding=torch.tensor([0, 3]))
    model.decode(batch, cache=cache)
    cache.reorder(torch.tensor([1, 1, 0]))  # the short prompt twice, as beam search keeps two of its hypotheses
    token = torch.tensor([[5], [6], [7]])
    stepped = model.decode(token, cache=cache)[:, 0]
    for row, (prompt, new) in enumerate([(prompts[1], 5), (prompts[1], 6), (prompts[0], 7)]):
        alone = _logits_alone(model, prompt, torch.tensor([new]))[-1]
        assert_close(stepped[row], alone)


def test_a_recurrent_model_decodes_prompts_of_one_length_a_batch():
    model = xspec.compile("specs/modern/qwen3_next.xspec").build(device="meta")
    assert not pads_rows(model)


@pytest.mark.parametrize("decode", [{"sample": False, "beam": 1}, {"sample": False, "beam": 3},
                                    {"sample": True, "temperature": 0.8}], ids=["greedy", "beam", "sampling"])
def test_generating_many_prompts_in_padded_batches_gives_each_prompt_s_own_continuation(decode):
    spec = xspec.compile("specs/modern/llama.xspec",
                         overrides={f"decode.{k}": v for k, v in {**decode, "max_new_tokens": 5}.items()})
    torch.manual_seed(0)
    model = spec.build(device="cpu").eval()
    lines = ["5 6 7 8 9", "10 11", "12 13 14 15", "16", "17 18 19"]
    prefills = []
    decode_alone = model.decode

    def counted(tokens, *args, **kwargs):
        if tokens.size(1) > 1:
            prefills.append(tuple(tokens.shape))
        return decode_alone(tokens, *args, **kwargs)

    model.decode = counted
    generator = Generator(model, _Numbers(spec.vocab_size), spec.decode, torch.device("cpu"), max_tokens=64)
    assert generator.pads_prompts()
    together = generator.generate(lines)
    # one batch (a row a prompt, or a beam's rows), as long as the longest prompt with its start
    assert prefills == [(5 * decode.get("beam", 1), 6)]
    # Alone, each prompt drawing from the stream its line numbers (`first`).
    alone = [[generator.vocab.decode(ids) for done in generator.stream([line], first=i) for ids in done][0]
             for i, line in enumerate(lines)]
    assert together == alone and len(set(together)) > 1


class _Numbers:
    """A tokenizer of whitespace-separated ids (what the generator reads of one)."""

    document_start = document_end = EOS
    end_tokens = (EOS,)
    never_generated = (PAD, BOS)
    bos_id = None

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def encode_prompts(self, lines: list[str]) -> list[list[int]]:
        return [[EOS, *map(int, line.split())] for line in lines]

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return " ".join(map(str, ids))


def test_an_ensemble_continues_padded_prompts_as_each_alone():
    spec = xspec.compile("specs/modern/llama.xspec",
                         overrides={"decode.max_new_tokens": 4, "decode.beam": 2, "decode.sample": False})
    members = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        members.append(spec.build(device="cpu").eval())
    generator = Generator(members, _Numbers(spec.vocab_size), spec.decode, torch.device("cpu"), max_tokens=64)
    assert generator.pads_prompts()
    lines = ["5 6 7 8", "9", "10 11"]
    alone = [generator.generate([line])[0] for line in lines]
    assert generator.generate(lines) == alone
