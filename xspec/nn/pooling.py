"""Pooling over a text's positions: one state for the whole text, for a classifier's head."""

import torch.nn as nn


class MeanPool(nn.Module):
    """Each row's mean over its positions that are not padding (`padding_mask`
    True at padding; None: no padding), given at every position, so that a
    text's scores may be read at any of them (ModernBERT's mean pooling). A row
    of padding alone pools to zeros rather than dividing by no positions."""

    def forward(self, x, padding_mask=None):
        if padding_mask is None:
            return x.mean(dim=-2, keepdim=True).expand_as(x)
        padded = padding_mask.unsqueeze(-1)
        # padding's states add nothing, whatever they hold
        total = x.masked_fill(padded, 0).sum(dim=-2, keepdim=True)
        count = (~padded).sum(dim=-2, keepdim=True).clamp(min=1)
        return (total / count).expand_as(x)
