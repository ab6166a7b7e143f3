"""The raw material of hostile specs: extreme numbers, names that generated code or PyTorch reserve,
strings that would break out of a literal, and characters a lexer may not expect."""

from __future__ import annotations

from .oracle import CANARY

# Numbers as spec text: zero, signs, the int64 boundary and beyond, float extremes and overflow.
EXTREME_NUMBERS = (
    "0", "1", "-1", "00", "007", "1_000", "3", "-0", "0.0", "-0.0", "0.5", "1.0", "2",
    "9223372036854775807", "9223372036854775808", "-9223372036854775807", "2**63", "2**63 - 1", "-2**63",
    "10**18", "10**19", "2**62 * 2", "2**-1", "(-8) ** 0.5", "0 ** -1", "1e308", "-1e308", "1e999", "1e-320",
    "5e-324", "1e308 * 10", "1 / 3", "7 // 2", "-7 % 3", "1 / 0", "1 % 0", "1.5e+300", "99999999999999999999",
    "000000000000000000000000000001", "sqrt(2)", "exp(710)", "log(0)", "int(1e300)", "round(2.5)",
    "min(3, 2)", "max()", "abs(-4)", "float(7)", "10 ** 10 ** 10", "true", "false", "[1, 2]", "[]",
)

# Names that generated Python or torch.nn.Module reserve, keywords, and near-misses of real names.
RESERVED_NAMES = (
    "training", "forward", "class", "None", "F", "__x", "self", "cache", "layer", "_", "__init__", "lambda",
    "import", "def", "return", "True", "torch", "nn", "math", "super", "range", "Model", "eval", "to",
    "state_dict", "parameters", "_private", "__class__", "DecoderCache", "Embedding", "Attention",
    "src_tokens", "tgt_tokens", "memory", "logits", "x", "h", "global", "print", "exec", "eval", "type",
)

MISSPELLED_NAMES = ("atention", "lienar", "layer_nrom", "dropuot", "embeding", "relu_", "Linear", "GELU",
                    "sinusoidal_position", "learned_positons", "encdoer", "decodr", "sublyer", "feed_foward")

OPS = ("embedding", "sinusoidal_positions", "learned_positions", "attention", "linear", "layer_norm",
       "rms_norm", "dropout", "relu", "gelu", "silu", "sigmoid", "tanh", "gelu_tanh", "softcap", "moe")
MATH_FUNCTIONS = ("sqrt", "exp", "log", "min", "max", "abs", "int", "float", "round")
# Internal op names that a spec may not call, but may name a block or a value after.
INTERNAL_OPS = ("add", "sub", "mul", "scale", "input", "output")

# Spec string literals (as written, quotes included) that are valid strings: quotes and backslashes
# meant to end a Python literal or docstring, and code that sets CANARY if anything ever executes it.
HOSTILE_STRINGS = (
    '""', '"learned"', '"sinusoidal"', '"a\\"b"', '"\\\\"', '"\\\\\\""', '"#"', '"}"', '"%s%s%s"', '"é𝔁"',
    '"\\"\\"\\"; import os; os.system(\\"true\\") #"',
    f'"\\"\\"\\"); __import__(\\"builtins\\").{CANARY} = 1; (\\"\\"\\""',
    f"\"'''); __import__('builtins').{CANARY} = 1; ('''\"",
    f'"{{__import__(\\"builtins\\").{CANARY}}}"', '"\\\\n\\\\x00"', '"' + "y" * 4096 + '"',
)
# String literals the language refuses: escapes it does not know, control and invisible characters,
# strings beyond the length limit, and literals that never end.
INVALID_STRINGS = (
    '"\\n"', '"\\t"', '"\\x00"', '"\\u0041"', '"tab\there"', '"\u202e"', '"\u2028"', '"nul\x00"',
    '"' + "x" * 4097 + '"', '"\\', '"unterminated',
)

# Characters to insert anywhere: quotes, escapes, NUL and other controls, line breaks a parser may or
# may not count, unicode that is printable, invisible or reverses text, and the language's punctuation.
HOSTILE_CHARACTERS = (
    '"', "\\", "\x00", "\n", "\r", "\r\n", "\t", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\u2028", "\u2029",
    "\ufeff", "\u202e", "é", "𝔁", "\U0010ffff", "#", "{", "}", "(", ")", "[", "]", ",", ";", ".", "=", "=>",
    "**", "/", "//", "%", "-", "+", "*", "<", "==", "as", " as ", "$", "@", "`", "'", "'''", '"""',
)

# Python that sets CANARY: as an override's text, or anywhere a stage might hand text to Python.
CANARY_CODE = f"__import__('builtins').{CANARY} = 1"

# File names a spec may have: quotes that would end a docstring, line breaks, spaces, unicode, a drive.
FILE_NAMES = ("fuzz.xspec", 'a"""b.xspec', "dir with space/x.xspec", "x\ny.xspec", "é𝔁.xspec", "<spec>",
              "C:\\x.xspec", "'''.xspec", "tab\there.xspec", "a\\\"\"\"\\.xspec")
