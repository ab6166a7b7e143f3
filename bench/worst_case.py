"""The costliest specs the compiler's bounds allow (compiler/limits.py): time and memory to compile each.

Every construct runs in a fresh process; the figures are the compile's wall and CPU time and the
process's peak resident memory (which includes Python and the compiler's imports, ~60 MB). The target
is that any spec compiles or fails in under 2 s and 1 GB.

    python bench/worst_case.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

DECODER = "  block decoder(tokens) { return linear(embedding(tokens, 10, 8) as embed, 10) as out }\n"


def dense_parameters() -> str:
    """A spec at the 64 KiB source limit, all parameters reading the previous ones."""
    lines, i = [], 0
    while sum(map(len, lines)) < 63 * 1024:
        lines.append(f"  param p{i} = {f'p{i - 1} + ' if i else ''}{i} * 2 - {i} // 3\n")
        i += 1
    return "model m {\n" + "".join(lines) + DECODER + "}\n"


def nested_expressions() -> str:
    """Expressions nested just inside the syntax depth limit, up to the token limit."""
    expression = "-(" * 55 + "1" + ")" * 55
    return "model m {\n" + "".join(f"  param p{i} = {expression}\n" for i in range(115)) + DECODER + "}\n"


def dense_tokens() -> str:
    """Tokens of one character each, up to the token limit: the parser's worst case per byte."""
    ones = ",".join(["1"] * 1000)
    return "model m {\n" + "".join(f"  param p{i} = [{ones}]\n" for i in range(9)) + DECODER + "}\n"


def exponential_blocks() -> str:
    """Each block calls the next twice: 2^30 modules without the expansion bound."""
    blocks = "".join(f"  block b{i}(x) {{ y = b{i + 1}(x)\n return b{i + 1}(y) }}\n" for i in range(30))
    return ("model m {\n" + blocks + "  block b30(x) { return relu(x) }\n"
            "  block decoder(tokens) { return linear(b0(embedding(tokens, 10, 8) as embed), 10) as out }\n}\n")


def constant_work_in_a_loop() -> str:
    """A long constant list evaluated in every layer of a repeat: bounded by evaluation steps."""
    items = ", ".join(["1"] * 1000)
    return ("model m {\n  block decoder(tokens) {\n    x = embedding(tokens, 10, 8) as embed\n"
            f"    repeat 10000 {{ x = relu(x)\n  unused = [{items}] }}\n"
            "    return linear(x, 10) as out\n  }\n}\n")


def many_layers() -> str:
    """The largest repeat, each layer one module and one op."""
    return ("model m {\n  block decoder(tokens) {\n    x = embedding(tokens, 10, 8) as embed\n"
            "    repeat 9000 { x = layer_norm(x) as norm }\n    return linear(x, 10) as out\n  }\n}\n")


def many_layers_tied() -> str:
    """The largest repeat with every layer tied to the first (`tie decoder.layers`): one line of
    generated code per tied tensor."""
    return many_layers().replace("\n}\n", "\n  tie decoder.layers\n}\n")


def everything_at_once() -> str:
    """The parser's worst case and the expansion's together: 19,000 tokens, then 9,000 layers."""
    ones = ",".join(["1"] * 1000)
    return ("model m {\n" + "".join(f"  param p{i} = [{ones}]\n" for i in range(9)) +
            "  block decoder(tokens) {\n    x = embedding(tokens, 10, 8) as embed\n"
            "    repeat 9000 { x = layer_norm(x) as norm }\n    return linear(x, 10) as out\n  }\n}\n")


def long_repeat_body() -> str:
    """A repeated body of 3,000 statements: every per-statement pass over it must stay linear."""
    body = "".join(f"      x{i} = x\n" for i in range(3000))
    return ("model m {\n  block decoder(tokens) {\n    x = embedding(tokens, 10, 8) as embed\n"
            f"    repeat 2 {{\n{body}      x = relu(x)\n    }}\n    return linear(x, 10) as out\n  }}\n}}\n")


def errors_among_many_names() -> str:
    """Misspelled names among 2,000 others: 50 errors with their hints, then the compiler stops."""
    known = "".join(f"  param n{i:04d} = {i}\n" for i in range(2000))
    wrong = "".join(f"  param w{i} = m{i:04d}\n" for i in range(1000))
    return "model m {\n" + known + wrong + DECODER + "}\n"


def call_chain() -> str:
    """Blocks nested as deep as the nesting bound allows."""
    chain = "".join(f"  block k{i}(x) {{ return k{i + 1}(x) }}\n" for i in range(95))
    return ("model m {\n" + chain + "  block k95(x) { return relu(x) }\n"
            "  block decoder(tokens) { return linear(k0(embedding(tokens, 10, 8) as embed), 10) as out }\n}\n")


CASES = {
    "base model (reference)": None,
    "64 KiB of chained parameters": dense_parameters,
    "20,000 tokens of nested expressions": nested_expressions,
    "20,000 one-character tokens": dense_tokens,
    "blocks doubling 30 times": exponential_blocks,
    "constant work in 10,000 layers": constant_work_in_a_loop,
    "9,000 layers": many_layers,
    "9,000 layers, all tied to the first": many_layers_tied,
    "19,000 tokens and 9,000 layers": everything_at_once,
    "a repeated body of 3,000 statements": long_repeat_body,
    "1,000 errors among 2,000 names": errors_among_many_names,
    "95 nested block calls": call_chain,
}

PROBE = """
import json, resource, sys, time
import xspec
path = sys.argv[1]
wall, cpu = time.perf_counter(), time.process_time()
try:
    xspec.compile(path)
    outcome = "compiled"
except xspec.SpecError as error:
    codes = sorted({d.code for d in error.diagnostics if d.severity == "error"})
    outcome = "diagnostic: " + ", ".join(codes)
print(json.dumps({"outcome": outcome, "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(path: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        return {"outcome": "CRASHED: " + result.stderr.strip().splitlines()[-1], "wall": 0, "cpu": 0, "rss_mb": 0}
    return json.loads(result.stdout)


def main() -> None:
    root = Path(__file__).resolve().parent.parent
    print(f"{'construct':38}  {'size':>8}  {'outcome':34}  {'wall s':>6}  {'cpu s':>6}  {'peak MB':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in CASES.items():
            path = root / "specs" / "base.xspec" if make is None else Path(tmp) / "case.xspec"
            if make is not None:
                path.write_text(make())
            figures = measure(path)
            print(f"{name:38}  {path.stat().st_size / 1024:6.1f}KB  {figures['outcome'][:34]:34}  "
                  f"{figures['wall']:6.2f}  {figures['cpu']:6.2f}  {figures['rss_mb']:7.0f}")


if __name__ == "__main__":
    main()
