"""Decoding speed of xspec against Hugging Face `MarianMTModel.generate` (or, `--family t5`,
`T5ForConditionalGeneration.generate`), side by side in one process.

Same architecture and sizes, random weights; the candidates alternate round by round (speeds on a shared
2-core machine drift, so only ratios taken side by side mean anything). Needs `transformers` (the test
extra). Run under tcmalloc:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python bench/decode.py [--size tiny|small] [--compile]
        [--imported]

`--imported`: xspec decodes the Marian checkpoint itself, imported (`xspec import`, its logits proven), with
the import's beam scoring (transformers'): the same weights on both sides. `--family t5`: a T5 of the same
sizes (ReLU, relative position buckets), imported likewise (it implies --imported).

- beam: beam 4, alpha 0.6, 64 sentences of 24 tokens, exactly 74 steps (EOS banned on both sides);
  sentences per second.
- greedy: one sentence of 24 tokens, 74 steps; milliseconds per token.
- long: greedy, input 24 -> 300 new tokens, one sentence; milliseconds per step over steps 50-100 and
  over the last 50 (flat in T is the goal).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import xspec
from speed import SIZES, NoEos
from xspec.runtime.beam_search import Scoring, beam_search
from xspec.runtime.vocab import BOS, EOS, PAD
from xspec.runtime.weight_formats import store_weights

VOCAB, SENTENCES, SOURCE_LEN, STEPS, LONG = 8000, 64, 24, 74, 300


def build_xspec(size: str, compiled: bool = False):
    d_model, layers, heads, d_ff = SIZES[size]
    spec = xspec.compile("specs/tiny.xspec", overrides={
        "vocab": VOCAB, "d_model": d_model, "layers": layers, "heads": heads, "d_ff": d_ff, "max_len": 512})
    model = spec.build("cpu").eval()
    store_weights(model, "fp32", torch.device("cpu"))   # as `xspec translate` loads a model to decode
    if compiled:  # as `xspec translate --compile on` does
        model.decode = torch.compile(model.decode, dynamic=True)
    return model


def build_marian(size: str):
    from transformers import MarianConfig, MarianMTModel

    d_model, layers, heads, d_ff = SIZES[size]
    config = MarianConfig(vocab_size=VOCAB, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                          encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=d_ff,
                          decoder_ffn_dim=d_ff, max_position_embeddings=512, pad_token_id=PAD, eos_token_id=EOS,
                          decoder_start_token_id=BOS, forced_eos_token_id=None, dropout=0.0)
    return MarianMTModel(config).eval()


def build_t5(size: str):
    from transformers import T5Config, T5ForConditionalGeneration

    d_model, layers, heads, d_ff = SIZES[size]
    config = T5Config(vocab_size=VOCAB, d_model=d_model, d_kv=d_model // heads, d_ff=d_ff, num_layers=layers,
                      num_heads=heads, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=BOS, dropout_rate=0.0)
    return T5ForConditionalGeneration(config).eval()


def build_imported(reference, folder: Path):
    """`reference` (transformers') saved as a checkpoint and imported: xspec's model of the same weights."""
    from xspec.hf.importer import import_checkpoint

    reference.save_pretrained(folder / "checkpoint")
    import_checkpoint(folder / "checkpoint", folder / "run", say=lambda line: None)
    return xspec.load(folder / "run", device="cpu", weights="fp32").model


def xspec_decode(model, src: torch.Tensor, beam: int, steps: int, alpha: float | Scoring = 0.6) -> None:
    beam_search(NoEos(model), src, torch.zeros_like(src, dtype=torch.bool), beam=beam, alpha=alpha,
                max_len_a=0, max_len_b=steps)


def imported_decode(model, src: torch.Tensor, beam: int, steps: int) -> None:
    xspec_decode(model, src, beam, steps, Scoring(0.6, "transformers"))


def generate_decode(model, src: torch.Tensor, beam: int, steps: int) -> None:
    # min_new_tokens bans EOS until the last step, as NoEos does.
    model.generate(input_ids=src, attention_mask=torch.ones_like(src), num_beams=beam, length_penalty=0.6,
                   max_new_tokens=steps, min_new_tokens=steps, do_sample=False)


@torch.no_grad()
def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def per_step_ms(decode, model, src: torch.Tensor) -> tuple[float, float]:
    """Greedy decoding of LONG tokens: ms per step over steps 50-100 and over the last 50 (differences of
    runs, so encoding and set-up cancel)."""
    early = timed(decode, model, src, 1, 100) - timed(decode, model, src, 1, 50)
    full = timed(decode, model, src, 1, LONG)
    late = full - timed(decode, model, src, 1, LONG - 50)
    return 1000 * early / 50, 1000 * late / 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="xspec's decoder through torch.compile")
    parser.add_argument("--imported", action="store_true", help="xspec decodes the Marian checkpoint, imported")
    parser.add_argument("--family", choices=("marian", "t5"), default="marian",
                        help="the transformers model compared (t5: imported, as --imported)")
    args = parser.parse_args()
    args.imported = args.imported or args.family == "t5"
    torch.manual_seed(0)
    reference = build_marian(args.size) if args.family == "marian" else build_t5(args.size)
    folder = Path(tempfile.mkdtemp(prefix="xspec-bench-"))
    ours = (build_imported(reference, folder), imported_decode) if args.imported else \
        (build_xspec(args.size, args.compile), xspec_decode)
    theirs = args.family       # transformers' model, by its family's name
    candidates = {"xspec": ours, theirs: (reference, generate_decode)}
    batch = torch.randint(4, VOCAB, (SENTENCES, SOURCE_LEN))
    batch[:, -1] = EOS
    one = batch[:1]
    figures: dict[str, dict[str, list[float]]] = {name: {"beam": [], "greedy": []} for name in candidates}
    for name, (model, decode) in candidates.items():  # warm-up (and, compiled, compiling)
        timed(decode, model, batch[:4], 4, 4)
        timed(decode, model, one, 1, 4)
    for _ in range(args.rounds):
        for name, (model, decode) in candidates.items():
            figures[name]["beam"].append(SENTENCES / timed(decode, model, batch, 4, STEPS))
            figures[name]["greedy"].append(1000 * timed(decode, model, one, 1, STEPS) / STEPS)
    compiled = (", xspec compiled" if args.compile else "") + (", imported" if args.imported else "")
    print(f"size {args.size}{compiled}: beam 4, {SENTENCES} sentences x {SOURCE_LEN} tokens, {STEPS} steps; "
          f"median of {args.rounds} rounds, threads {torch.get_num_threads()}")
    for name in candidates:
        print(f"  {name:7s} beam {statistics.median(figures[name]['beam']):7.2f} sentences/s   "
              f"greedy {statistics.median(figures[name]['greedy']):6.2f} ms/token")
    beam_ratio = statistics.median(figures["xspec"]["beam"]) / statistics.median(figures[theirs]["beam"])
    greedy_ratio = statistics.median(figures[theirs]["greedy"]) / statistics.median(figures["xspec"]["greedy"])
    print(f"  xspec / {theirs}: beam {beam_ratio:.2f}x sentences/s, greedy {greedy_ratio:.2f}x tokens/s")
    for name, (model, decode) in candidates.items():
        early, late = per_step_ms(decode, model, one)
        print(f"  {name:7s} long output ({LONG} tokens): {early:.2f} ms/step over steps 50-100, "
              f"{late:.2f} over the last 50")


if __name__ == "__main__":
    main()
