"""The normalization generated models use where torch's own does not serve."""

import torch
import torch.nn as nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * (offset + w), in float32: Gemma's RMSNorm (offset 1, w starting
    at 0), where torch's nn.RMSNorm (offset 0) serves the others."""

    def __init__(self, dim, eps=1e-6, offset=0.0):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.constant_(self.weight, 1.0 - self.offset)  # offset + w = 1 at first

    def forward(self, x):
        normalized = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (normalized * (self.offset + self.weight.float())).to(x.dtype)
