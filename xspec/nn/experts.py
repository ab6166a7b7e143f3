"""The mixture of experts that generated models use: a router, one class whose options say how it
scores (softmax or sigmoid), selects (limited to the best groups of experts, corrected by a bias
per expert: DeepSeek-V3's) and weights (scaled or not); an activation of the gated experts (SwiGLU,
GeGLU, gpt-oss's clamped SwiGLU); and the bank of experts that holds them (with biases or
without). Two forms: a TopKRouter and a bank of Experts as two modules, as transformers keeps them
(`mlp.gate`, `mlp.experts`), the routing passed between them as weights per expert; and the
MixtureOfExperts of both in one module (the `moe` op's, which earlier specs use). The
load-balancing loss is training's (runtime/load_balance.py): it reads what each forward records
through `last_routing()`."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Router(nn.Linear):
    """Each token's `top_k` experts and their weights, as a scoring and a selection (Shazeer et
    al., 2017): the scores are softmax(x W_r) or, where `scoring` is "sigmoid", each expert's
    sigmoid(x W_r) on its own. The selection takes the top_k of the scores plus a bias per expert
    where `corrected` (DeepSeek-V3's auxiliary-loss-free balancing, §2.1.2: training moves the
    bias, checkpoints keep it), among the experts of the `top_groups` of `groups` groups whose
    two best scores sum highest where `groups` > 1 (DeepSeek-V3's node-limited routing). The
    weights are the chosen experts' scores, renormalized to sum to 1 where `normalize`
    (norm_topk_prob), times `scale` (routed_scaling_factor)."""

    def __init__(self, d_model, experts, top_k, *, bias, normalize, scoring="softmax",
                 corrected=False, groups=1, top_groups=1, scale=1.0):
        super().__init__(d_model, experts, bias=bias)
        self.top_k, self.normalize, self.scoring = top_k, normalize, scoring
        self.groups, self.top_groups, self.scale = groups, top_groups, scale
        correction = torch.zeros(experts) if corrected else None
        self.register_buffer("e_score_correction_bias", correction)

    def reset_parameters(self):
        super().reset_parameters()
        for bias in self.buffers(recurse=False):  # the correction (none while nn.Linear builds)
            nn.init.zeros_(bias)

    def scores(self, logits):
        return logits.sigmoid() if self.scoring == "sigmoid" else logits.softmax(dim=-1)

    def choose(self, scores):
        """The experts each token goes to: [N, experts] -> [N, top_k]."""
        if self.e_score_correction_bias is not None:
            scores = scores + self.e_score_correction_bias
        if self.groups > 1:
            grouped = scores.unflatten(-1, (self.groups, -1))  # [N, groups, experts per group]
            best = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [N, groups]
            kept = torch.zeros_like(best, dtype=torch.bool)
            kept.scatter_(1, best.topk(self.top_groups, dim=-1).indices, True)
            scores = grouped.masked_fill(~kept[..., None], float("-inf")).flatten(1)
        return scores.topk(self.top_k, dim=-1).indices

    def forward(self, tokens):
        return self.route(tokens)

    def route(self, tokens):
        """tokens [N, d] -> weights [N, top_k] and probabilities [N, experts] (float32), and the
        chosen experts [N, top_k]."""
        logits = super().forward(tokens).float()
        scores = self.scores(logits)
        chosen = self.choose(scores)
        weights = scores.gather(-1, chosen)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.scale, chosen, logits.softmax(dim=-1)

    def load_correction(self):
        """The per-expert bias that training moves against the load; None: this router has none."""
        return self.e_score_correction_bias


class TopKRouter(Router):
    """A router as a module of its own (transformers' `mlp.gate`): [..., d] -> the routing weights
    [..., experts], each token's top_k chosen experts' weights and zeros elsewhere, for a bank of
    Experts to read. `routed` keeps the last choices, for the load-balancing loss."""

    def __init__(self, d_model, experts, top_k, **options):
        super().__init__(d_model, experts, top_k, **options)
        self.routed = None  # the chosen experts [N, top_k] and probabilities [N, E]

    def forward(self, x):
        weights, chosen, probabilities = self.route(x.reshape(-1, x.size(-1)))
        self.routed = (chosen, probabilities)
        routing = weights.new_zeros(probabilities.shape).scatter_(-1, chosen, weights)
        return routing.reshape(*x.shape[:-1], -1)

    def last_routing(self):
        """The last forward's chosen experts [N, top_k] and probabilities [N, E], or None."""
        return self.routed


class SwiGLU(nn.Module):
    """silu(gate) * up (Shazeer, 2020)."""

    def forward(self, gate, up):
        return F.silu(gate) * up


class GeGLU(nn.Module):
    """gelu(gate) * up, GELU's tanh approximation (Shazeer, 2020)."""

    def forward(self, gate, up):
        return F.gelu(gate, approximate="tanh") * up


class ClampedSwiGLU(nn.Module):
    """gpt-oss's gated activation: the gate clamped above at `limit` and up to +-limit, then
    (up + 1) * gate * sigmoid(alpha * gate)."""

    def __init__(self, limit, alpha):
        super().__init__()
        self.limit, self.alpha = limit, alpha

    def forward(self, gate, up):
        gate, up = gate.clamp(max=self.limit), up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * gate * torch.sigmoid(gate * self.alpha)


class GroupedExperts(nn.Module):
    """What both forms of a mixture share: tokens through their chosen experts, the (token, choice)
    pairs sorted by expert and each expert's rows multiplied at once."""

    @staticmethod
    def dispatch(tokens, weights, chosen, experts, products):
        """tokens [N, d] through their chosen experts [N, top_k] of `experts`, weighted by
        `weights` [N, top_k] and summed; `products(x, expert, counts)` runs the rows x [S, d] in
        order of their experts [S], `counts` of each."""
        flat = chosen.flatten()  # [N * top_k]: the (token, choice) pairs
        order = flat.argsort(stable=True)  # the pairs grouped by expert
        rows = order // chosen.size(1)  # each pair's token
        counts = torch.zeros(experts, dtype=torch.int64, device=tokens.device)
        counts = counts.scatter_add_(0, flat, torch.ones_like(flat))  # the pairs of each expert
        out = products(tokens[rows], flat[order], counts)  # [N * top_k, d]
        out = out * weights.flatten()[order, None].to(out.dtype)
        return tokens.new_zeros(tokens.shape).index_add_(0, rows, out.to(tokens.dtype))

    @staticmethod
    def grouped(x):
        """Whether each projection is one grouped product over the experts (grouped_linear): on
        CUDA in bfloat16, and while torch.compile traces with the runtime's op registered."""
        return (x.is_cuda and x.dtype == torch.bfloat16) or \
            (torch.compiler.is_compiling() and hasattr(torch.ops.xspec, "grouped_linear"))

    @staticmethod
    def grouped_linear(x, weight, counts):
        """x [S, in], rows grouped by expert (`counts` of each), times each expert's weight
        [E, out, in] transposed: [S, out]. On CUDA in bfloat16 one grouped product; while
        torch.compile traces, the op the runtime registers (xspec::grouped_linear), which keeps
        sizes that depend on the routing out of the graph; otherwise one product per expert."""
        if x.is_cuda and x.dtype == torch.bfloat16:
            offsets = counts.cumsum(dim=0).to(torch.int32)
            return F.grouped_mm(x, weight.to(x.dtype).transpose(-2, -1), offs=offsets)
        if torch.compiler.is_compiling() and hasattr(torch.ops.xspec, "grouped_linear"):
            return torch.ops.xspec.grouped_linear(x, weight.to(x.dtype), counts)
        parts = x.split(counts.tolist())
        # unbind, not weight[e]: its backward stacks the experts' gradients once, where indexing
        # fills a zero gradient of the whole bank per expert
        return torch.cat([part @ w.transpose(0, 1) for part, w in zip(parts, weight.unbind(0))])


class MixtureOfExperts(GroupedExperts):
    """`experts` gated feed-forward experts, down(activation(gate x, up x)), each token through the
    `top_k` its router chooses, their outputs weighted by the router (Shazeer et al., 2017; Fedus
    et al., 2022). The (token, choice) pairs are sorted by expert, and each expert multiplies
    its rows at once. `routed` keeps the last choices, for the load-balancing loss."""

    def __init__(self, d_model, experts, d_ff, router, activation):
        super().__init__()
        self.router, self.activation = router, activation
        # [E, out, in], as nn.Linear keeps its weight
        self.gate = nn.Parameter(torch.empty(experts, d_ff, d_model))
        self.up = nn.Parameter(torch.empty(experts, d_ff, d_model))
        self.down = nn.Parameter(torch.empty(experts, d_model, d_ff))
        self.init_experts()
        self.routed = None  # the chosen experts [N, top_k] and probabilities [N, E]

    def reset_parameters(self):
        self.init_experts()

    def init_experts(self):
        """Each expert's matrices of variance 1 / their inputs."""
        for weight in (self.gate, self.up, self.down):
            nn.init.normal_(weight, std=weight.size(-1) ** -0.5)

    def forward(self, x):
        tokens = x.reshape(-1, x.size(-1))  # [N, d]
        weights, chosen, probabilities = self.router(tokens)
        self.routed = (chosen, probabilities)
        summed = self.dispatch(tokens, weights, chosen, self.gate.size(0), self.products)
        return summed.reshape(x.shape)

    def last_routing(self):
        """The last forward's chosen experts [N, top_k] and probabilities [N, E], or None."""
        return self.routed

    def load_correction(self):
        return self.router.load_correction()

    def products(self, x, expert, counts):
        gate, up = (self.grouped_linear(x, weight, counts) for weight in (self.gate, self.up))
        return self.grouped_linear(self.activation(gate, up), self.down, counts)


class BiasedMixtureOfExperts(MixtureOfExperts):
    """Experts whose gate, up and down projections have biases (gpt-oss)."""

    def __init__(self, d_model, experts, d_ff, *args, **kwargs):
        super().__init__(d_model, experts, d_ff, *args, **kwargs)
        self.gate_bias = nn.Parameter(torch.zeros(experts, d_ff))
        self.up_bias = nn.Parameter(torch.zeros(experts, d_ff))
        self.down_bias = nn.Parameter(torch.zeros(experts, d_model))

    def reset_parameters(self):
        super().reset_parameters()
        for bias in (self.gate_bias, self.up_bias, self.down_bias):
            nn.init.zeros_(bias)

    def products(self, x, expert, counts):
        gate = self.grouped_linear(x, self.gate, counts) + self.gate_bias[expert].to(x.dtype)
        up = self.grouped_linear(x, self.up, counts) + self.up_bias[expert].to(x.dtype)
        out = self.grouped_linear(self.activation(gate, up), self.down, counts)
        return out + self.down_bias[expert].to(out.dtype)


class Experts(GroupedExperts):
    """A bank of `experts` gated feed-forward experts as transformers keeps them (`mlp.experts`):
    gate_up_proj [E, 2 d_ff, d] (the gate's rows, then up's) and down_proj [E, d, d_ff]. x [..., d]
    and its routing weights [..., E] (a TopKRouter's) -> each token through the `top_k` experts
    its weights choose, down(activation(gate x, up x)), weighted and summed."""

    def __init__(self, d_model, experts, d_ff, top_k, activation):
        super().__init__()
        self.top_k, self.activation = top_k, activation
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * d_ff, d_model))
        self.down_proj = nn.Parameter(torch.empty(experts, d_model, d_ff))
        self.init_experts()

    def reset_parameters(self):
        self.init_experts()

    def init_experts(self):
        """Each expert's matrices of variance 1 / their inputs."""
        for weight in (self.gate_up_proj, self.down_proj):
            nn.init.normal_(weight, std=weight.size(-1) ** -0.5)

    def forward(self, x, routing):
        tokens, routing = x.reshape(-1, x.size(-1)), routing.reshape(-1, routing.size(-1))
        weights, chosen = routing.topk(self.top_k, dim=-1)
        summed = self.dispatch(tokens, weights, chosen, routing.size(-1), self.products)
        return summed.reshape(x.shape)

    def products(self, x, expert, counts):
        if self.grouped(x):
            gate, up = self.grouped_linear(x, self.gate_up_proj, counts).chunk(2, dim=-1)
            return self.grouped_linear(self.activation(gate, up), self.down_proj, counts)
        # each expert's rows through its whole feed-forward, one concatenation of the outputs
        # (bench/experts.py: faster to train on CPUs than a concatenation per projection)
        out = []
        for part, gate_up, down in zip(x.split(counts.tolist()), self.gate_up_proj.unbind(0),
                                       self.down_proj.unbind(0)):
            gate, up = (part @ gate_up.T).chunk(2, dim=-1)
            out.append(self.activation(gate, up) @ down.T)
        return torch.cat(out)


