"""The short causal convolution that the recurrent mixers of hybrid models (delta_rule.py,
state_space.py) run over their projections before their state: a base class they extend, whose step
continues from the inputs before (a decoding cache's window) as from zeros at the start."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvolvedMixer(nn.Module):
    """A mixer holding `conv1d`, a depthwise convolution over a few positions, which it runs
    causally with SiLU (`convolve`)."""

    @staticmethod
    @torch.no_grad()
    def init_decay(A_log, dt_bias):
        """A in [1, 16] and softplus(dt_bias) log-uniform in [0.001, 0.1] at first, as
        Mamba-2's."""
        A_log.copy_(torch.empty_like(A_log).uniform_(1, 16).log())
        dt = torch.empty_like(dt_bias).uniform_(math.log(0.001), math.log(0.1))
        dt = dt.exp().clamp(min=1e-4)
        dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def convolve(self, x, window, documents=None):
        """SiLU of the causal depthwise convolution of x [B, T, C], its first positions preceded
        by `window` [B, kernel - 1, C], the inputs before x (zeros at the start). Returns the
        output [B, T, C] and the new window: the last kernel - 1 inputs (a copy, not a view that
        would keep all of x). With `documents` [B, T] (packed documents kept apart), a position
        reads no input of another document."""
        before = self.conv1d.kernel_size[0] - 1
        if window is None:
            window = x.new_zeros(x.size(0), before, x.size(2))
        x = torch.cat([window, x], dim=1)  # [B, kernel - 1 + T, C]
        kept = x[:, x.size(1) - before:].clone()
        if documents is not None:
            return F.silu(self.within_documents(x, documents)), kept
        out = F.conv1d(x.transpose(1, 2), self.conv1d.weight, self.conv1d.bias, groups=x.size(2))
        return F.silu(out).transpose(1, 2), kept

    @staticmethod
    def chunk_masks(documents, pad, size):
        """Packed documents [B, T] by chunk, for a chunked form that keeps them apart: whether i
        and j are of one document [B, 1, N, L, L]; whether i continues the document of the position
        before its chunk [B, 1, N, L] (so reads the state passed on); and whether i is of its
        chunk's last document [B, 1, N, L] (so is in the state passed on). Padding is a document
        of its own."""
        ids = F.pad(documents, (0, pad), value=-1).unflatten(1, (-1, size))[:, None]  # [B,1,N,L]
        first = ids.new_full((ids.size(0), 1, 1, 1), -2)  # before the first chunk: none
        before = torch.cat([first, ids[:, :, :-1, -1:]], dim=2)  # [B, 1, N, 1]
        same = ids[..., :, None] == ids[..., None, :]
        return same, (ids == before).float(), (ids == ids[..., -1:]).float()

    def within_documents(self, x, documents):
        """The convolution of x [B, kernel - 1 + T, C] (the window first) at the last T positions,
        each tap that reaches into another document left out: a sum over the taps."""
        kernel, length = self.conv1d.kernel_size[0], documents.size(1)
        window = documents.new_full((documents.size(0), kernel - 1), -1)  # of no document
        ids = torch.cat([window, documents], dim=1)
        out = self.conv1d.bias if self.conv1d.bias is not None else 0
        for tap in range(kernel):  # tap `tap` reads the input kernel - 1 - tap positions back
            start = tap
            same = (ids[:, start:start + length] == documents)[..., None]  # [B, T, 1]
            out = out + x[:, start:start + length] * self.conv1d.weight[:, 0, tap] * same
        return out


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
