"""A gated linear unit over one projection that makes the gate and the value together."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class GLU(nn.Module):
    """activation(a) * b, where a and b are the first and second halves of x's features: a gated
    linear unit (Shazeer, 2020) after one projection that makes the gate, then the value (Phi-3's
    gate_up_proj). torch's nn.GLU is another order: a * sigmoid(b), the gate second."""

    def __init__(self, activation):
        super().__init__()
        self.activation = activation

    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return self.activated(gate) * up

    def activated(self, gate):
        if self.activation == "gelu_tanh":  # GELU's tanh approximation (gelu_pytorch_tanh)
            return F.gelu(gate, approximate="tanh")
        functions = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu, "sigmoid": torch.sigmoid}
        return functions[self.activation](gate)
