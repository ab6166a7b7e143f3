"""`xspec import` of a ~0.5B-parameter checkpoint against transformers' own from_pretrained of it.

    python bench/import_hf.py [--dir /tmp/xspec-bench-hf] [--dtype bfloat16] [--runs 2]

transformers writes a random checkpoint of Qwen2-0.5B's shape (24 layers, hidden 896, 14 heads over 2
key/value heads, vocabulary 151,936: 494M parameters) once into --dir. Then, each in a fresh process and
--runs times: `xspec import --no-verify` (reading the weights once, writing xspec's layout), the same
import with its verification against transformers, and `Qwen2ForCausalLM.from_pretrained` of the same
directory. It reports each one's wall time (median) and peak resident memory over the weights' size on
disk. It prints figures and checks nothing (transformers is needed).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                 tie_word_embeddings=True, use_sliding_window=False, bos_token_id=151643, eos_token_id=151643)

# Each measured step, run by a fresh interpreter; it prints its own peak resident memory (KiB: VmHWM,
# which starts anew at exec, unlike getrusage's maxrss, which keeps the forking parent's).
PEAK = "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0])"
IMPORT = """
import sys
from pathlib import Path
from xspec.hf.importer import import_checkpoint
import_checkpoint(Path(sys.argv[1]), Path(sys.argv[2]), force=True, verify=sys.argv[3] == "verify", say=lambda _: None)
""" + PEAK
FROM_PRETRAINED = """
import sys, torch, transformers
transformers.utils.logging.disable_progress_bar()
model = transformers.Qwen2ForCausalLM.from_pretrained(sys.argv[1], dtype="auto")
""" + PEAK
BASELINE = """
import torch, transformers, xspec.hf.importer
""" + PEAK


WRITE = """
import sys, torch, transformers
torch.manual_seed(0)
model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**eval(sys.argv[3])))
model.to(getattr(torch, sys.argv[2])).save_pretrained(sys.argv[1])
"""


def write_checkpoint(directory: Path, dtype: str) -> None:
    """In a process of its own, so that this one stays small."""
    if (directory / "config.json").exists():
        return
    print(f"writing a random Qwen2-0.5B-shaped checkpoint ({dtype}) to {directory} ...", flush=True)
    subprocess.run([sys.executable, "-c", WRITE, str(directory), dtype, repr(QWEN2_05B)], check=True,
                   capture_output=True)


def timed(code: str, *args: str) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return time.perf_counter() - start, int(done.stdout.split()[-1]) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/xspec-bench-hf"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    source, out = args.dir / "checkpoint", args.dir / "imported"
    write_checkpoint(source, args.dtype)
    weights = sum(p.stat().st_size for p in source.glob("*.safetensors"))
    _, baseline = timed(BASELINE)
    print(f"weights on disk: {weights / 2**30:.2f} GiB; a Python process with torch and transformers: "
          f"{baseline / 2**30:.2f} GiB resident")
    steps = {"xspec import --no-verify": (IMPORT, str(source), str(out), "no"),
             "transformers from_pretrained": (FROM_PRETRAINED, str(source)),
             "xspec import (verified)": (IMPORT, str(source), str(out), "verify")}
    for name, (code, *step_args) in steps.items():
        runs = [timed(code, *step_args) for _ in range(args.runs)]
        wall = statistics.median(t for t, _ in runs)
        peak = max(m for _, m in runs)
        print(f"{name:<30} {wall:7.1f} s   peak resident {peak / 2**30:5.2f} GiB = {peak / weights:4.2f} x the "
              f"weights ({(peak - baseline) / weights:4.2f} x beyond the bare process)", flush=True)
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
