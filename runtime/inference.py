"""Loading a trained model for decoding: everything comes from the checkpoint itself."""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import ValidationError

import xspec
from xspec.compiler.sections import DecodeSection
from xspec.errors import UserError
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.train import max_sequence_tokens
from xspec.runtime.translation import Translator
from xspec.runtime.vocab import Vocab


def compile_checkpoint_spec(checkpoint: ckpt.Checkpoint):
    """The spec the checkpoint was trained with (its resolved source is stored in the checkpoint)."""
    return xspec.compile_source(checkpoint.spec_source, name=f"{checkpoint.path}:spec.xspec")


def load_translator(run_or_checkpoint: Path, device: torch.device, decode_overrides: dict) -> Translator:
    """`decode_overrides` (e.g. {"beam": 1}) replace the spec's `decode` settings."""
    checkpoint = ckpt.load_weights(ckpt.resolve(run_or_checkpoint))
    spec = compile_checkpoint_spec(checkpoint)
    try:
        decode = DecodeSection(**{**spec.decode.model_dump(), **decode_overrides})
    except ValidationError as error:       # e.g. nbest > beam
        raise UserError(f"decoding options: {error.errors()[0]['msg']}") from None
    model = spec.build(device=str(device))
    ckpt.load_into(model, checkpoint)
    model.eval()
    return Translator(model, Vocab(checkpoint.vocab_proto), decode, device, max_sequence_tokens(spec))
