"""The compiled paper models compute what torch.nn.Transformer computes with the same weights."""

import torch
import torch.nn as nn

import xspec
from float32 import assert_close

VOCAB = 1000  # the paper's 37000 adds nothing here but time


def _reference(spec: xspec.CompiledSpec, norm_first: bool) -> nn.Transformer:
    p = spec.params
    ref = nn.Transformer(d_model=p["d_model"], nhead=p["heads"], num_encoder_layers=p["layers"],
                         num_decoder_layers=p["layers"], dim_feedforward=p["d_ff"], dropout=p["dropout"],
                         batch_first=True, norm_first=norm_first)
    if not norm_first:  # the paper's post-norm stacks end with the last sublayer's own norm
        ref.encoder.norm = nn.Identity()
        ref.decoder.norm = nn.Identity()
    return ref.eval()


def _copy_attention(ours, theirs: nn.MultiheadAttention) -> None:
    q, k, v = theirs.in_proj_weight.chunk(3)
    qb, kb, vb = theirs.in_proj_bias.chunk(3)
    for proj, w, b in ((ours.q_proj, q, qb), (ours.k_proj, k, kb), (ours.v_proj, v, vb)):
        proj.weight.copy_(w)
        proj.bias.copy_(b)
    ours.o_proj.weight.copy_(theirs.out_proj.weight)
    ours.o_proj.bias.copy_(theirs.out_proj.bias)


def _copy_layer(ours, theirs, cross: bool) -> None:
    _copy_attention(ours.self_attn, theirs.self_attn)
    # nn.Transformer's norm1, norm2 (and norm3) follow its sublayers in order
    sublayers = ["self_attn_sublayer"] + (["cross_attn_sublayer"] if cross else []) + ["ffn_sublayer"]
    norms = [theirs.norm1, theirs.norm2] + ([theirs.norm3] if cross else [])
    if cross:
        _copy_attention(ours.cross_attn, theirs.multihead_attn)
    for sublayer, norm in zip(sublayers, norms):
        getattr(ours, sublayer).norm.load_state_dict(norm.state_dict())
    ours.ffn.w_1.load_state_dict(theirs.linear1.state_dict())
    ours.ffn.w_2.load_state_dict(theirs.linear2.state_dict())


@torch.no_grad()
def _compare(overrides: dict, norm_first: bool) -> None:
    torch.manual_seed(0)
    spec = xspec.compile("specs/base.xspec", overrides={"vocab": VOCAB, **overrides})
    model = spec.build(device="cpu").eval()
    ref = _reference(spec, norm_first)
    for ours, theirs in zip(model.encoder.layers, ref.encoder.layers):
        _copy_layer(ours, theirs, cross=False)
    for ours, theirs in zip(model.decoder.layers, ref.decoder.layers):
        _copy_layer(ours, theirs, cross=True)
    if norm_first:
        model.encoder.norm.load_state_dict(ref.encoder.norm.state_dict())
        model.decoder.norm.load_state_dict(ref.decoder.norm.state_dict())

    src = torch.randint(0, VOCAB, (3, 11))
    tgt = torch.randint(0, VOCAB, (3, 7))
    src_pad = torch.zeros(3, 11, dtype=torch.bool)
    src_pad[1, 8:] = True  # one padded sentence
    # The reference, with the tied embedding and positions computed independently (§3.4-3.5).
    weight = model.encoder.embedding.embed.weight
    d = spec.params["d_model"]
    position = torch.arange(11)[:, None]
    angle = position / torch.pow(10000.0, torch.arange(0, d, 2) / d)
    pe = torch.zeros(11, d)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)

    def embed(tokens):
        return weight[tokens] * d ** 0.5 + pe[: tokens.size(1)]

    causal = nn.Transformer.generate_square_subsequent_mask(7)
    hidden = ref(embed(src), embed(tgt), tgt_mask=causal, src_key_padding_mask=src_pad,
                 memory_key_padding_mask=src_pad, tgt_is_causal=True)
    expected = hidden @ weight.T

    actual = model(src, tgt, src_pad)
    assert actual.shape == (3, 7, VOCAB)
    assert_close(actual, expected)


def test_post_norm_base_matches_nn_transformer():
    _compare({}, norm_first=False)


def test_pre_norm_variant_matches_norm_first_transformer():
    _compare({"norm_first": True}, norm_first=True)
