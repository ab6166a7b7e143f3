"""`xspec import`: a save_pretrained directory as an xspec run directory, written atomically.

    OUT/model.xspec                         the family's spec extended with the checkpoint's values
    OUT/specs/...                           the shipped specs it imports, copied
    OUT/spec.xspec                          the same, resolved into one self-contained text (as every run has)
    OUT/checkpoints/step-00000000.safetensors  the weights under the spec's names, the spec and the tokenizer
    OUT/import.json                         the source, the family, what was set aside and why, the check
    OUT/.xspec-written.json                 every file above: --force replaces OUT only as it was written
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import torch

import xspec
from xspec.base.errors import SpecError, UserError
from xspec.base.output_dir import check_replaceable, write_directory
from xspec.base.text import shown
from xspec.hf import weight_map
from xspec.hf.checkpoint_dir import CONFIG, CheckpointDir, checkpoint_directory, open_weights, read_config
from xspec.hf.config_reader import render
from xspec.hf.families import FAMILIES, Mapped, map_config
from xspec.hf.generation_config import FILE as GENERATION_FILE, Generation, check_token_ids, read_generation
from xspec.hf.safetensors_file import write_safetensors
from xspec.hf.summary import IMPORT_FILE
from xspec.hf.spec_text import copy_family, model_name, spec_text
from xspec.hf.tokenizer import check_fits, find_tokenizer
from xspec.runtime.checkpoint import check_finite
from xspec.runtime.run_dir import IMPORTED_SPEC_FILE
from xspec.runtime.tokenizer import CheckpointTokenizer

if TYPE_CHECKING:
    from xspec.compiler.spec import CompiledSpec

WRITER = "xspec import"


@dataclass
class Imported:
    out: Path
    mapped: Mapped
    spec: CompiledSpec
    tokenizer: CheckpointTokenizer
    verification: dict | None


def import_checkpoint(source: Path, out: Path, force: bool = False, verify: bool = True,
                      say: Callable[[str], None] = print, device: str | None = None) -> Imported:
    """Writes the run directory `out` from the checkpoint directory `source`; `device` (default: CUDA when
    available) is where the verification runs."""
    _check_output(source, out, force)
    config = read_config(source)
    mapped = map_config(config, str(source / CONFIG))
    weights = open_weights(source, config)
    _without_missing_predictions(mapped, weights, say)
    _untied_where_the_head_differs(mapped, weights, say)
    encoder_decoder = FAMILIES[mapped.model_type].encoder_decoder
    generation = read_generation(checkpoint_directory(source), config if encoder_decoder else None)
    tokenizer = find_tokenizer(source, config, generation.eos_ids, generation.file)
    for setting in generation.changed:
        say(f"{shown(source / GENERATION_FILE)}: {setting} is not applied by xspec's decoding yet: continuations "
            "may differ from transformers' generate")
    made: dict = {}

    def fill(work: Path) -> None:
        try:
            spec = _write_spec(work, source, mapped, generation)
        except SpecError as error:    # the spec is generated: the config's keys are what the user can change
            raise _in_config(error, mapped, source / CONFIG) from None
        _check_sizes(spec, mapped, source / CONFIG)
        plan = _plan(mapped, spec, weights)
        _check_copies(mapped, spec.params, weights)
        check_fits(tokenizer, config, source, spec.vocab_size, generation.eos_ids,  # the rows _plan checked
                   spec.logits_size)
        check_token_ids(generation, spec.vocab_size, shown(source / GENERATION_FILE))
        _write_weights(work, plan, weights, spec, tokenizer)
        verification = None
        if verify:
            from xspec.hf.verify import verify_import

            verification = verify_import(weights, work, mapped, say, spec, device)
        _write_record(work, source, mapped, tokenizer, verification, generation)
        made.update(spec=spec, verification=verification)

    write_directory(out, fill, WRITER)
    return Imported(out, mapped, made["spec"], tokenizer, made["verification"])


def _without_missing_predictions(mapped: Mapped, weights: CheckpointDir, say: Callable[[str], None]) -> None:
    """A config that counts multi-token prediction modules whose weights the checkpoint does not hold (one
    written by transformers' save_pretrained, which drops them): the model is imported without them."""
    setting = next((s for s in mapped.settings if s.param == "mtp_depth"), None)
    if setting is None or not setting.value:
        return
    first = f"model.layers.{mapped.params['layers']}.eh_proj.weight"
    if first in weights.files:
        return
    setting.value = 0
    why = (f"the checkpoint holds no weights for its {mapped.config[setting.source]} multi-token prediction "
           f"module(s) (no {first}; transformers' save_pretrained drops them): imported without them")
    mapped.notes[setting.source] = why
    say(f"{shown(weights.path)}: {why}")


def _untied_where_the_head_differs(mapped: Mapped, weights: CheckpointDir, say: Callable[[str], None]) -> None:
    """A config that ties the output projection to the embedding, whose checkpoint holds a projection of other
    values: transformers loads the two apart (and says so), as the import does. (transformers 5 ties T5's
    always, and reads such checkpoints so.)"""
    setting = next((s for s in mapped.settings if s.param == "tie_word_embeddings"), None)
    if setting is None or not setting.value:
        return
    name = mapped.weights.head
    extra = mapped.weights.extras(name, mapped.params)
    if extra is None or extra.copy_of is None or name not in weights.files or extra.copy_of not in weights.files:
        return
    head, embedding = weights.tensor(name), weights.tensor(extra.copy_of)
    if head.shape != embedding.shape or torch.equal(head, embedding):   # a misshapen copy is refused as one
        return
    setting.value = False
    why = f"the checkpoint's {name} differs from {extra.copy_of}: imported apart, as transformers loads it"
    mapped.notes[setting.source] = why
    say(f"{shown(weights.path)}: {why}")


def _check_output(source: Path, out: Path, force: bool) -> None:
    """OUT is new, or (with --force) an earlier import as it was written, or an empty directory
    (xspec/base/output_dir.py); never the checkpoint itself."""
    inside = [out.resolve(), *out.resolve().parents]
    if source.resolve() in inside or out.resolve() in [source.resolve(), *source.resolve().parents]:
        raise UserError(f"{shown(out)}: the output may not be the checkpoint directory {shown(source)}, inside it, "
                        "or around it")
    if (out.exists() or out.is_symlink()) and not force:
        raise UserError(f"{shown(out)}: already exists; pass --force to replace it")
    check_replaceable(out, "-o", "import")


def _write_spec(work: Path, source: Path, mapped: Mapped, generation: Generation):
    family = copy_family(mapped.spec, work)
    text = spec_text(model_name(source, family.models), mapped.spec, family.spec, mapped.settings, str(source),
                     mapped.model_type, mapped.max_positions, generation.decode,
                     FAMILIES[mapped.model_type].encoder_decoder, FAMILIES[mapped.model_type].encoder_only)
    (work / IMPORTED_SPEC_FILE).write_text(text, encoding="utf-8")
    spec = xspec.compile(work / IMPORTED_SPEC_FILE)
    (work / "spec.xspec").write_text(spec.resolved_source, encoding="utf-8")
    return spec


def _check_sizes(spec, mapped: Mapped, config: Path) -> None:
    """The memory check `build` makes, before anything the size of the model is read or made."""
    try:
        spec._check_allocatable(torch.device("cpu"))
    except UserError as error:
        needs = str(error).split(" needs ", 1)[-1]
        raise UserError(f"{shown(config)}: the model it describes needs {needs}{_largest(mapped)}") from None


def _in_config(error: SpecError, mapped: Mapped, config: Path) -> UserError:
    """A refusal of the generated spec as one of config.json: its keys whose values the diagnostic names
    (`kv_heads = 3 must divide heads = 4`: num_key_value_heads and num_attention_heads), never a line of a
    file the user did not write."""
    first = next((d for d in error.diagnostics if d.severity == "error"), error.diagnostics[0])
    if first.code == "too-large" and " has " in first.message and "memory" in first.message:
        return UserError(f"{shown(config)}: the model it describes has {first.message.split(' has ', 1)[1]}"
                         f"{_largest(mapped)}")
    named = [s for s in mapped.settings if re.search(rf"\b{re.escape(s.param)}\b", first.message)]
    if not named:
        return UserError(f"{shown(config)}: the values it gives make a model xspec cannot build: {first.message}")
    keys = ", ".join(dict.fromkeys(f"{s.source} {render(s.value)}" for s in named))
    return UserError(f"{shown(config)}: {keys}: {first.message}")


def _largest(mapped: Mapped) -> str:
    """`; the largest sizes: hidden_size 4096, ...`: the sizes most likely at fault in a model too large."""
    sizes = {s.source: s.value for s in mapped.settings if isinstance(s.value, int) and not isinstance(s.value, bool)}
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:3]
    return "; the largest sizes: " + ", ".join(f"{key} {value:,}" for key, value in largest) if largest else ""


