"""What each way of computing attention's scores costs (docs/language.md, "Which path computes the
scores"): the module's own (SDPA with a boolean mask for a window alone; the scores written out for soft
caps and sinks), the scores written out for a window alone too, and the runtime's FlexAttention run
eagerly and compiled, for a sliding window alone and for a window with soft-capping and sinks.

    python bench/attention_paths.py                 # this machine's device; --device cuda on a GPU
    python bench/attention_paths.py --lengths 1024 4096 --window 256

Prints milliseconds per forward (without gradients) and per forward + backward (median of --repeat runs
after two warm-up calls), per path and length; the first call's seconds include FlexAttention's
compilation. FlexAttention has no backward on CPUs: those entries say "failed".
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from xspec.compiler.op_attention import AttentionAttrs
from xspec.nn import Attention, RotaryEmbedding, WrittenOutAttention
from xspec.runtime.attention_kernels import run_through_flex

VARIANTS = {"window": {}, "window + soft cap": {"softcap": 50.0}, "window + soft cap + sinks": {"softcap": 50.0,
                                                                                              "sinks": True}}


def attention(path: str, window: int, options: dict, d_model: int, heads: int, kv_heads: int,
              device: str) -> torch.nn.Module:
    """The attention a spec with these options gets (its parts), run by `path`."""
    torch.manual_seed(0)
    d_k = d_model // heads
    softcap, sinks = options.get("softcap"), options.get("sinks", False)
    # "plain" with a window alone: its scores written out too
    written_out = softcap is not None or sinks or path == "plain"
    module = Attention(d_model, heads, kv_heads, d_k, d_k, bias=False, out_bias=False, causal=True,
                       rotary=RotaryEmbedding(d_k, 10000.0), window=window, sinks=sinks,
                       inner_attention=WrittenOutAttention(softcap=softcap) if written_out else None).to(device)
    if path.startswith("flex"):
        attrs = AttentionAttrs(heads=heads, d_k=d_k, d_v=d_k, kv_heads=kv_heads, causal=True, window=window,
                               softcap=options.get("softcap"), sinks=options.get("sinks", False), rotary=True)
        run_through_flex(module, attrs, compiled=path == "flex compiled")
    return module


def peak_mib(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(module: torch.nn.Module, x: torch.Tensor, repeat: int, backward: bool) -> tuple[float, float]:
    """(median ms per forward, and backward if asked; seconds the first call took)."""
    def run() -> float:
        started = time.perf_counter()
        if backward:
            module(x, x, x).sum().backward()
        else:
            with torch.no_grad():
                module(x, x, x)
        if x.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - started

    first = run()
    run()
    return statistics.median(run() for _ in range(repeat)) * 1000, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"device {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}, d_model "
          f"{args.d_model}, heads {args.heads} (kv {args.kv_heads}), window {args.window}, batch 1")
    for backward in (False, True):
        print(f"\nms per forward{' + backward' if backward else ' (no gradients)'}")
        print(f"{'scores':<26} {'path':<14} " + " ".join(f"{f'n={n}':>12}" for n in args.lengths) + "  first call")
        table(args, backward)
    print(f"\npeak memory of the process: {peak_mib(args.device):,.0f} MiB")


def table(args: argparse.Namespace, backward: bool) -> None:
    for label, options in VARIANTS.items():
        paths = ["own (SDPA)", "plain", "flex", "flex compiled"] if not options else ["own (plain)", "flex",
                                                                                      "flex compiled"]
        for path in paths:
            times, firsts = [], []
            for n in args.lengths:
                module = attention(path, args.window, options, args.d_model, args.heads, args.kv_heads, args.device)
                x = torch.randn(1, n, args.d_model, device=args.device, requires_grad=backward)
                try:
                    ms, first = measure(module, x, args.repeat, backward)
                    times.append(f"{ms:12.1f}")
                    firsts.append(f"{first:.1f} s")
                except Exception as error:  # a path this device cannot run: say so and go on
                    times.append(f"{'failed':>12}")
                    firsts.append(type(error).__name__)
            print(f"{label:<26} {path:<14} " + " ".join(times) + "  " + ", ".join(firsts))


if __name__ == "__main__":
    main()
