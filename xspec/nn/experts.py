"""The mixture of experts that generated models use, as pieces the compiler chooses between: a
router (softmax or sigmoid scores, its weights scaled or not, its choice limited to the best groups
of experts or corrected by a bias per expert: DeepSeek-V3's), an activation of the gated experts
(SwiGLU, GeGLU, gpt-oss's clamped SwiGLU), and the bank of experts that holds them (with biases or
without). A generated file imports the pieces its spec names and nothing else. The load-balancing
loss is training's (runtime/load_balance.py): it reads what each forward records in `routed`."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Router(nn.Linear):
    """Each token's `top_k` experts by softmax(x W_r), their probabilities as weights (Shazeer et
    al., 2017), renormalized to sum to 1 where `normalize` (norm_topk_prob)."""

    def __init__(self, d_model, experts, top_k, *, bias, normalize):
        super().__init__(d_model, experts, bias=bias)
        self.top_k, self.normalize = top_k, normalize

    def scores(self, logits):
        return logits.softmax(dim=-1)

    def choose(self, scores):
        """The experts each token goes to: [N, experts] -> [N, top_k]."""
        return scores.topk(self.top_k, dim=-1).indices

    def forward(self, tokens):
        """tokens [N, d] -> weights [N, top_k] and probabilities [N, experts] (float32), and the
        chosen experts [N, top_k]."""
        logits = super().forward(tokens).float()
        scores = self.scores(logits)
        chosen = self.choose(scores)
        weights = scores.gather(-1, chosen)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, chosen, logits.softmax(dim=-1)

    def load_correction(self):
        """The per-expert bias that training moves against the load; None: this router has none."""
        return None


class SigmoidRouter(Router):
    """A router that chooses by sigmoid(x W_r), each expert's score independent of the others'."""

    def scores(self, logits):
        return logits.sigmoid()


class CorrectedRouter(Router):
    """Chooses by the scores plus a bias per expert that training moves to even out the experts'
    loads (DeepSeek-V3's auxiliary-loss-free balancing, §2.1.2); weights by the scores alone.
    The bias is state, not learned: checkpoints keep it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("correction_bias", torch.zeros(self.out_features))

    def reset_parameters(self):
        super().reset_parameters()
        for bias in self.buffers(recurse=False):  # the correction (none while nn.Linear builds)
            nn.init.zeros_(bias)

    def choose(self, scores):
        return super().choose(scores + self.correction_bias)

    def load_correction(self):
        return self.correction_bias


class GroupLimitedRouter(Router):
    """The experts in `groups` groups: a token chooses among the experts of its `top_groups`
    groups whose two best scores sum highest (DeepSeek-V3's node-limited routing)."""

    def __init__(self, *args, groups, top_groups, **kwargs):
        super().__init__(*args, **kwargs)
        self.groups, self.top_groups = groups, top_groups

    def choose(self, scores):
        grouped = scores.unflatten(-1, (self.groups, -1))  # [N, groups, experts per group]
        best = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [N, groups]
        kept = torch.zeros_like(best, dtype=torch.bool)
        kept.scatter_(1, best.topk(self.top_groups, dim=-1).indices, True)
        return super().choose(grouped.masked_fill(~kept[..., None], float("-inf")).flatten(1))


class ScaledRouter(Router):
    """The chosen experts' weights multiplied by `scale` (routed_scaling_factor)."""

    def __init__(self, *args, scale, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = scale

    def forward(self, tokens):
        weights, chosen, probabilities = super().forward(tokens)
        return weights * self.scale, chosen, probabilities


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


class MixtureOfExperts(nn.Module):
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
        flat = chosen.flatten()  # [N * top_k]: the (token, choice) pairs
        order = flat.argsort(stable=True)  # the pairs grouped by expert
        rows = order // chosen.size(1)  # each pair's token
        counts = torch.zeros(self.gate.size(0), dtype=torch.int64, device=x.device)
        counts = counts.scatter_add_(0, flat, torch.ones_like(flat))  # the pairs of each expert
        out = self.experts(tokens[rows], flat[order], counts)  # [N * top_k, d]
        out = out * weights.flatten()[order, None].to(out.dtype)
        summed = tokens.new_zeros(tokens.shape).index_add_(0, rows, out.to(tokens.dtype))
        return summed.reshape(x.shape)

    def last_routing(self):
        """The last forward's chosen experts [N, top_k] and probabilities [N, E], or None."""
        return self.routed

    def load_correction(self):
        return self.router.load_correction()

    def experts(self, x, expert, counts):  # x [S, d], its rows' experts [S] in order
        gate, up = (self.grouped_linear(x, weight, counts) for weight in (self.gate, self.up))
        return self.grouped_linear(self.activation(gate, up), self.down, counts)

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
        return torch.cat([part @ weight[e].transpose(0, 1) for e, part in enumerate(parts)])


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

    def experts(self, x, expert, counts):
        gate = self.grouped_linear(x, self.gate, counts) + self.gate_bias[expert].to(x.dtype)
        up = self.grouped_linear(x, self.up, counts) + self.up_bias[expert].to(x.dtype)
        out = self.grouped_linear(self.activation(gate, up), self.down, counts)
        return out + self.down_bias[expert].to(out.dtype)
