"""Small random Hugging Face checkpoints on disk, as save_pretrained writes them, for the import tests:
each family of tests/hf_families.py at its first sizes (uncommon ones: head sizes of their own, windows
shorter than the sequences), with a word-level tokenizer.json of the model's vocabulary."""

from __future__ import annotations

import functools
import json
import tempfile
import warnings
from pathlib import Path

import torch

from hf_families import BY_NAME

ROOT = Path(tempfile.mkdtemp(prefix="xspec-hf-"))
BOS, EOS = 1, 2


def word_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def reference(name: str, **changes):
    """The family's random model (float32, eval mode), with config attributes changed by `changes`."""
    family = BY_NAME[name]
    sizes = family.sizes[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not changes:
            return family.hf_model(sizes)
        import transformers

        config = family.hf_config(sizes)
        for key, value in changes.items():
            setattr(config, key, value)
        torch.manual_seed(1)
        model = getattr(transformers, family.hf_class)(config)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.1)
        return model.eval()


def saved(name: str, variant: str = "", **changes) -> Path:
    """The family's checkpoint directory (made once per test session)."""
    return _saved(name, variant, json.dumps(changes, sort_keys=True))


@functools.cache
def _saved(name: str, variant: str, changes: str) -> Path:
    model = reference(name, **json.loads(changes))
    _references[(name, variant, changes)] = model
    model.config.bos_token_id, model.config.eos_token_id = BOS, EOS
    path = ROOT / f"{name}{variant}" / "checkpoint"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path)
    word_tokenizer(model.config.vocab_size).save(str(path / "tokenizer.json"))
    return path


def imported(name: str, variant: str = "", **changes) -> Path:
    """The checkpoint imported into a run directory (once per test session)."""
    return _imported(name, variant, json.dumps(changes, sort_keys=True))


@functools.cache
def _imported(name: str, variant: str, changes: str) -> Path:
    from xspec.hf.importer import import_checkpoint

    changes = json.loads(changes)
    out = ROOT / f"{name}{variant}" / "run"
    import_checkpoint(saved(name, variant, **changes), out, say=lambda _: None)
    return out


_references: dict = {}


def saved_model(name: str, variant: str = "", **changes):
    """The transformers model `saved` wrote (the same weights from_pretrained would load)."""
    key = (name, variant, json.dumps(changes, sort_keys=True))
    _saved(*key)
    return _references[key]


def rope(kind: str) -> dict:
    """LlamaConfig changes for a rotary scaling other than llama3's (Hugging Face's v4 spelling)."""
    if kind == "linear":
        return {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}}
    return {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "beta_fast": 16.0,
                                "beta_slow": 2.0, "original_max_position_embeddings": 8},
            "max_position_embeddings": 32}
