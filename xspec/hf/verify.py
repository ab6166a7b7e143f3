"""Proof at import: the imported model and the checkpoint's own transformers class, both in float32, on
one fixed random batch; max |logit difference| and the mean KL divergence of the next-token
distributions, the import failing above a threshold. The batch reaches past the sliding window and past
original_max_position_embeddings when the config declares them (within max_position_embeddings). The two
models are never held at once; a model too large to hold even once as float32 is checked on its first
layers on both sides, and says so."""

from __future__ import annotations

import importlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch

from xspec.base.errors import UserError
from xspec.runtime.run_dir import IMPORTED_SPEC_FILE
from xspec.base.text import printable, shown
from xspec.hf.checkpoint_dir import CONFIG, INDEX, CheckpointDir
from xspec.hf.families import FAMILIES, Mapped

MAX_KL = 1e-5                 # nats per token, averaged
MAX_RELATIVE_DIFFERENCE = 1e-3  # of the largest logit's size (float32 sums in another order differ by ~1e-6)
SHORTEST = 16
LONGEST = 8200                # positions checked at most (past Llama 3.1's 8192 original positions)


def transformers_available() -> bool:
    try:
        importlib.import_module("transformers")
    except ImportError:
        return False
    return True


def check_length(mapped: Mapped) -> int:
    """A length past every boundary the config declares (the window, the rotary scaling's start)."""
    length = SHORTEST
    if mapped.window:
        length = max(length, mapped.window + 4)
    if mapped.scaled_from:
        length = max(length, mapped.scaled_from + 4)
    return min(length, mapped.max_positions, LONGEST)


def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    from xspec.compiler.spec import _available_host_memory

    return _available_host_memory()


def layers_to_check(work: Path, layers: int, whole: int, device: torch.device) -> int:
    """All the layers when one float32 copy of the model fits in memory (the two models are never held
    at once); else as many first layers as fit, at least one."""
    import xspec

    def needed(count: int) -> int:
        return xspec.compile(work / IMPORTED_SPEC_FILE, overrides={"layers": count})._compilation.validated.bytes_needed

    room = int(available_memory(device) * 0.8)
    if whole <= room or layers == 1:
        return layers
    one, two = needed(1), needed(2)
    per_layer, rest = two - one, 2 * one - two
    fitting = (room - rest) // per_layer if per_layer > 0 else layers
    if fitting < 1:
        raise UserError(f"{work.name}: not even one layer of the model fits in memory as float32 beside its "
                        f"embeddings ({one / 2**30:.1f} GiB); import with --no-verify")
    return int(min(fitting, layers - 1))


def _our_logits(work: Path, layers: int, checked: int, tokens: torch.Tensor,
                source: torch.Tensor | None = None, encoder_only: bool = False,
                types: torch.Tensor | None = None) -> torch.Tensor:
    """The logits of `tokens`; of an encoder-decoder, the target `tokens` after the `source` sentences; of an
    encoder alone, of `tokens` with their padding (source_padding) and, where given, their token `types`."""
    device = str(tokens.device)
    import xspec

    if encoder_only:
        model = xspec.load(work, device=device, weights="fp32").model
        with torch.no_grad():
            return model(tokens, source_padding(tokens), *([] if types is None else [types])).float()
    if source is not None:
        model = xspec.load(work, device=device, weights="fp32").model
        with torch.no_grad():
            return model(source, tokens, source_padding(source)).float()
    if checked == layers:
        model = xspec.load(work, device=device, weights="fp32").model  # the reference is float32
    else:  # the first layers: the spec with fewer, their tensors read from the written checkpoint
        from xspec.hf.safetensors_file import SafetensorsFile
        from xspec.runtime.checkpoint import weights_file

        spec = xspec.compile(work / IMPORTED_SPEC_FILE, overrides={"layers": checked})
        model = spec.build(device=device, init=False).eval()
        written = SafetensorsFile(weights_file(work / "checkpoints", 0))
        model.load_state_dict({name: written.tensor(name) for name in model.state_dict()})
    with torch.no_grad():
        return model(tokens).float()


