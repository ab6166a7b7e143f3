"""What generated code reads, from its syntax tree: text that only looks like a read (in a string, a
comment, a longer name) is not one."""

from xspec.compiler.code_reads import attributes_read, config_argument, names_used


def test_names_are_the_bare_names_read():
    code = "norm = RMSNorm(4)  # Embedding\nother = nn.RMSNorm(4)\nlabel = 'SwiGLU'\nx = MyRMSNormal"
    assert names_used(code) == {"RMSNorm", "nn", "MyRMSNormal"}


def test_several_parts_read_what_each_reads():
    assert names_used("a = X", "b = Y(c)") == {"X", "Y", "c"}
    assert attributes_read("a = config.d_ff", "b = config.heads + config.d_ff", owner="config") == ["d_ff", "heads"]


def test_attributes_are_those_of_the_name_in_order_once():
    code = "a = config.d_ff + math.sqrt(config.d_model)\nb = self.config.vocab + config.d_ff\nc = 'config.heads'"
    assert attributes_read(code, owner="config") == ["d_ff", "d_model"]
    assert attributes_read(code, owner="math") == ["sqrt"]
    assert attributes_read("x = mathematics.pi", owner="math") == []


def test_a_holder_is_named_after_the_one_parameter_it_reads():
    assert config_argument("nn.Dropout(config.dropout)") == "dropout"
    assert config_argument("nn.Dropout(0.1)") is None
    assert config_argument("nn.Dropout(config.dropout, inplace=True)") is None
    assert config_argument("nn.Dropout(self.config.dropout)") is None
