"""`train.residual_init = "depth"`: GPT-2's scaled initialization, applied to a newly built model."""

from __future__ import annotations

import torch
import torch.nn as nn


@torch.no_grad()
def scale_residual_writers(model: nn.Module, writers: dict[str, float]) -> str:
    """Multiplies each weight that writes into a residual stream by its factor (the spec's
    residual_writers(): 1/sqrt(the stream's residual additions)); the log line that says so."""
    if not writers:
        return ("residual init: no weight writes into a residual stream unnormalized (a norm ends each "
                "sublayer, or there is none): nothing scaled")
    for name, factor in writers.items():
        model.get_parameter(name).mul_(factor)
    factors = ", ".join(f"{factor:.3g}" for factor in sorted(set(writers.values()), reverse=True))
    return f"residual init: {len(writers)} weights that write into a residual stream scaled by {factors}"