def _reference_directory(weights: CheckpointDir, into: Path) -> Path:
    """What the checkpoint's own class is given to read: config.json as xspec read it and links to the weight
    files xspec checked, nothing else. From the checkpoint directory itself, transformers would read
    whatever else it holds (generation_config.json, ...) and follow its links wherever they lead."""
    (into / CONFIG).write_text(json.dumps(weights.config), encoding="utf-8")
    files = {id(file): file for file in weights.files.values()}.values()
    for file in files:
        (into / file.path.name).symlink_to(os.path.realpath(file.path))
    if len(files) > 1:
        index = {"metadata": {"total_size": weights.weight_bytes},
                 "weight_map": {name: file.path.name for name, file in weights.files.items()}}
        (into / INDEX).write_text(json.dumps(index), encoding="utf-8")
    return into


def _their_logits(weights: CheckpointDir, hf_class, checked: int, tokens: torch.Tensor,
                  source: torch.Tensor | None = None, encoder_only: bool = False,
                  types: torch.Tensor | None = None) -> torch.Tensor:
    """The logits of the checkpoint's own class; whatever transformers raises on this checkpoint is an error
    naming it (xspec's reading let through a value the reference cannot run)."""
    with tempfile.TemporaryDirectory(prefix="xspec-reference-") as folder:
        try:
            return _reference_logits(_reference_directory(weights, Path(folder)), hf_class, checked, tokens, source,
                                     encoder_only, types)
        except Exception as error:      # transformers raises assorted types for what it cannot run
            reason = printable(" ".join(str(error).split())[:300]) or type(error).__name__
            raise UserError(f"{shown(weights.path)}: transformers' {hf_class.__name__} cannot run this checkpoint "
                            f"to verify the import ({type(error).__name__}: {reason}); import with --no-verify to "
                            "skip the check") from None


def _reference_logits(folder: Path, hf_class, checked: int, tokens: torch.Tensor,
                      source: torch.Tensor | None = None, encoder_only: bool = False,
                      types: torch.Tensor | None = None) -> torch.Tensor:
    import transformers

    config = hf_class.config_class.from_pretrained(folder)
    if source is None and checked != config.num_hidden_layers:
        config.num_hidden_layers = checked
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:checked]
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()       # one line of figures, not a loading bar
    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()        # the layers left out are not news
    try:
        reference = hf_class.from_pretrained(folder, config=config, dtype=torch.float32, trust_remote_code=False,
                                             use_safetensors=True, attn_implementation="eager").eval()
    finally:
        transformers.utils.logging.set_verbosity(verbosity)
        if bars:
            transformers.utils.logging.enable_progress_bar()
    with torch.no_grad():
        reference = reference.to(tokens.device)
        if encoder_only:
            typed = {} if types is None else {"token_type_ids": types}
            return reference(input_ids=tokens, attention_mask=(~source_padding(tokens)).long(), **typed).logits.float()
        if source is None:
            return reference(tokens).logits.float()
        return reference(input_ids=source, attention_mask=(~source_padding(source)).long(),
                         decoder_input_ids=tokens).logits.float()