class BiasedExperts(Experts):
    """Experts whose projections have biases (gpt-oss): gate_up_proj_bias [E, 2 d_ff] and
    down_proj_bias [E, d]."""

    def __init__(self, d_model, experts, d_ff, *args):
        super().__init__(d_model, experts, d_ff, *args)
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(experts, 2 * d_ff))
        self.down_proj_bias = nn.Parameter(torch.zeros(experts, d_model))

    def reset_parameters(self):
        super().reset_parameters()
        for bias in (self.gate_up_proj_bias, self.down_proj_bias):
            nn.init.zeros_(bias)

    def products(self, x, expert, counts):
        if self.grouped(x):
            gate_up = self.grouped_linear(x, self.gate_up_proj, counts)
            gate, up = (gate_up + self.gate_up_proj_bias[expert].to(x.dtype)).chunk(2, dim=-1)
            out = self.grouped_linear(self.activation(gate, up), self.down_proj, counts)
            return out + self.down_proj_bias[expert].to(out.dtype)
        weights = (self.gate_up_proj, self.gate_up_proj_bias, self.down_proj, self.down_proj_bias)
        out = []
        for part, gate_up, gate_up_bias, down, down_bias in zip(x.split(counts.tolist()),
                                                                *(w.unbind(0) for w in weights)):
            gate, up = F.linear(part, gate_up, gate_up_bias).chunk(2, dim=-1)
            out.append(F.linear(self.activation(gate, up), down, down_bias))
        return torch.cat(out)
