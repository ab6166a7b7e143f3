"""The memory plan's estimate against the measured peak of real training passes.

    python bench/memory.py [--specs tiny base big lm] [--sizes 16x64 32x128] [--device cpu|cuda]
                           [--variant plain|checkpointing|lora]

For each spec and each size (sentences x tokens, source and target of that length), a fresh process
builds the model with its loss and Adam (as `xspec train` does), runs two updates on random tokens
(the second one runs with Adam's moments already allocated) and reports its peak: on a CPU the growth
of the process's peak resident memory (VmHWM) over what it held before building the model; on a GPU
`torch.cuda.max_memory_allocated`. Beside it, the estimate `xspec train` plans with
(runtime/memory_plan.estimate_peak: the spec's `training_memory` at that size, plus the CPU runtime's
allowance). The target: the estimate no more than 10% below the measured peak, nor more than 50% above.
`--variant checkpointing` runs the layers with train.activation_checkpointing, `--variant lora` trains
rank-8 adapters of the attention and feed-forward projections alone (the frozen base in float32), each
against the estimate for it. It prints figures and checks nothing; docs/runtime.md has a table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = {"tiny": "specs/tiny.xspec", "base": "specs/base.xspec", "big": "specs/big.xspec", "lm": "specs/lm.xspec",
         **{name: f"specs/modern/{name}.xspec" for name in (
             "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "olmo2", "phi3", "mixtral", "qwen3_moe",
             "gpt_oss")}}


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(spec_path: str, sentences: int, length: int, device: str, variant: str = "plain") -> dict:
    """One configuration, in this process (run by `main` in a child process of its own)."""
    import torch

    import xspec
    from xspec.runtime.activation_checkpoint import checkpoint_layers
    from xspec.runtime.lora import apply_lora, lora_footprint
    from xspec.runtime.memory_plan import Layout, estimate_peak
    from xspec.runtime.schedule import make_optimizer
    from xspec.runtime.step import TrainingStep

    spec = xspec.compile(str(ROOT / spec_path), overrides={"train.lora_rank": 8} if variant == "lora" else None)
    generator = torch.Generator().manual_seed(0)

    def tokens() -> torch.Tensor:
        return torch.randint(4, spec.vocab_size, (sentences, length), generator=generator).to(device)

    labels = tokens()
    inputs = (tokens(), tokens(), torch.zeros(sentences, length, dtype=torch.bool, device=device)) \
        if spec.has_encoder else (tokens(),)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")     # resets VmHWM to the current resident size
        before = _status_bytes("VmRSS")
    model = spec.build(device=device)
    trained, weight_bytes = None, None
    if variant == "checkpointing":
        checkpoint_layers(model, spec)
    elif variant == "lora":
        trained, weight_bytes = lora_footprint(spec)
        apply_lora(model, spec, 8, 16.0, 0.0, spec.train.lora_targets)
    step = TrainingStep(model, spec.train.label_smoothing)
    optimizer = make_optimizer([p for p in step.parameters() if p.requires_grad], spec.train)
    started = time.perf_counter()
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        step(labels, *inputs).backward()
        optimizer.step()
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = _status_bytes("VmHWM") - before
    layout = Layout("cuda" if cuda else "cpu", 4, 1, 1, trained, weight_bytes, variant == "checkpointing")
    return {"spec": Path(spec_path).stem, "variant": variant, "parameters": spec.parameters, "sentences": sentences,
            "length": length,
            "estimate": estimate_peak(spec, sentences, length, layout), "measured": peak,
            "seconds_per_update": round((time.perf_counter() - started) / 2, 2), "device": device}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", nargs="+", default=["tiny", "base", "big", "lm"], choices=list(SPECS),
                        help="tiny base big lm by default; the 2024-25 family's small specs by name")
    parser.add_argument("--sizes", nargs="+", default=["16x64", "32x128"], metavar="SENTENCESxTOKENS")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variant", choices=["plain", "checkpointing", "lora"], default="plain")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON lines")
    parser.add_argument("--child", nargs=3, metavar=("SPEC", "SENTENCES", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec, sentences, length = args.child
        print(json.dumps(measure(spec, int(sentences), int(length), args.device, args.variant)))
        return
    rows = []
    print(f"{'spec':<6} {'parameters':>12} {'batch':>8} {'estimate':>10} {'measured':>10} {'est/meas':>8}  "
          f"{'s/update':>8}  within -10%/+50%")
    for name in args.specs:
        for size in args.sizes:
            sentences, length = (int(x) for x in size.split("x"))
            child = subprocess.run([sys.executable, __file__, "--device", args.device, "--variant", args.variant,
                                    "--child", SPECS[name], str(sentences), str(length)],
                                   capture_output=True, text=True, cwd=ROOT)
            if child.returncode != 0:
                print(f"{name:<6} {size:>21}  failed: {child.stderr.strip().splitlines()[-1:]}")
                continue
            row = json.loads(child.stdout.strip().splitlines()[-1])
            rows.append(row)
            ratio = row["estimate"] / row["measured"]
            print(f"{name:<6} {row['parameters']:>12,} {size:>8} {row['estimate'] / 2**30:>8.2f}Gi "
                  f"{row['measured'] / 2**30:>8.2f}Gi {ratio:>8.2f}  {row['seconds_per_update']:>8}  "
                  f"{'yes' if 0.9 <= ratio <= 1.5 else 'NO'}", flush=True)
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
