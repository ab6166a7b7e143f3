"""The training step that `--compile on` runs: model and loss compiled as one graph, with no graph break,
and batches of new lengths reusing it (one test: torch.compile of even the tiny model takes about a minute
on a CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import xspec
from xspec.runtime.batching import NO_LABEL, collate, micro_batches, plan_epoch
from xspec.runtime.corpus import encode_pairs, read_parallel
from xspec.runtime.step import TrainingStep, compile_step
from xspec.runtime.vocab import train_vocab


def test_the_compiled_step_is_one_graph_for_every_batch_and_gives_the_eager_loss(small_corpus, tmp_path):
    text = read_parallel(small_corpus.train.src, small_corpus.train.tgt)
    vocab = train_vocab(text.source + text.target, 200, "bpe", tmp_path)
    data = encode_pairs(text, vocab, 64, truncate=True)
    targets = [len(t) for t in data.target]
    batches = micro_batches([len(s) for s in data.source], targets, 300)
    plan = [update for epoch in range(3) for update in plan_epoch(batches, targets, 600, seed=1, epoch=epoch)]
    assert len(plan) >= 30 and len({tuple(collate(u[0], data.source, data.target).inputs[1].shape) for u in plan}) > 10

    torch.manual_seed(0)
    spec = xspec.compile("specs/tiny.xspec", overrides={"vocab": 200, "layers": 1, "dropout": 0})
    step = TrainingStep(spec.build("cpu"), label_smoothing=0.1)
    compiled = compile_step(step)
    optimizer = torch.optim.Adam(step.parameters(), lr=1e-3)
    counters.clear()
    graphs = []
    for index, update in enumerate(plan[:30]):
        for micro_batch in update:
            batch = collate(micro_batch, data.source, data.target)
            loss = compiled(batch.labels, *batch.inputs)
            if index == 0:  # the same value as the model's logits through F.cross_entropy, eagerly
                logits = step.model(*batch.inputs)
                eager = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=NO_LABEL,
                                        label_smoothing=0.1, reduction="sum")
                torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-5 * float(eager.detach().abs()))
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        graphs.append(counters["stats"]["unique_graphs"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert graphs[-1] - graphs[1] <= 2, graphs


def test_a_compiled_run_says_its_first_update_compiles_and_how_long_it_took(small_corpus, tmp_path, monkeypatch,
                                                                             capsys):
    """The compilation itself stands in here (a minute on a CPU): what the log says around it is tested."""
    import xspec.runtime.train as train_module
    from xspec.runtime.train import RunOptions, train

    class Compiled(torch.nn.Module):
        def __init__(self, wrapped):
            super().__init__()
            self.wrapped = wrapped

        def forward(self, *args, **kwargs):
            return self.wrapped(*args, **kwargs)

    monkeypatch.setattr(train_module, "compile_step", Compiled)
    spec = xspec.compile("specs/tiny.xspec", overrides={"vocab": 200, "layers": 1, "train.max_steps": 2})
    train(spec, RunOptions(tmp_path / "run", small_corpus, device="cpu", compile="on", progress=False,
                           evaluate=False, tensorboard=False))
    lines = capsys.readouterr().out.splitlines()
    announced = lines.index("torch.compile: the first update compiles the training step (tens of seconds on a CPU; "
                            "a pass of a new shape may compile again)")
    took = [i for i, line in enumerate(lines) if line.startswith("torch.compile: the first update, compiling "
                                                                 "included, took ")]
    assert len(took) == 1 and announced < took[0] < next(i for i, line in enumerate(lines) if line.startswith("step "))
