"""xspec's own vocabulary exported with a run (`xspec export RUN --format hf`): the tokenizer.json written
encodes every text to the ids xspec's encoding gives it (sentencepiece's normalization, BPE or unigram pieces,
unknown characters, user-defined pieces, a mask), framed as xspec frames it for the model's kind; a language
model trained here loads with transformers and reads its prompts as xspec does."""

from __future__ import annotations

import json
import random

import pytest
import torch
from tokenizers import Tokenizer

from float32 import assert_close
from xspec.hf.own_vocabulary import tokenizer_json
from xspec.runtime.vocab import EOS, MASK_PIECE, train_vocab

WORDS = ["the", "dog", "runs", "under", "a", "green", "tree", "straße", "über", "naïve", "café", "river", "city"]
ODD = ["  two  spaces  ", "\ttab\tand\nline", "ﬁne ligature ＡＢＣ full width", "日本語", "emoji 😀 here", "", " ",
       "x" * 300, "ideographic\u3000space", "\u200bzero width", "A  B\u00a0C", "ends with space ", "▁already marked",
       "zzzqqq ŋŋŋ unknown", "Über GRÖSSE", f"{MASK_PIECE} first", f"the{MASK_PIECE}glued", f"mid {MASK_PIECE} word",
       f"two {MASK_PIECE}{MASK_PIECE} masks"]


def corpus(lines: int, seed: int) -> list[str]:
    draw = random.Random(seed)
    return [" ".join(draw.choice(WORDS) for _ in range(draw.randint(2, 9))) for _ in range(lines)]


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
@pytest.mark.parametrize("mask", [False, True])
def test_the_tokenizer_json_encodes_and_decodes_as_the_vocabulary(tmp_path, kind, mask):
    vocab = train_vocab(corpus(2000, 0), 120, kind, tmp_path, mask=mask)
    encoder = Tokenizer.from_str(tokenizer_json(vocab, starts_documents=False, where="v").decode())
    language_model = Tokenizer.from_str(tokenizer_json(vocab, starts_documents=True, where="v").decode())
    texts = ODD + corpus(200, 1)
    for text in texts:
        assert encoder.encode(text).ids == vocab.encode_sources([text])[0], text
        assert language_model.encode(text).ids == vocab.encode_prompts([text])[0], text
        ids = vocab.encode_sources([text])[0]
        if MASK_PIECE not in text:     # a mask is a special token there, dropped from decoded text
            assert encoder.decode(ids, skip_special_tokens=True) == vocab.decode(ids), text
    # a mask stands for a word with the space before it (sentencepiece alone gives that space a piece)
    if mask:
        the, word = vocab.encode(["the"])[0], vocab.encode(["word"])[0]
        assert vocab.encode([f"the {MASK_PIECE} word"])[0] == [*the, vocab.mask_id, *word]
    # a pair of texts as xspec frames one for a classifier: a EOS b EOS, of types 0, then 1
    pair = encoder.encode("the dog", "a tree")
    assert pair.ids == [*vocab.encode(["the dog"])[0], EOS, *vocab.encode(["a tree"])[0], EOS]
    assert pair.type_ids == [0] * (pair.ids.index(EOS) + 1) + [1] * (len(pair.ids) - pair.ids.index(EOS) - 1)


def test_user_defined_pieces_stay_whole(tmp_path):
    """A treebank's bracketed labels, each a piece of its own wherever it stands after a space."""
    draw = random.Random(2)
    labels = ["NP", "VP", "NP-SBJ", "PP-LOC", "S"]
    lines = [" ".join(f"({draw.choice(labels)} {draw.choice(WORDS)})" for _ in range(4)) for _ in range(600)]
    vocab = train_vocab(lines, 100, "bpe", tmp_path, symbols=[f"({label}" for label in labels])
    tokenizer = Tokenizer.from_str(tokenizer_json(vocab, starts_documents=False, where="v").decode())
    for line in lines[:100] + ["((S (NP-SBJ x))", "(NPX not a label)"]:
        assert tokenizer.encode(line).ids == vocab.encode_sources([line])[0], line