def source_padding(source: torch.Tensor) -> torch.Tensor:
    """[B, S] True at padding: the second sentence of the check is shorter by a third (its ids are kept, and
    masked), so that padding is checked too."""
    padding = torch.zeros(source.shape, dtype=torch.bool, device=source.device)
    padding[1:, source.size(1) - source.size(1) // 3:] = True
    return padding


def _pair_types(spec, tokens: torch.Tensor) -> torch.Tensor | None:
    """Token types as a sentence pair's, for an encoder that reads two or more (BERT's): the first half of each
    row of type 0, the rest of type 1; None for any other model."""
    if (spec.token_types or 0) < 2:
        return None
    types = torch.zeros_like(tokens)
    types[:, tokens.size(1) // 2:] = 1
    return types


def _tokens(mapped: Mapped, shape: tuple[int, int], draw: torch.Generator, vocab: int) -> torch.Tensor:
    """Random token ids below `vocab`, none the padding id: a text never holds it, and M2M100 counts positions
    over the tokens that are not padding."""
    pad = mapped.config.get("pad_token_id")
    if type(pad) is not int or not 0 <= pad < vocab:
        return torch.randint(0, vocab, shape, generator=draw)
    tokens = torch.randint(0, vocab - 1, shape, generator=draw)
    return tokens + (tokens >= pad).long()


def verify_import(weights: CheckpointDir, work: Path, mapped: Mapped, say: Callable[[str], None], spec,
                  device: str | None = None) -> dict:
    """The check, of the import written in `work` (compiled as `spec`) against the checkpoint `weights` holds."""
    if not transformers_available():
        say("not verified: transformers is not installed (pip install 'xspec[hf]' to compare the import's "
            "logits with the checkpoint's own class)")
        return {"verified": False, "reason": "transformers is not installed"}
    import transformers

    length = check_length(mapped)
    from xspec.runtime.distributed import pick_device

    chosen = pick_device(device)
    draw = torch.Generator().manual_seed(0)
    encoder_only = not spec.has_decoder    # a masked LM: its logits of the tokens, one sentence padded
    # an encoder-decoder's targets are of the tokens its decoder scores (Marian's target vocabulary)
    targets = spec.logits_size if spec.has_encoder and not encoder_only else mapped.params["vocab"]
    tokens = _tokens(mapped, (2, length), draw, targets).to(chosen)
    source = None
    layers = checked = mapped.params[FAMILIES[mapped.model_type].depth]
    if spec.has_encoder:    # checked whole: an encoder alone, or a translation model (one source padded)
        if not encoder_only:
            source = _tokens(mapped, (2, length + 3), draw, mapped.params["vocab"]).to(chosen)
        if spec._compilation.validated.bytes_needed > available_memory(chosen) * 0.8:
            raise UserError(f"{work.name}: the model does not fit in memory as float32 to be checked; import with "
                            "--no-verify")
    else:   # a decoder alone: as many first layers as fit
        checked = layers_to_check(work, layers, spec._compilation.validated.bytes_needed, chosen)
    types = _pair_types(spec, tokens) if encoder_only else None
    # One model at a time: ours, then the checkpoint's own class.
    our_logits = _our_logits(work, layers, checked, tokens, source, encoder_only, types)
    hf_logits = _their_logits(weights, getattr(transformers, mapped.hf_class), checked, tokens, source, encoder_only,
                              types)
    if spec.classes is not None:    # a classifier: the scores of each text, at its first position
        our_logits = our_logits[:, 0]
    elif encoder_only:    # a padded position's output is no text's: where a local window sees only padding, nothing
        kept = ~source_padding(tokens).to(our_logits.device)
        our_logits, hf_logits = our_logits[kept], hf_logits[kept]
    difference = (our_logits - hf_logits).abs().max().item()
    scale = hf_logits.abs().max().item()
    kl = torch.nn.functional.kl_div(our_logits.log_softmax(-1), hf_logits.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1).mean().clamp(min=0).item()
    figures = {"verified": True, "positions": length, "layers": checked, "max_abs_logit_difference": difference,
               "kl": kl, "largest_logit": scale}
    counted = f"{our_logits.shape[:-1].numel()} positions (2 x {length}{', less the padding' if encoder_only else ''})"
    if spec.classes is not None:
        counted = f"2 texts of {length} tokens"
    detail = f"max |Δlogit| {difference:.3g} (logits up to {scale:.3g}), KL {kl:.3g} over {counted}"
    if checked < layers:
        detail += f", on the first {checked} of {layers} layers on both sides (the whole model does not fit in " \
                  "memory as float32)"
    if not (math.isfinite(difference) and difference <= MAX_RELATIVE_DIFFERENCE * max(1.0, scale) and kl <= MAX_KL):
        raise UserError(f"{shown(weights.path)}: the imported model's logits differ from {mapped.hf_class}'s: {detail} "
                        f"(allowed: {MAX_RELATIVE_DIFFERENCE:g} of the largest logit, KL {MAX_KL:g}); nothing written")
    say(f"verified against transformers' {mapped.hf_class}: {detail}")
    return figures
