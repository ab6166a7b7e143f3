"""Greedy decoding of an imported Llama: xspec's runtime against transformers' `generate`, in one process.

    python bench/decode_lm.py [--size 30m|120m] [--prompts 4] [--rounds 3] [--compile]

transformers writes a random Llama checkpoint (30m: hidden 512, 8 layers, 8 heads over 4 key/value heads,
vocabulary 8000, 31.8M parameters; 120m: hidden 768, 12 layers, 12 over 4, vocabulary 32000) with a
word-level tokenizer; `xspec import` reads it. Then, alternating round by round: transformers'
`generate` (greedy, float32) and xspec's greedy decoding with its cache (runtime/sampling.py) in float32
(also without runtime/weight_formats.py's packed weights: their A/B), under bf16 autocast (decode.precision =
"bf16"), and with its linear layers' weights kept in bf16 (also unpacked) and in int8 (decode.weights).
Each decodes 4 prompts (--prompts) of 32 tokens for 64 new ones (no end token). It prints ms per decoded
position, medians, and each variant's logits against float32's (max |Δ|, KL and argmax agreement on the
prompts). --compile adds the three weight formats with the decoder's step through torch.compile (about two
minutes of compiling each, not counted). It checks nothing (transformers is needed).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import xspec
from xspec.runtime.precision import Precision, choose_precision
from xspec.runtime.sampling import sample
from xspec.runtime.vocab import EOS
from xspec.runtime.weight_formats import Bf16Linear, Float32Linear

SIZES = {
    "30m": dict(vocab_size=8000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=4),
    "120m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=4),
}
PROMPT_LEN, NEW = 32, 64


def write_checkpoint(directory: Path, size: str) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SIZES[size], max_position_embeddings=512, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(directory)
    words = {f"w{i}": i for i in range(config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="30m")
    parser.add_argument("--prompts", type=int, default=4, help="prompts decoded together (rows of a step)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd steps")
    args = parser.parse_args()
    from transformers import LlamaForCausalLM

    with tempfile.TemporaryDirectory() as temporary:
        source, run = Path(temporary) / "hf", Path(temporary) / "run"
        write_checkpoint(source, args.size)
        subprocess.run([sys.executable, "-m", "xspec", "import", str(source), "-o", str(run), "--no-verify"],
                       check=True, stdout=subprocess.DEVNULL)
        hf = LlamaForCausalLM.from_pretrained(source).eval()
        loaded = xspec.load(run, device="cpu", weights="fp32")
        ours, head = loaded.members.eval(), loaded.output_head   # `xspec generate` names the output head
        stored = {name: xspec.load(run, device="cpu", weights=name).members.eval() for name in ("bf16", "int8")}
        unpacked = {name: xspec.load(run, device="cpu", weights=name).members.eval() for name in ("fp32", "bf16")}
    for model in unpacked.values():     # the A/B of the packed weights
        for layer in model.modules():
            if isinstance(layer, (Float32Linear, Bf16Linear)):
                layer.packed = None
    torch.manual_seed(1)
    prompts = torch.randint(4, SIZES[args.size]["vocab_size"], (args.prompts, PROMPT_LEN))
    prompts[:, 0] = EOS  # xspec's prompts start at the end token, as its documents do
    # decode.precision = "bf16" as the runtime takes it (on some CPUs, attention in float32)
    fp32, bf16 = Precision("cpu", None), choose_precision(torch.device("cpu"), "bf16", "decode.precision")

    def ours_in(model, precision: Precision):
        def run_once() -> None:
            with torch.no_grad(), precision.context():
                sample(model, prompts, NEW, None, end_token=-1, never=(), vocab_size=None, output_head=head)
        return run_once

    def theirs() -> None:
        with torch.no_grad():
            hf.generate(prompts, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, eos_token_id=None,
                        pad_token_id=0)

    candidates = {"transformers generate (fp32)": theirs, "xspec (fp32)": ours_in(ours, fp32),
                  "xspec (fp32, not packed)": ours_in(unpacked["fp32"], fp32),
                  "xspec (bf16 autocast)": ours_in(ours, bf16), "xspec (bf16 weights)": ours_in(stored["bf16"], fp32),
                  "xspec (bf16 weights, not packed)": ours_in(unpacked["bf16"], fp32),
                  "xspec (int8 weights)": ours_in(stored["int8"], fp32)}
    if args.compile:
        # The models share their classes' code, whose compiled versions torch counts together.
        torch._dynamo.config.recompile_limit = 64
        for name, model in (("fp32", ours), ("bf16 weights", stored["bf16"]), ("int8 weights", stored["int8"])):
            compiled = copy.deepcopy(model)
            compiled.decode = torch.compile(compiled.decode, dynamic=True)
            candidates[f"xspec ({name}, compiled)"] = ours_in(compiled, fp32)
    for run_once in candidates.values():  # warm-up
        run_once()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(args.rounds):
        for name, run_once in candidates.items():
            start = time.perf_counter()
            run_once()
            times[name].append((time.perf_counter() - start) * 1000 / NEW)
    theirs = times["transformers generate (fp32)"]
    print(f"{args.size}: greedy decoding, {args.prompts} prompts x {PROMPT_LEN} tokens + {NEW} new, "
          f"{torch.get_num_threads()} threads; ms per position (median of {args.rounds}), speed against transformers "
          "(the median of the rounds' ratios, each round's two runs side by side)")
    for name, values in times.items():
        ratios = [reference / value for reference, value in zip(theirs, values)]
        print(f"  {name:30s} {statistics.median(values):7.2f} ms   {statistics.median(ratios):5.2f}x   rounds: "
              f"{', '.join(f'{v:.2f}' for v in values)}")
    with torch.no_grad():
        exact = ours.decode(prompts).float()
        for name, logits in (("bf16 autocast", _autocast_logits(ours, prompts)),
                             ("bf16 weights", stored["bf16"].decode(prompts).float()),
                             ("int8 weights", stored["int8"].decode(prompts).float())):
            delta = (logits - exact).abs().max().item()
            kl = torch.nn.functional.kl_div(logits.log_softmax(-1), exact.log_softmax(-1), log_target=True,
                                            reduction="batchmean").item() / PROMPT_LEN
            agree = (logits.argmax(-1) == exact.argmax(-1)).float().mean().item()
            print(f"  logits, {name} against fp32: max |Δ| {delta:.3f}, KL {kl:.2e} nats per position, "
                  f"argmax the same at {agree:.1%} of positions")


def _autocast_logits(model: torch.nn.Module, prompts: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model.decode(prompts).float()


if __name__ == "__main__":
    main()
