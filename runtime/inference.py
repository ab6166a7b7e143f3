"""Loading a trained model for decoding: everything comes from the checkpoint itself.

A checkpoint is untrusted data: its spec goes through the compiler's checks like any spec file and
may not import other files, its vocabulary must parse and fit the model, and its tensors must
match the model the spec builds (checkpoint.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import ValidationError

import xspec
from xspec.compiler.sections import DecodeSection
from xspec.errors import UserError
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.compile_choice import use_compile
from xspec.runtime.train import max_sequence_tokens
from xspec.runtime.translation import Translator
from xspec.runtime.vocab import Vocab


def compile_checkpoint_spec(checkpoint: ckpt.Checkpoint):
    """The spec the checkpoint was trained with (its resolved source is stored in the checkpoint)."""
    return xspec.compile_source(checkpoint.spec_source, name=f"{checkpoint.path}:spec.xspec", allow_imports=False)


def checkpoint_vocab(checkpoint: ckpt.Checkpoint, spec) -> Vocab:
    """The checkpoint's sentencepiece model, which must have no more pieces than the model has embeddings."""
    vocab = Vocab.from_bytes(checkpoint.vocab_proto, f"{checkpoint.path}: its sentencepiece model")
    if len(vocab) > spec.vocab_size:
        raise UserError(f"{checkpoint.path}: its sentencepiece model has {len(vocab)} pieces, but the model's "
                        f"embedding has {spec.vocab_size} rows")
    return vocab


def build_from_checkpoint(checkpoint: ckpt.Checkpoint, spec, device: torch.device | str):
    """(model in eval mode, vocabulary) of a checkpoint whose spec is `spec`."""
    vocab = checkpoint_vocab(checkpoint, spec)
    model = spec.build(device=str(device))
    ckpt.load_into(model, checkpoint)
    return model.eval(), vocab


def load_translator(run_or_checkpoint: Path, device: torch.device, decode_overrides: dict,
                    compile: str = "off") -> Translator:
    """`decode_overrides` (e.g. {"beam": 1}) replace the spec's `decode` settings; `compile` (auto, on,
    off) chooses whether the decoder runs through torch.compile (lengths and batch sizes dynamic)."""
    checkpoint = ckpt.load_weights(ckpt.resolve(run_or_checkpoint))
    spec = compile_checkpoint_spec(checkpoint)
    try:
        decode = DecodeSection(**{**spec.decode.model_dump(), **decode_overrides})
    except ValidationError as error:       # e.g. nbest > beam
        raise UserError(f"decoding options: {error.errors()[0]['msg']}") from None
    model, vocab = build_from_checkpoint(checkpoint, spec, device)
    if use_compile(compile, device):
        model.decode = torch.compile(model.decode, dynamic=True)  # the step beam search repeats
    return Translator(model, vocab, decode, device, max_sequence_tokens(spec))
