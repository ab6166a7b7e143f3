"""What generated code reads, from its syntax tree: text that only looks like a read (in a string, a
comment, a longer name) is not one."""

import ast

from xspec.compiler.code_reads import attributes_read, config_argument, names_used


def _tree(code: str) -> ast.Module:
    return ast.parse(code)


def _call(code: str) -> ast.expr:
    return ast.parse(code, mode="eval").body


def test_names_are_the_bare_names_read():
    code = "norm = RMSNorm(4)  # Embedding\nother = nn.RMSNorm(4)\nlabel = 'SwiGLU'\nx = MyRMSNormal"
    assert names_used(_tree(code)) == {"RMSNorm", "nn", "MyRMSNormal"}


def test_several_parts_read_what_each_reads():
    assert names_used(_tree("a = X"), _tree("b = Y(c)")) == {"X", "Y", "c"}
    reads = attributes_read(_tree("a = config.d_ff"), _tree("b = config.heads + config.d_ff"), owner="config")
    assert reads == ["d_ff", "heads"]


def test_attributes_are_those_of_the_name_in_order_once():
    code = "a = config.d_ff + math.sqrt(config.d_model)\nb = self.config.vocab + config.d_ff\nc = 'config.heads'"
    assert attributes_read(_tree(code), owner="config") == ["d_ff", "d_model"]
    assert attributes_read(_tree(code), owner="math") == ["sqrt"]
    assert attributes_read(_tree("x = mathematics.pi"), owner="math") == []


def test_a_holder_is_named_after_the_one_parameter_it_reads():
    assert config_argument(_call("nn.Dropout(config.dropout)")) == "dropout"
    assert config_argument(_call("nn.Dropout(0.1)")) is None
    assert config_argument(_call("nn.Dropout(config.dropout, inplace=True)")) is None
    assert config_argument(_call("nn.Dropout(self.config.dropout)")) is None
