"""The k largest entries of each row of a wide tensor (a vocabulary's scores), as `torch.topk` gives them,
faster where k is small: torch.topk partially sorts every row, which on a CPU costs some 25 times a pass
that takes each row's maximum. A row cut into chunks holds its k largest entries in the k chunks of largest
maxima (a chunk outside them has k others at least as large), so only those k chunks are sorted: one pass
over the row and two small selections (bench/top_k.py).
"""

from __future__ import annotations

import torch

CHUNK = 32          # columns a chunk holds
# The k chunks sorted may be at most this share of a row: beyond, torch.topk is as fast (measured).
SHARE = 0.125


def top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of each row of `scores` [R, V] and their columns, largest first, as
    `scores.topk(k, dim=-1)`; where values tie, which of the tied columns comes first may differ."""
    rows, width = scores.shape
    if k * CHUNK > SHARE * width or scores.device.type != "cpu" or scores.stride(1) != 1:
        return scores.topk(k, dim=-1)       # (a GPU's topk is one fast kernel)
    whole = width // CHUNK * CHUNK          # the columns of whole chunks; fewer than a chunk's are left
    chunks = scores.as_strided((rows, whole // CHUNK, CHUNK), (scores.stride(0), CHUNK, 1))
    best = chunks.amax(dim=-1).topk(k, dim=-1).indices                    # [R, k] the chunks holding them
    held = chunks.gather(1, best[:, :, None].expand(rows, k, CHUNK)).view(rows, k * CHUNK)
    columns = (best[:, :, None] * CHUNK + torch.arange(CHUNK, device=scores.device)).view(rows, k * CHUNK)
    if whole < width:                       # the last columns are candidates too
        held = torch.cat([held, scores[:, whole:]], dim=1)
        columns = torch.cat([columns, torch.arange(whole, width, device=scores.device).expand(rows, -1)], dim=1)
    values, at = held.topk(k, dim=-1)
    return values, columns.gather(1, at)
