"""Proof at import: the imported model and the checkpoint's own transformers class, both in float32, on
one fixed random batch; max |logit difference| and the mean KL divergence of the next-token
distributions, the import failing above a threshold. The batch reaches past the sliding window and past
original_max_position_embeddings when the config declares them (within max_position_embeddings)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import torch

from xspec.errors import UserError
from xspec.hf.families import Mapped

MAX_KL = 1e-5                 # nats per token, averaged
MAX_RELATIVE_DIFFERENCE = 1e-3  # of the largest logit's size (float32 sums in another order differ by ~1e-6)
SHORTEST = 16
LONGEST = 8200                # positions checked at most (past Llama 3.1's 8192 original positions)


def transformers_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def check_length(mapped: Mapped) -> int:
    """A length past every boundary the config declares (the window, the rotary scaling's start)."""
    length = SHORTEST
    if mapped.window:
        length = max(length, mapped.window + 4)
    if mapped.scaled_from:
        length = max(length, mapped.scaled_from + 4)
    return min(length, mapped.max_positions, LONGEST)


def verify_import(source: Path, work: Path, mapped: Mapped, say: Callable[[str], None]) -> dict:
    if not transformers_available():
        say("not verified: transformers is not installed (pip install 'xspec[hf]' to compare the import's "
            "logits with the checkpoint's own class)")
        return {"verified": False, "reason": "transformers is not installed"}
    import transformers

    import xspec

    length = check_length(mapped)
    tokens = torch.randint(0, mapped.params["vocab"], (2, length), generator=torch.Generator().manual_seed(0))
    ours = xspec.load(work, device="cpu").model
    with torch.no_grad():
        our_logits = ours(tokens).float()
    del ours
    hf_class = getattr(transformers, mapped.hf_class)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()       # one line of figures, not a loading bar
    try:
        reference = hf_class.from_pretrained(source, dtype=torch.float32, trust_remote_code=False,
                                             use_safetensors=True, attn_implementation="eager").eval()
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    with torch.no_grad():
        hf_logits = reference(tokens).logits.float()
    del reference
    difference = (our_logits - hf_logits).abs().max().item()
    scale = hf_logits.abs().max().item()
    kl = torch.nn.functional.kl_div(our_logits.log_softmax(-1), hf_logits.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1).mean().clamp(min=0).item()
    figures = {"verified": True, "positions": length, "max_abs_logit_difference": difference, "kl": kl,
               "largest_logit": scale}
    detail = f"max |Δlogit| {difference:.3g} (logits up to {scale:.3g}), KL {kl:.3g} over {tokens.numel()} positions " \
             f"(2 x {length})"
    if not (math.isfinite(difference) and difference <= MAX_RELATIVE_DIFFERENCE * max(1.0, scale) and kl <= MAX_KL):
        raise UserError(f"{source}: the imported model's logits differ from {mapped.hf_class}'s: {detail} "
                        f"(allowed: {MAX_RELATIVE_DIFFERENCE:g} of the largest logit, KL {MAX_KL:g}); nothing written")
    say(f"verified against transformers' {mapped.hf_class}: {detail}")
    return figures
