"""Attention maps of a trained model for one sentence (the paper's Figures 3-5), as heatmaps.

The weights are recomputed from the inputs a forward hook captures, through the attention module's
own `prepare` (its queries, keys and mask, positions and key heads included): softmax(Q Kᵀ / sqrt(d_k))
masked (§3.2.1), per head (§3.2.2), as SDPA computes them, or by the module's `weights` where its
options (soft caps, sinks) make it compute them itself.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from xspec.compiler.entries import MTP
from xspec.compiler.op_attention import AttentionAttrs
from xspec.compiler.ops import OPS
from xspec.base.errors import UserError
from xspec.runtime import checkpoint as ckpt
from xspec.runtime.attention_kernels import heads_of
from xspec.runtime.beam_search import beam_search
from xspec.runtime.inference import build_from_checkpoint, compile_checkpoint_spec
from xspec.runtime.tasks import max_sequence_tokens
from xspec.runtime.vocab import BOS, EOS, Vocab
from xspec.compiler.opdef import Family
from xspec.compiler.ir import node_of

if TYPE_CHECKING:
    from xspec.compiler.spec import CompiledSpec

PLOT_FORMATS = ("png", "svg", "pdf")
DPI = 110
MAX_PIXELS = 30_000  # matplotlib refuses 2^16; far smaller already is no longer a picture


_KIND_ORDER = ("encoder self-attention", "decoder self-attention", "encoder-decoder attention")


@dataclass(frozen=True)
class AttentionSite:
    """One attention op of the model: where it is and what it attends over."""

    module: str  # module path, e.g. decoder.layers.3.cross_attn
    kind: str  # "encoder self-attention", "decoder self-attention", "encoder-decoder attention"
    layer: int  # 1-based position in its stack (the paper: "layer 5 of 6")
    layers: int


@dataclass
class AttentionMap:
    site: AttentionSite
    weights: torch.Tensor  # [heads, queries, keys]
    queries: list[str]
    keys: list[str]


def attention_sites(spec: "CompiledSpec") -> list[AttentionSite]:
    """Every attention op a forward runs, read off the graph (all layers), in the order the model runs them."""
    sites = []
    for node, data in spec.graph.nodes(data=True):
        if OPS[data["node"].op].family != Family.ATTENTION:
            continue
        entry = data["node"].scope.split(".")[0]
        if entry == MTP:  # multi-token prediction runs in training and drafting only: no map of a forward
            continue
        # The role validation recorded (latent attention has one input: self-attention).
        kind = f"{entry} self-attention" if data["node"].inferred["self_attention"] else "encoder-decoder attention"
        frames = data["node"].repeat
        layer, layers = (frames[0][1] + 1, frames[0][2]) if frames else (1, 1)
        sites.append(AttentionSite(node, kind, layer, layers))
    return sorted(sites, key=lambda s: (_KIND_ORDER.index(s.kind), s.layer))  # Figures 3-5 by attention


def select(sites: list[AttentionSite], layer: Optional[int]) -> list[AttentionSite]:
    if layer is None:
        return sites
    deepest = max(s.layers for s in sites)
    if not 1 <= layer <= deepest:
        raise UserError(f"--layer {layer}: the model's stacks have layers 1 to {deepest}")
    return [s for s in sites if s.layer == layer]


def capture(model: torch.nn.Module, spec: "CompiledSpec", sites: list[AttentionSite],
            src: Optional[torch.Tensor], tgt_in: torch.Tensor) -> dict[str, torch.Tensor]:
    """Runs the model once (teacher-forced on `tgt_in`) and returns each site's weights
    [heads, queries, keys] for the single sentence in the batch."""
    captured: dict[str, torch.Tensor] = {}
    handles = []
    for site in sites:
        module = model.get_submodule(site.module)
        attrs = node_of(spec.graph, site.module).attrs
        recorder = _recorder(site.module, captured) if isinstance(attrs, AttentionAttrs) \
            else _latent_recorder(site.module, captured)
        handles.append(module.register_forward_hook(recorder, with_kwargs=True))
    try:
        model.eval()
        with torch.no_grad():
            if src is not None and not spec.has_decoder:    # an encoder alone reads the sentence
                model(src, torch.zeros_like(src, dtype=torch.bool))
            elif src is not None:     # a translation model's one sentence: nothing padded
                model(src, tgt_in, torch.zeros_like(src, dtype=torch.bool))
            else:
                model(tgt_in)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def _recorder(name: str, captured: dict[str, torch.Tensor]):
    def hook(module, args, kwargs, output):
        query, key, value = args[:3]
        padding = args[3] if len(args) > 3 else kwargs.get("padding_mask")
        q, k, mask, is_causal = scores_inputs(module, query, key, value, padding, kwargs.get("position_bias"),
                                              kwargs.get("position_embeddings"))
        if module.inner_attention is not None:  # written out (WrittenOutAttention)
            captured[name] = module.inner_attention.weights(q, k, mask, module.sinks)[0]
        else:
            captured[name] = sdpa_weights(q, k, mask, is_causal)[0]
    return hook


def _latent_recorder(name: str, captured: dict[str, torch.Tensor]):
    """Latent attention (DeepSeek): its queries and the keys it makes from the latent, through the
    module's own `project` and `keys_values`, causal, at its own scale."""
    def hook(module, args, kwargs, output):
        q_nope, q_rope, latent, k_rope = module.project(args[0], kwargs.get("position_embeddings"))
        k, _ = module.keys_values(latent, k_rope)
        q = torch.cat([q_nope, q_rope], dim=-1)
        captured[name] = sdpa_weights(q * (module.scale * q.size(-1) ** 0.5), k, None, True)[0]
    return hook