@pytest.mark.parametrize("setting, message", [
    ({"byte_fallback": True, "vocab_size": 400}, "byte_fallback setting"),
    ({"model_type": "char"}, "model_type setting"),
    ({"split_by_whitespace": False}, "split_by_whitespace setting"),
])
def test_a_vocabulary_of_settings_the_export_does_not_rebuild_is_refused_by_name(tmp_path, setting, message):
    """A vocabulary a user brought (`train --vocab`) may be a sentencepiece model xspec does not train: its
    export is refused naming the setting, not written to encode otherwise."""
    import io

    import sentencepiece as spm
    from xspec.base.errors import UserError
    from xspec.runtime.vocab import Vocab

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus(500, 5)), model_writer=model, pad_id=0, unk_id=1,
                                   bos_id=2, eos_id=3, hard_vocab_limit=False, minloglevel=2,
                                   **{"model_type": "bpe", "vocab_size": 60, **setting})
    with pytest.raises(UserError, match=f"^run: its vocabulary: a sentencepiece model whose {message}"):
        tokenizer_json(Vocab(model.getvalue()), starts_documents=False, where="run: its vocabulary")


def test_an_encoding_rebuilt_otherwise_than_the_vocabulary_is_refused_not_written(tmp_path, monkeypatch):
    """The rebuilt tokenizer encodes probe texts before it is written; one that differs (here, BPE without its
    merges) is refused naming the text."""
    from xspec.base.errors import UserError
    from xspec.hf import own_vocabulary

    vocab = train_vocab(corpus(500, 6), 80, "bpe", tmp_path)
    monkeypatch.setattr(own_vocabulary, "_merges", lambda pieces: [])
    with pytest.raises(UserError, match='^run: its vocabulary: the exported tokenizer.json would encode "the quick'):
        tokenizer_json(vocab, starts_documents=False, where="run: its vocabulary")


@torch.no_grad()
def test_a_language_model_trained_here_loads_with_transformers_and_reads_prompts_as_xspec(tmp_path):
    """Prompts start at EOS (xspec's document boundary), as the tokenizer written frames them; the logits
    are the run's; sampling is written without beams (xspec's sampling draws one continuation)."""
    transformers = pytest.importorskip("transformers")
    import xspec
    from xspec.cli import main

    (tmp_path / "train.txt").write_text("\n".join(corpus(300, 3)) + "\n")
    run, out = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "specs/modern/llama.xspec", "--train", str(tmp_path / "train.txt"), "-o", str(run),
                 "--set", "data.vocab_size=60", "--set", "train.max_steps=3", "--no-tensorboard",
                 "--no-progress"]) == 0
    assert main(["export", str(run), "--format", "hf", "-o", str(out)]) == 0
    settings = json.loads((out / "tokenizer_config.json").read_text())
    assert (settings["bos_token"], settings["eos_token"]) == ("</s>", "</s>") and "mask_token" not in settings
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["do_sample"], generation["num_beams"]) == (True, 1)
    trained = xspec.load(run, device="cpu", weights="fp32")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompts = ["the dog  runs", " a green tree", "café\tüber", "zzz unknown ŋ"]
    assert [tokenizer(p)["input_ids"] for p in prompts] == trained.tokenizer.encode_prompts(prompts)
    # a special token's text is text, as xspec reads it, not the token
    literal = ["the </s> dog", "<pad><unk> <s>"]
    assert [tokenizer(p)["input_ids"] for p in literal] == trained.tokenizer.encode_prompts(literal)
    assert all(ids.count(EOS) == 1 for ids in trained.tokenizer.encode_prompts(literal))
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        assert_close(model(ids).logits, trained.model(ids))

