"""Build a compiled spec on the CPU and run one forward pass with tiny random inputs.

The call follows docs/model-interface.md: `model(src, tgt, src_padding_mask)` for an encoder-decoder,
`model(tgt)` for a language model, `model(src, src_padding_mask)` for an encoder alone. What comes
out must have the shape and type the compiler inferred and the values the graph computes (reference.py),
and the built model the parameters it reported.
"""

from __future__ import annotations

from typing import Any

import torch

from xspec.compiler.shapes import BATCH, SRC_LEN, TGT_LEN

from .reference import graph_outputs

BATCH_SIZE = 2
LENGTH = 3
DTYPES = {"float": torch.float32, "long": torch.long, "bool": torch.bool}


def run_forward(spec: Any) -> None:
    """Raises AssertionError where the built model disagrees with the spec; anything else is a failure."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only adds synchronisation
    try:
        _run(spec)
    finally:
        torch.set_num_threads(threads)


def check_interface(spec: Any) -> None:
    """What the runtime reads off any compiled spec (docs/model-interface.md) is there."""
    for name in ("vocab_size", "model_dim"):
        value = getattr(spec, name)
        assert isinstance(value, int) and value > 0, f"spec.{name} is {value!r}"
    assert spec.max_positions is None or spec.max_positions > 0, f"spec.max_positions is {spec.max_positions!r}"


def _run(spec: Any) -> None:
    model = spec.build("cpu")
    model.eval()
    counted = sum(p.numel() for p in model.parameters())
    assert counted == spec.parameters, f"{counted} parameters built, {spec.parameters} reported"
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    assert shapes == spec.param_shapes, f"state_dict {shapes} != reported {spec.param_shapes}"

    # Positions cover max_positions tokens; every embedding must accept the token ids.
    length = min(LENGTH, spec.max_positions or LENGTH)
    vocabularies = [d["node"].attrs.vocab for _, d in spec.graph.nodes(data=True) if d["node"].op == "embedding"]
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(0, min(vocabularies, default=1), (BATCH_SIZE, length), generator=generator)
    tgt = torch.randint(0, min(vocabularies, default=1), (BATCH_SIZE, length), generator=generator)
    padding = torch.zeros(BATCH_SIZE, length, dtype=torch.bool)
    padding[1, -1] = length > 1  # the second sentence is one token shorter
    sizes = {BATCH: BATCH_SIZE, SRC_LEN: length, TGT_LEN: length}
    has_decoder = "output.logits" in spec.graph

    with torch.no_grad():
        outputs = {}
        if spec.has_encoder:
            outputs["memory"] = model.encode(src, padding)
        if spec.has_encoder and has_decoder:
            outputs["logits"] = model(src, tgt, padding)
        elif has_decoder:
            outputs["logits"] = model(tgt)
        else:
            assert_close(model(src, padding), outputs["memory"], "forward's output and encode's")
        for name, value in outputs.items():
            _expect(value, spec.graph.nodes[f"output.{name}"]["node"].shape, sizes, name)
        expected = graph_outputs(spec, model, {"src": src, "src_mask": padding, "tgt": tgt})
        for name, value in outputs.items():
            assert_close(value, expected[name], f"the {name} and what the graph computes")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    try:
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
    except AssertionError as error:
        raise AssertionError(f"{what} differ: {' '.join(str(error).split())[:300]}") from None


def _expect(value: Any, inferred: Any, sizes: dict[str, int], what: str) -> None:
    assert isinstance(value, torch.Tensor), f"the {what} is {type(value).__name__}, not a tensor"
    expected = tuple(sizes.get(d, d) for d in inferred.dims)
    assert tuple(value.shape) == expected, f"the {what} has shape {tuple(value.shape)}, inferred {inferred}"
    assert value.dtype == DTYPES[inferred.dtype], f"the {what} is {value.dtype}, inferred {inferred}"
