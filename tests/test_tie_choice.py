"""Ties under a model-level `if` stay a choice of the generated config (compiler/tie_choice.py): edited, the
config ties what the same --set compiles; where a choice would not be sound, the file ties as the spec's
values decide."""

import itertools
from pathlib import Path

import pytest
import torch

import xspec
from generated_config import module_and_config

SPECS = Path(__file__).resolve().parent.parent / "specs"

TOY = """model toy {
  param vocab = 64
  param d_model = 16
  param tie_output = false
  param tie_second = true

  block decoder(tokens) {
    x = embedding(tokens, vocab, d_model) as embed_tokens
    y = embedding(tokens, vocab, d_model) as second_embed
    z = embedding(tokens, vocab, d_model) as third_embed
    h = linear(x + y + z, d_model, bias = false) as proj
    return linear(h, vocab, bias = false) as lm_head
  }

  if tie_output {
    tie decoder.embed_tokens.weight, decoder.lm_head.weight
  }
  if tie_second {
    tie decoder.second_embed.weight, OTHER
  }
}
"""


def _shared(model: torch.nn.Module) -> set[frozenset[str]]:
    """The sets of parameter names that are one tensor."""
    by_tensor: dict[int, set[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(parameter), set()).add(name)
    return {frozenset(names) for names in by_tensor.values() if len(names) > 1}



def test_each_condition_is_an_if_over_the_config_and_every_choice_ties_what_set_compiles(tmp_path):
    source = TOY.replace("OTHER", "decoder.third_embed.weight")
    spec = xspec.compile_source(source, str(tmp_path / "toy.xspec"))
    assert "if config.tie_output:  # toy.xspec:15" in spec.python_source
    assert "if config.tie_second:  # toy.xspec:18" in spec.python_source
    module, _ = module_and_config(spec)
    for tie_output, tie_second in itertools.product((False, True), repeat=2):
        with torch.device("meta"):
            built = module.Model(module.ToyConfig(tie_output=tie_output, tie_second=tie_second))
        wanted = xspec.compile_source(source, str(tmp_path / "toy.xspec"),
                                      overrides={"tie_output": tie_output, "tie_second": tie_second})
        assert _shared(built) == _shared(wanted.build(device="meta")) == {
            frozenset(tied) | {owner} for tied, owner in _groups(wanted.ties)}


def _groups(ties: dict[str, str]) -> list[tuple[set[str], str]]:
    owners: dict[str, set[str]] = {}
    for tied, owner in ties.items():
        owners.setdefault(owner, set()).add(tied)
    return [(tied, owner) for owner, tied in owners.items()]


def test_conditions_whose_ties_meet_are_decided_by_the_spec_values(tmp_path):
    """Both conditions tie lm_head: run one after the other, the second would untie the first's pair where the
    spec makes one tensor of three. The file ties as the spec's values decide, and the config has no field
    that would not change the ties."""
    source = TOY.replace("OTHER", "decoder.lm_head.weight")
    spec = xspec.compile_source(source, str(tmp_path / "toy.xspec"))
    assert "if config." not in spec.python_source
    assert "self.decoder.lm_head.weight = self.decoder.second_embed.weight  # tie, toy.xspec:19" \
        in spec.python_source
    assert "tie_output" not in spec.python_source and "tie_second" not in spec.python_source
    both = xspec.compile_source(source, str(tmp_path / "toy.xspec"), overrides={"tie_output": True})
    assert _shared(both.build(device="meta")) == {
        frozenset({"decoder.embed_tokens.weight", "decoder.second_embed.weight", "decoder.lm_head.weight"})}


def test_a_condition_reading_a_parameter_a_block_decides_stays_decided():
    """BERT ties its masked-LM head where num_labels == 0, and num_labels chooses the head in a block: a
    config field for it would not build a classifier."""
    spec = xspec.compile(SPECS / "modern" / "bert.xspec")
    assert "num_labels" not in spec.python_source and "if config.tie_word_embeddings" not in spec.python_source
    assert "self.encoder.lm_head.weight = self.encoder.word_embeddings.weight  # tie, bert.xspec:56" \
        in spec.python_source


@pytest.mark.parametrize("path, field, edited", [("llama.xspec", "tie_word_embeddings", True),
                                                  ("t5.xspec", "tie_word_embeddings", False),
                                                  ("marian.xspec", "share_encoder_decoder_embeddings", False)])
def test_a_family_tie_follows_its_config(path, field, edited):
    spec = xspec.compile(SPECS / "modern" / path)
    module, config = module_and_config(spec)
    with torch.device("meta"):
        built = module.Model(config(**{field: edited}))
    wanted = xspec.compile(SPECS / "modern" / path, overrides={field: edited}).build(device="meta")
    assert _shared(built) == _shared(wanted) != _shared(spec.build(device="meta"))


def test_ties_of_modules_a_derived_spec_removed_are_left_out():
    """lm.xspec removes base.xspec's encoder, so base's `if tie_embeddings` ties nothing there: no field."""
    spec = xspec.compile(SPECS / "lm.xspec")
    assert "tie_embeddings" not in spec.python_source
    assert "if config.tie_output:  # lm.xspec:30" in spec.python_source
