"""Multi-head latent attention's decoding step: over the latent itself (queries through W^UK, W^UV after:
what `LatentAttention` runs with a cache) against making every cached position's keys and values from
the latent (what it runs in training), in one process, alternating round by round; and greedy ms per
decoded token of a DeepSeek-V3-shaped model against a grouped-query model of about the same parameters,
with the bytes each keeps per position.

    python bench/latent_decode.py [--rounds 5]

Shapes (DeepSeek-V2-Lite's attention at a quarter of its width): d_model 512, 16 heads, kv_lora_rank 128,
qk_nope_head_dim 32, qk_rope_head_dim 16, v_head_dim 32; a batch of 4, one new position per step, at
contexts of 256, 1024 and 4096 cached positions. The models: 4 layers, d_model 512, vocabulary 8000,
dense SwiGLU; deepseek_v3.xspec's attention against llama.xspec's with 8 heads over 2 key/value heads.
It checks that both steps give the same output and prints figures; it asserts nothing else.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import xspec
from xspec.nn import LatentAttention, RotaryEmbedding
from xspec.runtime.cache import DecoderCache
from xspec.stats import decoding_cache

HEADS, LATENT, NOPE, ROPE, V, D = 16, 128, 32, 16, 32, 512


def module() -> LatentAttention:
    torch.manual_seed(0)
    return LatentAttention(D, HEADS, LATENT, NOPE, ROPE, V, q_proj=torch.nn.Linear(D, HEADS * (NOPE + ROPE)),
                           rotary=RotaryEmbedding(ROPE, 10000.0), eps=1e-6, bias=False,
                           scale=(NOPE + ROPE) ** -0.5).eval()


def step_times(attention: LatentAttention, context: int, rounds: int) -> tuple[float, float, float]:
    """(ms over the latent, ms with keys and values made, max |difference|) of one decoding step."""
    x = torch.randn(4, 1, D)
    q = attention.q_proj(x).unflatten(-1, (HEADS, -1)).transpose(1, 2)
    q_nope, q_rope = q.split([NOPE, ROPE], dim=-1)
    latent, k_rope = torch.randn(4, 1, context, LATENT), torch.randn(4, 1, context, ROPE)

    def latent_path():
        return attention.attend_latent(q_nope, q_rope, latent, k_rope, None)

    def made_path():  # attention.attend's products, for one query that sees every cached key
        k, v = attention.keys_values(latent, k_rope)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=attention.scale)
    difference = (latent_path() - made_path()).abs().max().item()
    times: dict[str, list[float]] = {"latent": [], "made": []}
    for _ in range(rounds):
        for name, run in (("latent", latent_path), ("made", made_path)):
            start = time.perf_counter()
            for _ in range(20):
                run()
            times[name].append((time.perf_counter() - start) / 20 * 1000)
    return statistics.median(times["latent"]), statistics.median(times["made"]), difference


def greedy_ms(model: torch.nn.Module, prompt: torch.Tensor, new: int) -> float:
    cache = DecoderCache()
    logits = model.decode(prompt, cache=cache)
    start = time.perf_counter()
    for _ in range(new):
        logits = model.decode(logits[:, -1:].argmax(-1), cache=cache)
    return (time.perf_counter() - start) / new * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    attention = module()
    print(f"latent attention, one decoding step, batch 4 ({torch.get_num_threads()} threads; median of "
          f"{args.rounds} rounds of 20)")
    print(f"{'context':>8} {'over the latent':>16} {'keys made':>10} {'ratio':>6} {'max |diff|':>11}")
    for context in (256, 1024, 4096):
        latent, made, difference = step_times(attention, context, args.rounds)
        print(f"{context:>8} {latent:>13.3f} ms {made:>7.3f} ms {made / latent:>5.1f}x {difference:>11.1e}")

    sizes = {"vocab": 8000, "d_model": 512, "layers": 4, "d_ff": 1376}
    latent_spec = xspec.compile("specs/modern/deepseek_v3.xspec", overrides={
        **sizes, "heads": HEADS, "q_lora_rank": 0, "kv_lora_rank": LATENT, "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE, "v_head_dim": V, "first_k_dense_replace": 4})
    grouped_spec = xspec.compile("specs/modern/llama.xspec", overrides={**sizes, "heads": 8, "kv_heads": 2})
    print("\ngreedy decoding, batch 4, 64 new positions after a prompt of 448 (float32)")
    print(f"{'model':<32} {'parameters':>11} {'cache / position':>17} {'ms / token':>11}")
    prompt = torch.randint(0, 8000, (4, 448))
    results: dict[str, list[float]] = {"latent": [], "grouped": []}
    models = {"latent": latent_spec.build("cpu").eval(), "grouped": grouped_spec.build("cpu").eval()}
    for _ in range(max(1, args.rounds // 2)):
        for name, model in models.items():
            results[name].append(greedy_ms(model, prompt, 64))
    for name, spec in (("latent", latent_spec), ("grouped", grouped_spec)):
        label = "deepseek_v3 (latent attention)" if name == "latent" else "llama (8 heads, 2 key/value)"
        cached = 4 * decoding_cache(spec, 1).per_position  # float32 bytes
        print(f"{label:<32} {spec.parameters:>11,} {cached:>13,} B {statistics.median(results[name]):>8.2f}")


if __name__ == "__main__":
    main()
