"""The mixture-of-experts module that generated models use (copied into every generated file that
uses it, so a compiled model depends on torch alone)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MixtureOfExperts(nn.Module):
    """A router and `experts` gated feed-forward experts (Shazeer et al., 2017; Fedus et al., 2022;
    Jiang et al., 2024). Each token's scores, softmax or sigmoid of x W_r, choose its `top_k`
    experts; their weights are renormalized to sum to 1 (`normalize`) and scaled by
    `routing_scale`; the output is the weighted sum of the chosen experts' down(act(gate x) * up x)
    (`activation`: silu, SwiGLU; gelu_tanh, GeGLU; clamped_swiglu, gpt-oss's clamped SwiGLU,
    (up + 1) * gate * sigmoid(alpha gate)).

    Experts run batched: the (token, choice) pairs are sorted by expert and each expert multiplies
    its tokens at once, one product per expert (F.grouped_mm, one product for all, on CUDA in
    bfloat16), with no loop over tokens. Each forward records its tokens' choices and router
    probabilities, which `auxiliary_loss(model, counted)` pools over the layers into the
    load-balancing loss.
    """

    def __init__(self, d_model, experts, top_k, d_ff,
                 scoring="softmax",  # with: moe_sigmoid
                 normalize=False,  # with: moe_normalize
                 routing_scale=1.0,  # with: moe_routing_scale
                 bias=False,  # with: moe_bias
                 activation="silu",  # with: moe_gelu_tanh, moe_clamped_swiglu
                 swiglu_limit=7.0, swiglu_alpha=1.702,  # with: moe_clamped_swiglu
                 router_bias=False):
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.scoring = scoring  # with: moe_sigmoid
        self.normalize = normalize  # with: moe_normalize
        self.routing_scale = routing_scale  # with: moe_routing_scale
        self.activation = activation  # with: moe_gelu_tanh, moe_clamped_swiglu
        self.swiglu_limit, self.swiglu_alpha = swiglu_limit, swiglu_alpha  # with: moe_clamped_swiglu
        self.router = nn.Linear(d_model, experts, bias=router_bias)
        # [E, out, in], as nn.Linear keeps its weight
        self.gate = nn.Parameter(torch.randn(experts, d_ff, d_model) * d_model ** -0.5)
        self.up = nn.Parameter(torch.randn(experts, d_ff, d_model) * d_model ** -0.5)
        self.down = nn.Parameter(torch.randn(experts, d_model, d_ff) * d_ff ** -0.5)
        self.gate_bias = nn.Parameter(torch.zeros(experts, d_ff)) if bias else None  # with: moe_bias
        self.up_bias = nn.Parameter(torch.zeros(experts, d_ff)) if bias else None  # with: moe_bias
        self.down_bias = nn.Parameter(torch.zeros(experts, d_model)) if bias else None  # with: moe_bias
        self.routed = None  # the last forward's chosen experts [N, top_k], probabilities [N, E]
        MixtureOfExperts.register_kernels()

    def route(self, tokens):
        """The router's choice for tokens [N, d]: weights [N, top_k] (float32), chosen experts
        [N, top_k], and the probabilities [N, experts] (float32) the load-balancing loss reads."""
        logits = self.router(tokens).float()
        probabilities = scores = logits.softmax(dim=-1)
        if self.scoring == "sigmoid":  # with: moe_sigmoid
            scores = logits.sigmoid()
        weights, chosen = scores.topk(self.top_k, dim=-1)
        if self.normalize:  # with: moe_normalize
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.routing_scale != 1:  # with: moe_routing_scale
            weights = weights * self.routing_scale
        return weights, chosen, probabilities

    def forward(self, x):
        tokens = x.reshape(-1, x.size(-1))  # [N, d]
        weights, chosen, probabilities = self.route(tokens)
        flat = chosen.flatten()  # [N * top_k]: the (token, choice) pairs
        self.routed = (chosen, probabilities)
        order = flat.argsort(stable=True)  # the pairs grouped by expert
        rows = order // self.top_k  # each pair's token
        counts = torch.zeros(self.experts, dtype=torch.int64, device=x.device)
        counts = counts.scatter_add_(0, flat, torch.ones_like(flat))
        grouped = tokens[rows]  # [N * top_k, d]
        gate = self.grouped_linear(grouped, self.gate, counts)
        up = self.grouped_linear(grouped, self.up, counts)
        if self.gate_bias is not None:  # with: moe_bias
            expert = flat[order]  # each grouped pair's expert
            gate = gate + self.gate_bias[expert].to(gate.dtype)
            up = up + self.up_bias[expert].to(up.dtype)
        hidden = self.activate(gate, up)
        out = self.grouped_linear(hidden, self.down, counts)
        if self.down_bias is not None:  # with: moe_bias
            out = out + self.down_bias[expert].to(out.dtype)
        out = out * weights.flatten()[order, None].to(out.dtype)
        summed = tokens.new_zeros(tokens.shape).index_add_(0, rows, out.to(tokens.dtype))
        return summed.reshape(x.shape)

    def activate(self, gate, up):
        if self.activation == "gelu_tanh":  # with: moe_gelu_tanh
            return F.gelu(gate, approximate="tanh") * up
        if self.activation == "clamped_swiglu":  # with: moe_clamped_swiglu
            gate = gate.clamp(max=self.swiglu_limit)  # gpt-oss's
            up = up.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)
            return (up + 1) * gate * torch.sigmoid(gate * self.swiglu_alpha)
        return F.silu(gate) * up

    @staticmethod
    def grouped_linear(x, weight, counts):
        """x [S, in], rows grouped by expert (`counts` of each), times each expert's weight
        [E, out, in] transposed: [S, out]. On CUDA in bfloat16, one grouped
        product; while torch.compile traces, the op registered below (it cannot trace sizes that
        depend on the routing); otherwise one product per expert."""
        if x.is_cuda and x.dtype == torch.bfloat16:
            offsets = counts.cumsum(dim=0).to(torch.int32)
            y = F.grouped_mm(x, weight.to(x.dtype).transpose(-2, -1), offs=offsets)
        elif torch.compiler.is_compiling():
            y = torch.ops.xspec.grouped_linear(x, weight.to(x.dtype), counts)
        else:
            parts = x.split(counts.tolist())
            y = torch.cat([part @ weight[e].transpose(0, 1) for e, part in enumerate(parts)])
        return y

    @staticmethod
    def products(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """One product per expert over its rows (the registered op's kernel)."""
        parts = x.split(counts.tolist())
        return torch.cat([part @ weight[e].transpose(0, 1) for e, part in enumerate(parts)])

    @staticmethod
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

    @staticmethod
    def register_kernels():
        """Registers `products` and its gradient as ops of their own (xspec::grouped_linear), once
        per process, so that torch.compile keeps a model with experts in one graph: it calls them
        instead of tracing into sizes that depend on the routing."""
        if hasattr(torch.ops.xspec, "grouped_linear"):
            return
        torch.library.custom_op("xspec::grouped_linear", MixtureOfExperts.products,
                                mutates_args=())
        torch.library.custom_op("xspec::grouped_linear_backward",
                                MixtureOfExperts.products_backward, mutates_args=())

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

    @staticmethod
    def auxiliary_loss(model, counted=None):
        """The load-balancing loss of the model's last forward (Switch, Fedus et al., 2022,
        eq. 4-6, as Mixtral and Hugging Face pool it): experts * sum_e f_e * P_e, where f_e is
        expert e's choices per token and P_e its mean router probability, both over the tokens of
        every MoE layer together. Layers with different numbers of experts are pooled apart and
        their losses summed. `counted` [batch, positions] (bool) leaves out padding, as the
        attention mask does in Hugging Face's loss, in layers whose tokens are those positions."""
        pooled = {}
        for module in model.modules():
            if isinstance(module, MixtureOfExperts) and module.routed is not None:
                chosen, probabilities = module.routed
                weight = probabilities.new_ones(chosen.size(0))  # [N]: 1 a token counted, 0 if not
                if counted is not None and counted.numel() == chosen.size(0):
                    weight = counted.reshape(-1).to(weight.dtype)
                choices = probabilities.new_zeros(module.experts).scatter_add_(
                    0, chosen.flatten(), weight.repeat_interleave(module.top_k))
                probabilities = (probabilities * weight[:, None]).sum(dim=0)
                tokens = weight.sum()
                if module.experts in pooled:
                    before = pooled[module.experts]
                    choices, probabilities = choices + before[0], probabilities + before[1]
                    tokens = tokens + before[2]
                pooled[module.experts] = (choices, probabilities, tokens)
        losses = [experts * (choices / tokens * probabilities / tokens).sum()
                  for experts, (choices, probabilities, tokens) in pooled.items()]
        return sum(losses[1:], losses[0]) if losses else torch.zeros(())
