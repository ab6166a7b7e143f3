"""A block's `if` over one boolean parameter stays a choice of its class (compiler/flag_choice.py): the flag is a
config field that, edited, builds and computes what the same --set compiles; where a choice would not be sound,
the file is written at the spec's value and the config has no field for it."""


import pytest
import torch

import xspec
from generated_config import module_and_config

TOY = """model toy {
  param vocab = 64
  param d_model = 16
  param first = false
  param second = true
  DERIVED

  block mix(x) {
    if first { x = relu(linear(x, d_model) as gate) }
    if second { x = tanh(x) }
    return x
  }

  block decoder(tokens) {
    x = embedding(tokens, vocab, d_model) as embed_tokens
    x = mix(x) as mix
    return linear(x, vocab, bias = false) as lm_head
  }
}
"""



def test_the_papers_norm_first_is_a_flag_of_the_sublayer_as_in_nn_transformer():
    source = xspec.compile("specs/base.xspec").python_source
    sublayer = source[source.index("class Sublayer("):source.index("class FeedForward(")]
    assert "self.norm_first = config.norm_first  # base.xspec:20" in sublayer
    assert "        if self.norm_first:  # base.xspec:20\n            return x + self.dropout(f(self.norm(x)))" \
        in sublayer
    assert "        return self.norm(x + self.dropout(f(x)))  # base.xspec:23" in sublayer
    encoder = source[source.index("class Encoder("):source.index("class DecoderLayer(")]
    assert "        if config.norm_first:  # base.xspec:58\n            self.norm = nn.LayerNorm(config.d_model)" \
        in encoder


def test_a_string_parameter_of_two_listed_values_is_chosen_in_the_constructor():
    """Table 3's row E (learned positions) is a config edit of the paper's spec; the forward reads the module
    alike, so the class keeps no flag."""
    source = xspec.compile("specs/base.xspec").python_source
    embed = source[source.index("class Embed("):source.index("class Sublayer(")]
    assert ("        if config.positions == 'learned':  # base.xspec:34\n"
            "            self.positions = LearnedPositions(config.d_model, config.max_len)  # base.xspec:35\n"
            "        else:\n"
            "            self.positions = SinusoidalPositions(config.d_model, config.max_len)  # base.xspec:37\n") \
        in embed
    assert "self.positions = config.positions" not in embed


@torch.no_grad()
def test_a_flag_edited_in_the_config_computes_what_set_compiles(tmp_path):
    spec = xspec.compile_source(TOY.replace("DERIVED", ""), str(tmp_path / "toy.xspec"))
    module, config = module_and_config(spec)
    assert "first" in {f for f in config.__dataclass_fields__}
    torch.manual_seed(0)
    wanted = xspec.compile_source(TOY.replace("DERIVED", ""), str(tmp_path / "toy.xspec"),
                                  overrides={"first": True}).build(device="cpu").eval()
    built = module.Model(config(first=True)).eval()
    built.load_state_dict(wanted.state_dict())
    tokens = torch.randint(0, 64, (2, 5))
    torch.testing.assert_close(built(tokens), wanted(tokens))
    assert set(dict(built.named_parameters())) == set(dict(wanted.named_parameters()))


def test_a_class_two_flags_change_keeps_the_first_choice_and_the_second_is_decided(tmp_path):
    source = xspec.compile_source(TOY.replace("DERIVED", ""), str(tmp_path / "toy.xspec")).python_source
    assert "if self.first:  # toy.xspec:9" in source and "return F.tanh(x)  # toy.xspec:10" in source
    assert "second" not in source


def test_a_flag_another_parameter_reads_is_decided(tmp_path):
    """The other build would keep `not_first` at the spec's value where --set first=true changes it."""
    spec = xspec.compile_source(TOY.replace("DERIVED", "param not_first = not first"), str(tmp_path / "toy.xspec"))
    assert "first" not in spec.python_source


def test_a_constructor_chooses_by_a_flag_in_one_if_where_modules_alone_stand_between():
    """T5's gated feed-forward: `wi_0` and `wi_1` under one `if`, the activation built either way after it."""
    source = xspec.compile("specs/modern/t5.xspec").python_source
    start = source.index("class FeedForward(")
    init = source[start:source.index("    def forward(", start)]
    assert init.count("if config.is_gated_act:") == 1
    assert ("        if config.is_gated_act:  # t5.xspec:28\n"
            "            self.wi_0 = nn.Linear(config.d_model, config.d_ff, bias=False)  # t5.xspec:29\n"
            "            self.wi_1 = nn.Linear(config.d_model, config.d_ff, bias=False)  # t5.xspec:30\n"
            "        else:\n"
            "            self.wi = nn.Linear(config.d_model, config.d_ff, bias=False)  # t5.xspec:32\n"
            "        self.act = Activation(config.dense_act_fn)  # t5.xspec:32\n") in init


@pytest.mark.parametrize("path, field", [("specs/modern/t5.xspec", "is_gated_act"),
                                         ("specs/modern/t5.xspec", "scale_decoder_outputs"),
                                         ("specs/modern/marian.xspec", "scale_embedding")])
def test_the_families_flags_are_config_fields(path, field):
    _, config = module_and_config(xspec.compile(path))
    assert field in config.__dataclass_fields__


def test_a_flag_a_ties_condition_reads_is_decided(tmp_path):
    """Ties whose condition reads a parameter a block's `if` reads are written as the spec's values decide
    (compiler/tie_choice.py): a field for the flag would change the classes and not the ties."""
    tie = "if first { tie decoder.embed_tokens.weight, decoder.lm_head.weight }"
    source = xspec.compile_source(TOY.replace("DERIVED", tie), str(tmp_path / "toy.xspec")).python_source
    assert "first" not in source


@pytest.mark.parametrize("path", ["specs/modern/qwen2.xspec", "specs/modern/gemma3.xspec",
                                  "specs/modern/qwen3_moe.xspec"])
def test_a_flag_of_a_block_the_model_does_not_use_is_no_field(path):
    """These specs extend lm.xspec, whose base's embed block chooses by `positions`; they replace it. Its other
    build differed only where the bound on builds left a layer's untaken branch unwritten: that difference was
    once merged under `if config.positions == 'learned':` with a refusal in it."""
    source = xspec.compile(path).python_source
    assert "positions" not in source and "raise ValueError" not in source
