"""What the runtime may ask of a model and its modules, as types: decoding loops, the training
step and the load-balancing loss check `isinstance(module, RoutedMixture)` instead of probing
attributes by name. The protocols are of methods, so a hand-written model meets one by having
them; the op library's modules meet them by construction."""

from typing import Optional, Protocol, runtime_checkable

import torch
import torch.nn as nn


@runtime_checkable
class DecodingCache(Protocol):
    """What a model's modules read and write of the cache a forward passes them (runtime/cache.py):
    where positions start, keys and values kept per attention, an encoder memory's projections, a
    recurrent layer's state, which packed document each position is of (None: one each row), where
    prompts of different lengths are padded on the left each row's positions (else None), the
    positions of the keys an attention of a window is handed, and those its queries may see
    besides what causality and windows hide: not a padding's, none of another packed document
    (None: all)."""

    length: int
    memory: dict
    documents: Optional[torch.Tensor]

    def append(self, module: nn.Module, k: torch.Tensor, v: torch.Tensor,
               window: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def row_positions(self, new: int) -> Optional[torch.Tensor]: ...

    def key_positions(self, window: Optional[int], new: int,
                      device: torch.device) -> torch.Tensor: ...

    def kept_keys(self, window: Optional[int], new: int) -> Optional[torch.Tensor]: ...

    def state(self, module: nn.Module) -> Optional[tuple[torch.Tensor, ...]]: ...

    def keep(self, module: nn.Module, *tensors: torch.Tensor) -> None: ...


@runtime_checkable
class CacheOwner(Protocol):
    """A model that decodes with a cache of its own rather than the runtime's DecoderCache."""

    def new_cache(self) -> DecodingCache: ...


@runtime_checkable
class CachedDecoder(Protocol):
    """A model that decodes new tokens against a cache: [B, T] tokens -> [B, T, vocab] logits."""

    def decode(self, tgt_tokens: torch.Tensor, *args: torch.Tensor,
               cache: Optional[DecodingCache] = None) -> torch.Tensor: ...


@runtime_checkable
class RoutedMixture(Protocol):
    """A mixture of experts that keeps what its last forward routed, for balancing its experts."""

    def last_routing(self) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """The chosen experts [N, top_k] and the router's probabilities [N, experts]; None
        before a forward."""
        ...

    def load_correction(self) -> Optional[torch.Tensor]:
        """The router's per-expert bias that training moves against the load (DeepSeek-V3), or
        None."""
        ...


@runtime_checkable
class RecurrentMixer(Protocol):
    """A mixer that decodes by carrying one state forward (not one entry per position), so a
    cache cannot be set back to an earlier length."""

    def recurrent(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class ReadsWeightsAsMatrices(Protocol):
    """A module that reads some of its linear layers' weights directly, as matrices (latent
    attention's up-projection while decoding): a weight format must keep those layers as they
    are."""

    weights_read: tuple[str, ...]


class MultiTokenPrediction(nn.ModuleList):
    """A language model's multi-token prediction modules, one per depth (DeepSeek-V3 §2.2):
    depth k predicts the token k + 1 positions on."""


@runtime_checkable
class TiesWeights(Protocol):
    """A model whose modules share tensors (a generated model whose spec ties them):
    `tie_weights()` makes them one, as its constructor does (transformers' name)."""

    def tie_weights(self) -> None: ...


@runtime_checkable
class InitializesWeights(Protocol):
    """A model that sets every tensor as its constructors do (a generated model's `init_weights()`,
    torchtitan's name), for a model built on the meta device and given memory."""

    def init_weights(self) -> None: ...


@runtime_checkable
class Resettable(Protocol):
    """A module that sets its own tensors (not its children's) as its constructor does: torch's
    modules and the library's (initialize.py)."""

    def reset_parameters(self) -> None: ...