def scores_inputs(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  padding: Optional[torch.Tensor], position_bias: Optional[torch.Tensor] = None,
                  angles: Optional[torch.Tensor] = None) -> tuple:
    """A generated attention's queries [B, h, Tq, d_k] and keys [B, kv_h, Tk, d_k], and the mask SDPA
    takes (with a position bias, T5's, added) with whether its causal mask serves, through the module's
    own steps (no cache; turned by the stack's rotary `angles`, if given)."""
    q, k, _ = heads_of(module, query, key, value, angles)
    attention: Any = module  # its methods: torch types a module's attributes Tensor | Module
    return (q, k, *attention.mask(q, k, padding, None, position_bias))


def sdpa_weights(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor], is_causal: bool) -> torch.Tensor:
    """The weights F.scaled_dot_product_attention gives the values: softmax(Q Kᵀ / sqrt(d_k)) (a piece
    with another scale folds it into the queries), a boolean
    mask's False keys left out and a float mask added, each key head serving a group of query heads:
    [B, h, Tq, Tk]."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
    if is_causal:
        mask = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, -math.inf)
    elif mask is not None:
        scores = scores + mask
    return scores.softmax(dim=-1)


def collect_maps(spec: "CompiledSpec", model: torch.nn.Module, vocab: Vocab, sentence: str,
                 target: Optional[str], layer: Optional[int], head: Optional[int]) -> list[AttentionMap]:
    """Encodes `sentence`, decodes it greedily unless `target` is given, and returns the maps of
    the chosen layer and head (None: all)."""
    sites = select(attention_sites(spec), layer)
    # A generated attention module's int: torch types a module's attributes Tensor | Module.
    heads: int = min(model.get_submodule(s.module).heads for s in sites)  # type: ignore[type-var,assignment]
    if head is not None and not 1 <= head <= heads:
        raise UserError(f"--head {head}: the model's attention has heads 1 to {heads}")
    src_ids, tgt_ids = _token_ids(spec, model, vocab, sentence, target)
    device = next(model.parameters()).device
    src = torch.tensor([src_ids], device=device) if src_ids else None
    weights = capture(model, spec, sites, src, torch.tensor([tgt_ids], device=device))
    source, output = _pieces(vocab, src_ids), _pieces(vocab, tgt_ids)
    maps = []
    for site in sites:
        w = weights[site.module].float().cpu()
        w = w[head - 1:head] if head is not None else w
        queries = source if site.kind == "encoder self-attention" else output
        keys = source if site.kind == "encoder-decoder attention" or site.kind == "encoder self-attention" else output
        maps.append(AttentionMap(site, w, queries, keys))
    return maps


def _token_ids(spec: "CompiledSpec", model: torch.nn.Module, vocab: Vocab, sentence: str,
               target: Optional[str]) -> tuple[list[int], list[int]]:
    """(source ids, decoder input ids) as training builds them: source pieces + EOS, BOS + target.
    A decoder-only model has no source and reads the sentence itself; an encoder alone has no output."""
    limit = max_sequence_tokens(spec) - 1  # room for EOS / BOS
    if not spec.has_decoder:
        return vocab.encode([sentence])[0][:limit] + [EOS], []
    if not spec.has_encoder:
        return [], [BOS] + vocab.encode([sentence])[0][:limit]
    src_ids = vocab.encode([sentence])[0][:limit] + [EOS]
    out_ids = vocab.encode([target])[0] if target is not None else _greedy(model, spec, src_ids)
    return src_ids, [BOS] + out_ids[:limit]


def _pieces(vocab: Vocab, ids: list[int]) -> list[str]:
    return [vocab.sp.id_to_piece(i) for i in ids]


def _greedy(model, spec: "CompiledSpec", src_ids: list[int]) -> list[int]:
    device = next(model.parameters()).device
    src = torch.tensor([src_ids], device=device)
    with torch.no_grad():
        hyps = beam_search(model.eval(), src, torch.zeros_like(src, dtype=torch.bool), beam=1,
                           alpha=spec.decode.length_penalty,
                           max_len_a=spec.decode.max_len_a, max_len_b=spec.decode.max_len_b,
                           max_positions=max_sequence_tokens(spec))
    return hyps[0][0].tokens if hyps[0] else []


def check_plot_format(path: Path) -> None:
    if path.suffix.lower().lstrip(".") not in PLOT_FORMATS:
        raise UserError(f"{path}: attention maps are written as {', '.join('.' + f for f in PLOT_FORMATS)}")


def plot(maps: list[AttentionMap], path: Path, head: Optional[int], title: str) -> Path:
    """A grid of heatmaps: one row per (attention, layer), one column per head; tokens on the axes."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    check_plot_format(path)
    columns = max(m.weights.size(0) for m in maps)
    cell = 0.22  # inches per token: room for a small label
    width = max(len(m.keys) for m in maps) * cell + 1.4
    height = max(len(m.queries) for m in maps) * cell + 1.4
    size = (columns * width, len(maps) * height)
    if max(size) * DPI > MAX_PIXELS:
        raise UserError(f"{len(maps)} × {columns} attention maps make an image of {size[0] * DPI:,.0f} × "
                        f"{size[1] * DPI:,.0f} pixels; choose a --layer and/or a --head")
    figure, axes = plt.subplots(len(maps), columns, figsize=size, squeeze=False, constrained_layout=True)
    for row, amap in enumerate(maps):
        for col in range(columns):
            if col < amap.weights.size(0):
                image = _heatmap(axes[row][col], amap, col, head if head is not None else col + 1)
            else:
                axes[row][col].axis("off")
    figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    figure.suptitle(textwrap.fill(title, width=max(40, int(size[0] * 12))), fontsize=10)  # ~12 chars an inch
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path


def _heatmap(ax, amap: AttentionMap, index: int, head_number: int):
    """One head's weights, queries down the side and keys along the bottom, each with its token."""
    image = ax.imshow(amap.weights[index].numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="equal")
    ax.set_title(f"{amap.site.kind}\nlayer {amap.site.layer} of {amap.site.layers}, head {head_number}", fontsize=8)
    ax.set_xticks(range(len(amap.keys)), amap.keys, rotation=90, fontsize=7)
    ax.set_yticks(range(len(amap.queries)), amap.queries, fontsize=7)
    ax.set_xlabel("keys", fontsize=7)
    ax.set_ylabel("queries", fontsize=7)
    return image


def load_trained(run_or_checkpoint: Path, device: str = "cpu"):
    """(spec, model, vocabulary, step) of a run's latest checkpoint, or of a checkpoint file, each
    checked as untrusted data (xspec.runtime.inference)."""
    checkpoint = ckpt.load_merged(ckpt.resolve(run_or_checkpoint))
    spec = compile_checkpoint_spec(checkpoint)
    model, vocab = build_from_checkpoint(checkpoint, spec, device)
    return spec, model, vocab, checkpoint.step