@dataclass
class Plan:
    groups: list[weight_map.Group]
    tied: dict[str, str]           # the spec's tied copies -> the tensor they share
    layout: list[tuple[str, torch.dtype, tuple[int, ...]]]
    zeros: dict[str, tuple[int, ...]]   # checkpoint tensors it lacks, taken as zeros (WeightRules.zeros)


def _plan(mapped: Mapped, spec, weights: CheckpointDir) -> Plan:
    """Which checkpoint tensors make which of the spec's, every shape checked (on meta tensors, nothing
    read): a tensor missing, left over or of the wrong shape is an error naming it."""
    shapes = {**spec.param_shapes, **spec.state_shapes}
    tied = {copy: target for copy, target in spec.ties.items()}
    names = [n for n in shapes if n not in tied]
    groups = weight_map.groups(mapped.weights, names, shapes, spec.params)
    wanted = {hf for g in groups for hf in g.hf}
    where = weights.path
    missing = [hf for g in groups for hf in g.hf if hf not in weights.files and hf not in mapped.weights.zeros]
    if missing:
        raise UserError(f"{where}: no tensor {missing[0]}, which a {mapped.model_type} model with this config.json has")
    extra = [n for n in weights.files if n not in wanted and mapped.weights.extras(n, spec.params) is None]
    if extra:
        raise UserError(f"{where}: tensor {extra[0]} is left over: a {mapped.model_type} model with this "
                        "config.json has no such tensor")
    dtypes, layout_of = {}, {}
    for group in groups:
        _check_stored(group, shapes, weights)
        inputs = [torch.empty(_stored_shape(group, n, shapes, weights), dtype=_stored_dtype(n, weights), device="meta")
                  for n in group.hf]
        for name, output in zip(group.ours, group.to_ours(inputs)):
            assert tuple(output.shape) == tuple(shapes[name]), f"{group.hf} -> {name}: {tuple(output.shape)}"
            dtypes[name] = inputs[0].dtype
            layout_of[name] = (name, inputs[0].dtype, tuple(shapes[name]))
    layout = [layout_of[n] for n in names] + [(c, dtypes[t], tuple(shapes[c])) for c, t in tied.items()]
    zeros = {n: _stored_shape(g, n, shapes, weights) for g in groups for n in g.hf if n not in weights.files}
    return Plan(groups, tied, layout, zeros)


