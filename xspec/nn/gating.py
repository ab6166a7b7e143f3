"""Activations chosen by name: alone, or gating a linear unit over one projection that makes
the gate and the value together."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Activation(nn.Module):
    """An activation chosen by name, as a config holds it: "gelu", "gelu_tanh" (GELU's tanh
    approximation, transformers' gelu_new), "relu", "silu", "sigmoid" or "tanh", as transformers'
    `ACT2FN[config.hidden_act]`: editing the name changes the function."""

    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        if self.function == "gelu_tanh":
            return F.gelu(x, approximate="tanh")
        functions = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu, "sigmoid": torch.sigmoid,
                     "tanh": torch.tanh}
        return functions[self.function](x)

    def extra_repr(self):
        return self.function


class GLU(Activation):
    """activation(a) * b, where a and b are the first and second halves of x's features: a gated
    linear unit (Shazeer, 2020) after one projection that makes the gate, then the value (Phi-3's
    gate_up_proj). torch's nn.GLU is another order: a * sigmoid(b), the gate second."""

    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return super().forward(gate) * up
