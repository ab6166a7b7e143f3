"""DeepSeek-V3's multi-token prediction (§2.2): the spec's `mtp` block built `mtp_depth` times, sharing the
decoder's embedding and output head; each depth's loss aligned as the paper's equations say (depth k at
position i reads the token i + k and predicts the one after it, never reading further); the training
loss with lambda times their mean, logged apart; and greedy decoding that drafts with the depths, its
continuation token for token plain greedy decoding's, its acceptance counted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import xspec
from xspec.base.errors import SpecError
from xspec.runtime.multi_token import HeadReads, depth_losses
from xspec.runtime.sampling import sample
from xspec.runtime import speculative
from xspec.runtime.speculative import Drafts, speculative_greedy
from xspec.runtime.step import TrainingStep

ROOT = Path(__file__).resolve().parents[1]
SPEC = "specs/modern/deepseek_v3.xspec"
SMALL = {"vocab": 40, "d_model": 32, "layers": 2, "heads": 2, "q_lora_rank": 0, "kv_lora_rank": 16,
         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 4, "n_group": 2,
         "moe_intermediate_size": 16, "d_ff": 48}
NEVER = (0, 1)


def _model(depth: int, seed: int = 0):
    spec = xspec.compile(SPEC, overrides={**SMALL, "mtp_depth": depth})
    torch.manual_seed(seed)
    return spec, spec.build("cpu")


def test_each_depth_shares_the_decoders_embedding_and_output_head():
    spec, model = _model(3)
    assert spec.output_head == "decoder.lm_head" and len(model.mtp) == 3
    assert all(depth.embed_tokens.weight is model.decoder.embed_tokens.weight for depth in model.mtp)
    assert spec.param_shapes["mtp.2.eh_proj.weight"] == (32, 64)   # [e; h] -> d_model
    assert not any(name.startswith("mtp.") for name in xspec.compile(SPEC, overrides={**SMALL, "mtp_depth": 0})
                   .param_shapes)
    source = spec.python_source
    assert "self.eh_proj(torch.cat([e, self.hnorm(h)], dim=-1))" in source
    assert "for layer in self.mtp:  # tie, deepseek_v3.xspec:" in source


@pytest.mark.parametrize("overrides, message", [
    ({"mtp_depth": -1}, "mtp_depth counts the depths of multi-token prediction"),
    ({"mtp_depth": 1.5}, "mtp_depth counts the depths of multi-token prediction"),
])
def test_a_depth_that_is_not_a_count_is_refused_at_the_block(overrides, message):
    with pytest.raises(SpecError, match=message):
        xspec.compile(SPEC, overrides={**SMALL, **overrides})


def test_multi_token_prediction_needs_a_language_model(tmp_path):
    path = tmp_path / "translation.xspec"
    path.write_text(f'import "{ROOT / "specs" / "base.xspec"}"\n'
                    "model t extends transformer_base {\n  block mtp(h, tokens) { return h }\n}\n")
    with pytest.raises(SpecError, match="block mtp predicts tokens further ahead for a language model"):
        xspec.compile(str(path))


@torch.no_grad()
def test_depth_k_at_position_i_reads_the_token_i_plus_k_and_predicts_the_next():
    """Against the paper's equations written out: depth 1 reads h_i and Emb(t_{i+1}), depth 2 reads depth 1's
    state and Emb(t_{i+2}); changing a later token changes no earlier prediction."""
    spec, model = _model(2)
    model.eval()
    head = model.get_submodule(spec.output_head)
    tokens = torch.randint(2, 40, (2, 12), generator=torch.Generator().manual_seed(3))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    reads = HeadReads(head)
    model(inputs)
    states = reads.take()
    losses = depth_losses(model.mtp, head, states, labels)
    first = model.mtp[0](states[:, :10], labels[:, :10])
    second = model.mtp[1](first[:, :9], labels[:, 1:10])
    expected = [F.cross_entropy(head(h).flatten(0, 1), labels[:, k:].flatten(), reduction="sum")
                for k, h in ((1, first), (2, second))]
    torch.testing.assert_close(losses, torch.stack(expected))
    changed = labels.clone()
    changed[:, 6:] = (changed[:, 6:] + 7) % 40      # tokens from position 7 on (labels[5] is token 6)
    again = model.mtp[0](states[:, :10], changed[:, :10])
    torch.testing.assert_close(again[:, :6], first[:, :6])      # position i <= 5 reads tokens up to i + 1 <= 6
    assert not torch.allclose(again[:, 6], first[:, 6])         # position 6 reads token 7
    reads.remove()


def test_training_adds_lambda_times_the_mean_of_the_depths_losses_and_keeps_it_apart():
    spec, model = _model(2)
    step = TrainingStep(model, label_smoothing=0.0, mtp_loss_weight=0.3, output_head=spec.output_head)
    assert step.side_names == ("aux_loss", "mtp_loss")
    tokens = torch.randint(2, 40, (2, 12), generator=torch.Generator().manual_seed(4))
    loss = step(tokens[:, 1:], tokens[:, :-1])
    aux, mtp = step.take_side_losses()
    with torch.no_grad():
        main = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten(), reduction="sum")
    torch.testing.assert_close(loss.detach(), main + 0.3 * mtp, rtol=1e-5, atol=1e-4)
    assert mtp > 0 and step.take_side_losses().sum() == 0
    validation = step(tokens[:, 1:], tokens[:, :-1], smoothed=False)
    torch.testing.assert_close(validation.detach(), main)   # the model's own loss, nothing added
    without = TrainingStep(_model(2)[1], label_smoothing=0.0, mtp_loss_weight=0.0, output_head=spec.output_head)
    assert without.side_names == ("aux_loss",)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_drafting_with_untrained_depths_continues_exactly_as_greedy_decoding(depth):
    spec, model = _model(depth, seed=depth)
    model.eval()
    head = model.get_submodule(spec.output_head)
    for seed in range(3):
        prompt = torch.randint(2, 40, (1, 6), generator=torch.Generator().manual_seed(seed))
        drafts = Drafts()
        drafted = speculative_greedy(model, model.mtp, head, prompt, 25, -1, NEVER, None, drafts)
        assert drafted == sample(model, prompt, 25, None, end_token=-1, never=NEVER)[0]
        assert drafts.proposed > 0 and 0 <= drafts.accepted <= drafts.proposed


@pytest.mark.parametrize("depth", [1, 3])
def test_accepted_and_rejected_drafts_leave_the_caches_as_plain_decoding_would(monkeypatch, depth):
    """Drafts made right (the greedy continuation itself) are all accepted; wrong ones all rejected; and the
    continuation is greedy decoding's either way, every rejected position dropped from the cache."""
    spec, model = _model(depth, seed=5)
    model.eval()
    head = model.get_submodule(spec.output_head)
    prompt = torch.randint(2, 40, (1, 5), generator=torch.Generator().manual_seed(8))
    greedy = sample(model, prompt, 30, None, end_token=-1, never=NEVER)[0]
    known = prompt[0].tolist() + greedy
    for right in (True, False):
        def draft(depths, head, caches, levels, tokens, choose, count, right=right):
            m = len(tokens)
            truth = known[m:m + count]
            return truth if right else [(t + 1) % 40 or 2 for t in truth]

        monkeypatch.setattr(speculative, "_draft", draft)
        drafts = Drafts()
        assert speculative_greedy(model, model.mtp, head, prompt, 30, -1, NEVER, None, drafts) == greedy
        assert drafts.proposed > 0 and drafts.accepted == (drafts.proposed if right else 0)


def test_depths_trained_on_a_periodic_language_draft_what_the_model_accepts():
    spec, model = _model(2)
    step = TrainingStep(model, label_smoothing=0.0, mtp_loss_weight=1.0, output_head=spec.output_head)
    optimizer = torch.optim.Adam(step.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):
        starts = torch.randint(0, 11, (8, 1), generator=generator)
        sequence = 2 + (starts + torch.arange(25)) % 11
        step(sequence[:, 1:], sequence[:, :-1]).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    prompt = (2 + torch.arange(4) % 11)[None]
    drafts = Drafts()
    head = model.get_submodule(spec.output_head)
    drafted = speculative_greedy(model, model.mtp, head, prompt, 30, -1, NEVER, None, drafts)
    assert drafted == sample(model, prompt, 30, None, end_token=-1, never=NEVER)[0]
    assert drafts.rate > 0.5, drafts
    assert str(drafts).startswith(f"speculative decoding: {drafts.accepted} of {drafts.proposed} drafted tokens")