def _needed_shapes(group: weight_map.Group, shapes: dict) -> list[tuple[int, ...]]:
    """The shapes the checkpoint's tensors of `group` must have: the spec's, put into the checkpoint's layout
    (on meta tensors), before anything is reordered."""
    return [tuple(t.shape) for t in group.to_hf([torch.empty(shapes[name], device="meta") for name in group.ours])]


def _stored_shape(group: weight_map.Group, name: str, shapes: dict, weights: CheckpointDir) -> tuple[int, ...]:
    """A checkpoint tensor's shape: the file's, or, where it lacks one taken as zeros, the one needed."""
    if name in weights.files:
        return tuple(weights.shape(name))
    return _needed_shapes(group, shapes)[group.hf.index(name)]


def _stored_dtype(name: str, weights: CheckpointDir) -> torch.dtype:
    return weights.files[name].dtype(name) if name in weights.files else torch.float32


def _check_stored(group: weight_map.Group, shapes: dict, weights: CheckpointDir) -> None:
    """Each checkpoint tensor of `group` has the shape and a floating-point dtype the model needs: the
    spec's tensors put into the checkpoint's layout (on meta tensors), before anything is reordered."""
    for hf, needed in zip(group.hf, _needed_shapes(group, shapes)):
        if hf not in weights.files:      # one the checkpoint may lack, taken as zeros
            continue
        stored, dtype = tuple(weights.shape(hf)), weights.files[hf].dtype(hf)
        if stored != needed:
            raise UserError(f"{weights.path}: tensor {hf} {stored} has the wrong shape: the model with this "
                            f"config.json needs {needed}")
        if not dtype.is_floating_point:
            held = str(dtype).removeprefix("torch.")
            raise UserError(f"{weights.path}: tensor {hf} holds {held}, not floating-point numbers (quantized "
                            "weights are not supported; dequantize with transformers first)")



