"""The experts' products as an op of their own, `xspec::grouped_linear`, with its gradient, so that
torch.compile keeps a model with a mixture of experts in one graph: it calls the op instead of tracing
into sizes that depend on the routing. A generated mixture of experts calls it while torch.compile
traces, where it is registered (xspec/nn/experts.py); everything that compiles a model
registers it first."""

from __future__ import annotations

import torch


def products(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """x [S, in], rows grouped by expert (`counts` of each), times each expert's weight [E, out, in]
    transposed: [S, out], one product per expert."""
    parts = x.split(counts.tolist())
    return torch.cat([part @ weight[e].transpose(0, 1) for e, part in enumerate(parts)])


def products_backward(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor,
                      grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of `products` with respect to x and to the weights, expert by expert."""
    grad_x, grad_weight = torch.empty_like(x), torch.zeros_like(weight)
    start = 0
    for e, n in enumerate(counts.tolist()):
        grad_x[start:start + n] = grad[start:start + n] @ weight[e]
        grad_weight[e] = grad[start:start + n].transpose(0, 1) @ x[start:start + n]
        start += n
    return grad_x, grad_weight


def register_expert_products() -> None:
    """Registers `products` and its gradient (once per process)."""
    if hasattr(torch.ops.xspec, "grouped_linear"):
        return
    torch.library.custom_op("xspec::grouped_linear", products, mutates_args=())
    torch.library.custom_op("xspec::grouped_linear_backward", products_backward, mutates_args=())

    def shape(x, weight, counts):
        return x.new_empty(x.size(0), weight.size(1))

    def gradient_shapes(x, weight, counts, grad):
        return torch.empty_like(x), torch.empty_like(weight)

    def keep(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad):
        x, weight, counts = ctx.saved_tensors
        grad_x, grad_weight = torch.ops.xspec.grouped_linear_backward(x, weight, counts, grad)
        return grad_x, grad_weight, None

    torch.library.register_fake("xspec::grouped_linear", shape)
    torch.library.register_fake("xspec::grouped_linear_backward", gradient_shapes)
    torch.library.register_autograd("xspec::grouped_linear", backward, setup_context=keep)
