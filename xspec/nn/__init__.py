"""The op library of generated models: small modules, one per option a spec may choose, that
every generated `model.py` imports from here (`from xspec.nn import RotaryAttention`), as
torchtitan's models import their shared modules. `xspec compile --standalone` copies the classes
a spec uses into its file instead, so that it depends on torch alone.

Each class is plain PyTorch a reader can follow; an attention with several options is a class of
the generated file that lists its pieces as bases. The files: embeddings.py (token embeddings,
positions), norms.py, rotary.py (one class per rotary scaling), attention.py (the paper's
attention and one piece per option), latent_attention.py (DeepSeek's multi-head latent
attention), convolution.py, delta_rule.py and state_space.py (the recurrent mixers of hybrid
models, Gated DeltaNet and Mamba-2, and the short convolution they share), experts.py (the
mixture of experts: routers, activations, the experts), contracts.py (what the runtime may ask
of a model and its modules, as protocols, and the list of multi-token prediction depths)."""

from .embeddings import Embedding, LearnedPositions, ScaledEmbedding, SinusoidalPositions
from .norms import RMSNorm
from .rotary import (LinearRotaryEmbedding, Llama3RotaryEmbedding, PartialRotaryEmbedding,
                     RotaryEmbedding, YarnRotaryEmbedding)
from .attention import (ALiBiAttention, CrossAttention, DropoutAttention, ExplicitAttention,
                        GatedAttention, MultiHeadAttention, ProjectionQKNormAttention,
                        QKNormAttention, RotaryAttention, ScaledAttention, SinkAttention,
                        SlidingWindowAttention, SoftCapAttention)
from .latent_attention import LatentAttention, LowRankProjection
from .convolution import ConvolvedMixer, ShortConvolution
from .delta_rule import GatedDeltaNet
from .state_space import GroupRMSNorm, Mamba2Mixer
from .experts import BiasedMixtureOfExperts, ClampedSwiGLU, GeGLU, MixtureOfExperts, Router, SwiGLU
from .contracts import (CachedDecoder, CacheOwner, DecodingCache, MultiTokenPrediction,
                        ReadsWeightsAsMatrices, RecurrentMixer, Resettable, RoutedMixture)

__all__ = [
    "Embedding", "ScaledEmbedding", "SinusoidalPositions", "LearnedPositions", "RMSNorm",
    "RotaryEmbedding", "PartialRotaryEmbedding", "LinearRotaryEmbedding", "Llama3RotaryEmbedding",
    "YarnRotaryEmbedding",
    "MultiHeadAttention", "CrossAttention", "RotaryAttention", "QKNormAttention",
    "ProjectionQKNormAttention", "ScaledAttention", "DropoutAttention", "SlidingWindowAttention",
    "ALiBiAttention", "ExplicitAttention", "SoftCapAttention", "SinkAttention", "GatedAttention",
    "LatentAttention", "LowRankProjection",
    "ConvolvedMixer", "ShortConvolution", "GatedDeltaNet", "GroupRMSNorm", "Mamba2Mixer",
    "Router",
    "SwiGLU", "GeGLU", "ClampedSwiGLU",
    "MixtureOfExperts", "BiasedMixtureOfExperts",
    "DecodingCache", "CacheOwner", "CachedDecoder", "RoutedMixture", "RecurrentMixer",
    "ReadsWeightsAsMatrices", "Resettable", "MultiTokenPrediction",
]
