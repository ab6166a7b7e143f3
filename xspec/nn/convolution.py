"""The short causal convolution that the recurrent mixers of hybrid models (delta_rule.py,
state_space.py) run over their projections before their state: a base class they extend, whose step
continues from the inputs before (a decoding cache's window) as from zeros at the start."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvolvedMixer(nn.Module):
    """A mixer holding `conv1d`, a depthwise convolution over a few positions, which it runs
    causally with SiLU (`convolve`)."""

    def convolve(self, x, window):
        """SiLU of the causal depthwise convolution of x [B, T, C], its first positions preceded
        by `window` [B, kernel - 1, C], the inputs before x (zeros at the start). Returns the
        output [B, T, C] and the new window: the last kernel - 1 inputs (a copy, not a view that
        would keep all of x)."""
        before = self.conv1d.kernel_size[0] - 1
        if window is None:
            window = x.new_zeros(x.size(0), before, x.size(2))
        x = torch.cat([window, x], dim=1)  # [B, kernel - 1 + T, C]
        out = F.conv1d(x.transpose(1, 2), self.conv1d.weight, self.conv1d.bias, groups=x.size(2))
        return F.silu(out).transpose(1, 2), x[:, x.size(1) - before:].clone()


class ShortConvolution(ConvolvedMixer):
    """x [B, T, channels] -> SiLU of its causal depthwise convolution over `kernel` positions: each
    channel mixes its own last positions (H3, Mamba and Gated DeltaNet run one before their
    state). With a cache it continues from the inputs kept there, then keeps its last ones."""

    def __init__(self, channels, kernel, *, bias):
        super().__init__()
        self.conv1d = nn.Conv1d(channels, channels, kernel, groups=channels, padding=kernel - 1,
                                bias=bias)

    def forward(self, x, cache=None):
        kept = cache.state(self) if cache is not None else None
        out, window = self.convolve(x, kept[0] if kept is not None else None)
        if cache is not None:
            cache.keep(self, window)
        return out
