"""`xspec viz`: the DOT structure of the architecture diagrams, diffs, rendering, attention maps."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import xspec
from xspec.cli import main
from xspec.viz import architecture_dot
from xspec.viz.architecture import DIFF_COLOR

ROOT = Path(__file__).resolve().parents[1]
BASE = str(ROOT / "specs" / "base.xspec")
TINY = str(ROOT / "specs" / "tiny.xspec")
HAVE_DOT = shutil.which("dot") is not None
# CI installs graphviz: there a missing `dot` is a failure, elsewhere a skip.
needs_dot = pytest.mark.skipif(not HAVE_DOT and not os.environ.get("CI"), reason="graphviz's dot is not installed")


# --- a small reader for the DOT text the graphviz package writes (one statement per line) -----

@dataclass
class Dot:
    nodes: dict[str, str] = field(default_factory=dict)  # id -> attribute text
    edges: list[tuple[str, str, str]] = field(default_factory=list)  # (tail, head, attribute text)
    clusters: dict[str, set[str]] = field(default_factory=dict)  # cluster -> node ids inside, nested too
    cluster_attrs: dict[str, str] = field(default_factory=dict)

    def with_class(self, word: str) -> set[str]:
        return {n for n, attrs in self.nodes.items() if word in _class(attrs)}

    def edges_with_class(self, word: str) -> list[tuple[str, str, str]]:
        return [e for e in self.edges if word in _class(e[2])]


_ID = r'(?:"((?:[^"\\]|\\.)*)"|([\w.]+))'


def parse_dot(source: str) -> Dot:
    dot, open_clusters = Dot(), []
    for line in source.splitlines():
        text = line.strip()
        if m := re.match(rf"subgraph {_ID} {{$", text):
            name = m.group(1) or m.group(2)
            open_clusters.append(name)
            dot.clusters[name] = set()
        elif text == "}":
            if open_clusters:
                open_clusters.pop()
        elif m := re.match(rf"{_ID} -> {_ID}(?: \[(.*)\])?$", text):
            dot.edges.append((m.group(1) or m.group(2), m.group(3) or m.group(4), m.group(5) or ""))
        elif m := re.match(rf"{_ID} \[(.*)\]$", text):
            name = m.group(1) or m.group(2)
            if name in ("node", "edge", "graph"):
                continue
            dot.nodes[name] = m.group(3)
            for cluster in open_clusters:
                dot.clusters[cluster].add(name)
        elif open_clusters and "=" in text and open_clusters[-1] not in dot.cluster_attrs:
            dot.cluster_attrs[open_clusters[-1]] = text
    return dot


def _class(attrs: str) -> set[str]:
    m = re.search(r'\bclass=(?:"([^"]*)"|(\w+))', attrs)
    return set((m.group(1) or m.group(2)).split()) if m else set()


def diagram(path: str = BASE, depth: str = "2", overrides=None, diff_with=None) -> Dot:
    spec = xspec.compile(path, overrides=overrides)
    return parse_dot(architecture_dot(spec, depth, diff_with).source)


@pytest.fixture(scope="module")
def base() -> Dot:
    return diagram()


# --- depth 2: the paper's Figure 1 ---------------------------------------------------------------

def test_encoder_and_decoder_are_clusters_with_one_stack_each(base):
    assert {"cluster_encoder", "cluster_decoder",
            "cluster_encoder.layers", "cluster_decoder.layers"} <= set(base.clusters)
    assert base.clusters["cluster_encoder.layers"] <= base.clusters["cluster_encoder"]
    assert not base.clusters["cluster_encoder"] & base.clusters["cluster_decoder"]
    # each repeated stack is drawn once: layer 0, labelled with its count
    assert not [n for n in base.nodes if re.search(r"\.layers\.[1-9]", n)]
    for stack in ("cluster_encoder.layers", "cluster_decoder.layers"):
        assert "<B>6×</B>" in base.cluster_attrs[stack]


def test_one_box_per_sublayer_with_its_add_and_norm(base):
    encoder, decoder = base.clusters["cluster_encoder.layers"], base.clusters["cluster_decoder.layers"]
    attention, ffn, add_norm = (base.with_class("attention"), base.with_class("feed_forward"),
                                base.with_class("add_norm"))
    assert encoder & attention == {"encoder.layers.0.self_attn"}
    assert decoder & attention == {"decoder.layers.0.self_attn", "decoder.layers.0.cross_attn"}
    assert encoder & ffn == {"encoder.layers.0.ffn"} and decoder & ffn == {"decoder.layers.0.ffn"}
    assert len(encoder & add_norm) == 2 and len(decoder & add_norm) == 3
    assert "Masked Multi-Head Attention" in base.nodes["decoder.layers.0.self_attn"]
    assert "h = 8, d_k = 64, d_v = 64" in base.nodes["encoder.layers.0.self_attn"]
    assert "d_ff = 2048" in base.nodes["encoder.layers.0.ffn"]
    assert "batch × src_len × 512" in base.nodes["encoder.layers.0.ffn"]
    assert "2.10M params" in base.nodes["encoder.layers.0.ffn"]


def test_residual_edges_bypass_each_sublayer(base):
    residual = base.edges_with_class("residual")
    add_norm = base.with_class("add_norm")
    assert len(residual) == 5  # 2 encoder sublayers + 3 decoder sublayers
    for tail, head, _ in residual:
        assert head in add_norm
        sublayer = next(t for t, h, a in base.edges if h == head and "data" in _class(a))
        assert tail != sublayer and (tail, sublayer) in {(t, h) for t, h, _ in base.edges}


def test_cross_attention_edge_from_encoder_output(base):
    (edge,) = base.edges_with_class("cross_attention")
    tail, head, attrs = edge
    assert tail in base.clusters["cluster_encoder.layers"] and "add_norm" in _class(base.nodes[tail])
    assert head == "decoder.layers.0.cross_attn" and "K, V" in attrs


def test_tied_weights_are_marked(base):
    ties = {(t, h) for t, h, _ in base.edges_with_class("tie")}
    assert ties == {("decoder.embedding.embed", "encoder.embedding.embed"),
                    ("decoder.generator", "encoder.embedding.embed")}
    assert "tied: weight shared with encoder.embedding.embed" in base.nodes["decoder.generator"]
    assert "Softmax" in base.nodes["output.logits"]


def test_pre_norm_puts_the_norm_before_the_sublayer():
    dot = diagram(overrides={"norm_first": True})
    assert not dot.with_class("add_norm")
    norm = "encoder.layers.0.self_attn_sublayer.norm"
    assert (norm, "encoder.layers.0.self_attn") in {(t, h) for t, h, _ in dot.edges}
    residual_into = {h: t for t, h, _ in dot.edges_with_class("residual")}
    assert residual_into["encoder.layers.0.self_attn_sublayer.add_1"] == "encoder.embedding.add_1"  # skips the norm


def test_block_names_do_not_matter(tmp_path):
    text = (ROOT / "specs" / "base.xspec").read_text().replace("feed_forward", "mlp").replace("sublayer", "wrap")
    (tmp_path / "renamed.xspec").write_text(text)
    dot = diagram(str(tmp_path / "renamed.xspec"))
    assert len(dot.with_class("add_norm")) == 5 and len(dot.edges_with_class("residual")) == 5
    assert {"encoder.layers.0.ffn", "decoder.layers.0.ffn"} <= dot.with_class("feed_forward")


# --- depth 1 and full ------------------------------------------------------------------------------

def test_depth_1_draws_blocks():
    dot = diagram(depth="1")
    assert {"encoder.embedding", "encoder.layers", "decoder.embedding", "decoder.layers",
            "decoder.generator"} <= set(dot.nodes)
    assert "6× layers" in dot.nodes["encoder.layers"]
    assert [(t, h) for t, h, _ in dot.edges_with_class("cross_attention")] == [("encoder.layers", "decoder.layers")]
    assert "cluster_encoder.layers" not in dot.clusters


def test_depth_full_opens_attention_as_figure_2():
    dot = diagram(depth="full")
    mha = "cluster_decoder.layers.0.self_attn"
    parts = ("q", "k", "v", "scores", "scale", "mask", "softmax", "concat", "out")
    assert {f"decoder.layers.0.self_attn/{p}" for p in parts} <= dot.clusters[mha]
    assert "causal" in dot.nodes["decoder.layers.0.self_attn/mask"]
    assert "encoder.layers.0.self_attn_sublayer.dropout_1" in dot.nodes  # every op, dropout included
    tails = {t for t, h, _ in dot.edges if h == "decoder.layers.0.cross_attn/k"}
    assert tails == {"encoder.layers.0.ffn_sublayer.norm"}


# --- diffs -------------------------------------------------------------------------------------------

def _variant(tmp_path: Path, line: str) -> str:
    path = tmp_path / "variant.xspec"
    path.write_text(f'import "{BASE}"\nmodel variant extends transformer_base {{ {line} }}\n')
    return str(path)


def test_diff_highlights_a_one_line_variant(tmp_path):
    dot = diagram(_variant(tmp_path, 'set positions = "learned"'), diff_with=xspec.compile(BASE))
    changed = {n for n, attrs in dot.nodes.items() if f'color="{DIFF_COLOR["changed"]}"' in attrs}
    assert changed == {"encoder.embedding.positions", "decoder.embedding.positions"}
    assert "sinusoidal_positions → learned_positions" in dot.nodes["encoder.embedding.positions"]
    assert not any(DIFF_COLOR["added"] in a or DIFF_COLOR["removed"] in a for a in dot.nodes.values())


def test_diff_marks_added_removed_and_layer_counts(tmp_path):
    pre_norm = xspec.compile(BASE, overrides={"norm_first": True})
    added = diagram(BASE, overrides={"norm_first": True}, diff_with=xspec.compile(BASE))
    assert {n for n, a in added.nodes.items()
            if f'color="{DIFF_COLOR["added"]}"' in a} == {"encoder.norm", "decoder.norm"}
    removed = diagram(BASE, diff_with=pre_norm)
    assert {"removed/encoder.norm", "removed/decoder.norm"} <= removed.with_class("removed")
    assert "removed/encoder.norm" in removed.clusters["cluster_encoder"]  # where it was
    assert ("encoder.layers.0.ffn_sublayer.add_1", "removed/encoder.norm") in {(t, h) for t, h, _ in removed.edges}
    no_encoder = diagram(str(ROOT / "specs" / "lm.xspec"), diff_with=xspec.compile(BASE))
    assert {"removed/encoder.layers.0.self_attn", "removed/input.src"} <= no_encoder.with_class("removed")
    assert "removed/encoder.layers.0.self_attn" in no_encoder.clusters["cluster_removed/encoder"]
    fewer = diagram(_variant(tmp_path, "set layers = 2"), diff_with=xspec.compile(BASE))
    assert "layers: 6 → 2" in fewer.cluster_attrs["cluster_encoder.layers"]
    blocks = diagram(_variant(tmp_path, "set layers = 2"), depth="1", diff_with=xspec.compile(BASE))
    assert f'color="{DIFF_COLOR["changed"]}"' in blocks.nodes["encoder.layers"]
    assert "layers: 6 → 2" in blocks.nodes["encoder.layers"]


def test_diff_compares_every_layer_of_a_stack_and_names_those_that_differ(tmp_path):
    """A stack is drawn as its first layer; a variant that changes only later layers (no rotary positions in
    every fourth: its attention reads no angles) is marked on the op drawn, naming the layers."""
    from xspec.viz.diff import Diff

    llama = ROOT / "specs" / "modern" / "llama.xspec"
    variant = tmp_path / "variant.xspec"
    variant.write_text(f'import "{llama}"\nmodel variant extends llama {{\n  set layers = 8\n'
                       "  block lm_layer(x, rope, mask, i) {\n"
                       "    if i % 4 == 3 {\n"
                       "      attend = h => attention(h, h, h, heads = heads, kv_heads = kv_heads, d_k = d_k,"
                       " d_v = d_v, causal = true, bias = attention_bias) as self_attn\n"
                       "    } else {\n"
                       "      attend = h => attention(h, h, h, heads = heads, kv_heads = kv_heads, d_k = d_k,"
                       " d_v = d_v, causal = true, bias = attention_bias, position_embeddings = rope)"
                       " as self_attn\n"
                       "    }\n"
                       "    x = x + attend(rms_norm(x, eps = rms_norm_eps) as input_layernorm)\n"
                       "    return x + feed_forward(rms_norm(x, eps = rms_norm_eps) as post_attention_layernorm)"
                       " as mlp\n  }\n"
                       "  block decoder(tokens) {\n"
                       "    x = embedding(tokens, vocab, d_model) as embed_tokens\n"
                       "    rope = rotary_embedding(x, d_k, base = rope_theta) as rotary_emb\n"
                       "    mask = attention_mask(x, causal = true) as causal_mask\n"
                       "    repeat i in layers { x = lm_layer(x, rope, mask, i) }\n"
                       "    x = rms_norm(x, eps = rms_norm_eps) as norm\n"
                       "    return linear(x, vocab, bias = false) as lm_head\n  }\n}\n")
    diff = Diff(xspec.compile(str(variant)), xspec.compile(str(llama), overrides={"layers": 8}))
    assert not diff.is_empty
    lines = [line for status in diff.ops.values() for line in status.lines]
    assert "layers 3, 7: input position_embeddings: decoder.rotary_emb → (none)" in lines, lines
    assert not any(line.startswith(("layer 0", "layers 0", "layer 1:")) for line in lines)


# --- the command ---------------------------------------------------------------------------------------

@needs_dot
@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_renders_real_files(tmp_path, capsys, suffix):
    out = tmp_path / f"base{suffix}"
    assert main(["viz", BASE, "-o", str(out)]) == 0
    data = out.read_bytes()
    if suffix == ".svg":
        assert b"<svg" in data and b"Multi&#45;Head Attention" in data and b"Add &amp; Norm" in data
    else:
        assert data.startswith(b"\x89PNG") and len(data) > 50_000


@needs_dot
def test_without_output_the_diagram_goes_beside_compiles_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["viz", BASE]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {Path('out') / 'base' / 'base.svg'}"
    assert b"<svg" in (tmp_path / "out" / "base" / "base.svg").read_bytes()
    assert main(["viz", BASE, "--depth", "full", "--diff", str(ROOT / "specs" / "big.xspec")]) == 0
    assert (tmp_path / "out" / "base" / "base-full-vs-big.svg").is_file()


def test_dot_needs_no_graphviz_program_and_rendering_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("xspec.viz.render.shutil.which", lambda name: None)
    assert main(["viz", BASE, "-o", str(tmp_path / "base.dot")]) == 0
    assert (tmp_path / "base.dot").read_text().startswith("digraph transformer_base")
    capsys.readouterr()
    assert main(["viz", BASE, "-o", str(tmp_path / "base.png")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "graphviz" in err and "Traceback" not in err
    assert not (tmp_path / "base.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["viz", BASE, "-o", "x.jpg"], "unknown output format"),
    (["viz", BASE, "-o", "x.svg", "--layer", "2"], "--layer goes with --attention"),
    (["viz", "-o", "x.svg"], "give a SPEC"),
    (["viz", "--attention", "no/such/run", "-o", "a.png"], "--sentence"),
    (["viz", "--attention", "no/such/run", "--sentence", "hi"], "--attention needs -o FILE"),
    (["viz", "--attention", "no/such/run", "--sentence", "hi", "-o", "a.png"], "no such run directory"),
])
def test_user_mistakes_are_one_line(capsys, argv, message):
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# --- attention maps (Figures 3-5) ------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A very small model trained for a few steps on the built-in demo task."""
    from xspec.runtime.demo_data import generate_split
    from xspec.runtime.run_dir import DataFiles, Split
    from xspec.runtime.train import RunOptions, train

    directory = tmp_path_factory.mktemp("attention")

    def split(name: str, size: int) -> Split:
        pairs = generate_split(name, size)
        (directory / f"{name}.src").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (directory / f"{name}.tgt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
        return Split(directory / f"{name}.src", directory / f"{name}.tgt")

    spec = xspec.compile(TINY, overrides={"vocab": 200, "d_model": 32, "d_ff": 64, "heads": 2, "layers": 2,
                                          "train.max_steps": 6, "train.batch_tokens": 300,
                                          "train.warmup_steps": 10, "train.validate_every_steps": 1000})
    run = directory / "run"
    train(spec, RunOptions(out_dir=run, data=DataFiles(split("train", 200), split("valid", 5), None),
                           device="cpu", compile="off", progress=False, evaluate=False))
    return run


def test_attention_maps_of_a_trained_model(trained_run, tmp_path, capsys):
    from xspec.viz.attention import collect_maps, load_trained

    sentence = "the mida tanu netavas a vegeza mulo"
    spec, model, vocab, _ = load_trained(trained_run)
    maps = collect_maps(spec, model, vocab, sentence, target="hauwi stosteistu", layer=None, head=None)
    assert sorted({(m.site.kind, m.site.layer) for m in maps}) == sorted(
        (kind, layer) for kind in ("encoder self-attention", "decoder self-attention", "encoder-decoder attention")
        for layer in (1, 2))
    for amap in maps:
        assert amap.weights.shape == (2, len(amap.queries), len(amap.keys))
        assert amap.weights.sum(-1).sub(1).abs().max() < 1e-5  # each query's weights are a distribution
        if amap.site.kind == "decoder self-attention":  # §3.2.3: no attention to later positions
            assert amap.weights.triu(1).abs().max() == 0
    source = next(m for m in maps if m.site.kind == "encoder self-attention")
    assert source.keys[-1] == "</s>" and "".join(source.keys[:-1]).replace("▁", " ").strip() == sentence

    out = tmp_path / "attn.png"
    assert main(["viz", "--attention", str(trained_run), "--sentence", sentence, "-o", str(out),
                 "--layer", "2", "--head", "1"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    assert main(["viz", "--attention", str(trained_run), "--sentence", sentence, "-o", str(out), "--head", "3"]) != 0
    assert "--head 3: the model's attention has heads 1 to 2" in capsys.readouterr().err


def test_the_title_names_the_overrides():
    plain = architecture_dot(xspec.compile(TINY)).source
    assert "with --set" not in plain
    source = architecture_dot(xspec.compile(TINY, overrides={"heads": "8", "norm_first": "true"})).source
    assert "with --set heads = 8, norm_first = true" in source