def _tensors(plan: Plan, weights: CheckpointDir) -> Iterator[torch.Tensor]:
    """The spec's tensors in `plan.layout`'s order, each made when the writer asks for it; a group's
    checkpoint pages are given back once the writer has moved past it."""
    by_name = {name: g for g in plan.groups for name in g.ours}
    made: dict[str, torch.Tensor] = {}
    read: tuple[str, ...] = ()
    for name, _, _ in plan.layout:
        name = plan.tied.get(name, name)
        if name not in made:
            for done in read:
                weights.files[done].release(done)
            group = by_name[name]
            stored = [weights.tensor(n) if n in weights.files else torch.zeros(plan.zeros[n]) for n in group.hf]
            for hf, tensor in zip(group.hf, stored):    # verification cannot tell: the reference computes the NaNs too
                check_finite(weights.path, hf, tensor)
            made = dict(zip(group.ours, group.to_ours(stored)))
            read = tuple(n for n in group.hf if n in weights.files)
        yield made.pop(name)


def _check_copies(mapped: Mapped, params: dict, weights: CheckpointDir) -> None:
    """What a checkpoint keeps beside the spec's tensors must hold what the spec computes: its copies of shared
    tensors (a tied output head, Marian's embeddings of its one vocabulary) equal them, and its derived tables
    (Marian's sinusoidal positions) equal the spec's."""
    for name in weights.files:
        extra = mapped.weights.extras(name, params)
        if extra is None:
            continue
        if extra.unused:
            weights.files[name].release(name)
            continue
        stored = weights.tensor(name)
        if extra.copy_of is None:
            assert extra.derived is not None, f"{name}: a derived table with no values"
            expected = extra.derived(tuple(stored.shape))
            if not torch.allclose(stored.float(), expected, atol=DERIVED_TOLERANCE):
                raise UserError(f"{weights.path}: tensor {name} differs from {extra.why}")
        elif extra.copy_of not in weights.files:
            raise UserError(f"{weights.path}: no tensor {extra.copy_of}, of which {name} is a copy")
        elif not torch.equal(stored, weights.tensor(extra.copy_of)):
            raise UserError(f"{weights.path}: {name} differs from {extra.copy_of}, but {extra.why}")
        for read in (name, extra.copy_of or name):
            weights.files[read].release(read)


DERIVED_TOLERANCE = 1e-4     # a table of sines computed in another precision or order differs by ~1e-7


def _write_weights(work: Path, plan: Plan, weights: CheckpointDir, spec, tokenizer: CheckpointTokenizer) -> None:
    from xspec.runtime.checkpoint import PARAMS_KEY, SPEC_KEY, STEP_KEY, TOKENIZER_KEY, VOCAB_KEY, weights_file

    metadata = {SPEC_KEY: spec.resolved_source, PARAMS_KEY: json.dumps(spec.params, sort_keys=True),
                VOCAB_KEY: base64.b64encode(tokenizer.model_proto).decode("ascii"),
                STEP_KEY: "0", TOKENIZER_KEY: json.dumps(tokenizer.describe())}
    path = weights_file(work / "checkpoints", 0)
    path.parent.mkdir(parents=True)
    with open(path, "wb") as handle:
        write_safetensors(handle, plan.layout, _tensors(plan, weights), metadata)


def _write_record(work: Path, source: Path, mapped: Mapped, tokenizer, verification, generation: Generation) -> None:
    record = {"source": str(source.resolve()), "model_type": mapped.model_type, "family": mapped.spec,
              "hf_class": mapped.hf_class, "set": [s.__dict__ for s in mapped.settings],
              "not_architectural": mapped.notes, "tokenizer": tokenizer.describe(), "verification": verification,
              "config": mapped.config, "decode": [s.__dict__ for s in generation.decode],
              "generation_not_applied": generation.notes}
    (work / IMPORT_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
