"""The op library of generated models: small modules, one per option a spec may choose, that
every generated `model.py` imports from here (`from xspec.nn import Attention`), as
torchtitan's models import their shared modules. `xspec compile --standalone` copies the classes
a spec uses into its file instead, so that it depends on torch alone.

Each class is plain PyTorch a reader can follow, and builds none of the others: the generated
code builds the parts a module takes (an attention's norms and rotary embedding) and passes them
in. The files: embeddings.py (token embeddings, positions), norms.py, gating.py (a gated
linear unit over one projection), pooling.py (a text's mean state), rotary.py (one class per rotary
scaling), attention.py (the paper's attention, its options as parts), latent_attention.py (DeepSeek's
multi-head latent attention), convolution.py, delta_rule.py and state_space.py (the recurrent mixers of
hybrid models, Gated DeltaNet and Mamba-2, and the short convolution they share), experts.py (the
mixture of experts: routers, activations, the experts), contracts.py (what the runtime may ask of a
model and its modules, as protocols, and the list of multi-token prediction depths)."""

from .embeddings import (Embedding, FairseqSinusoidalPositions, LearnedPositions, OffsetLearnedPositions,
                         PositionTable, RelativePositionBias, ScaledEmbedding, SinusoidalPositions,
                         SinusoidalPositionsInHalves, TokenTypeEmbedding)
from .norms import RMSNorm
from .gating import GLU, Activation
from .pooling import MeanPool
from .rotary import LinearRotaryEmbedding, Llama3RotaryEmbedding, RotaryEmbedding, YarnRotaryEmbedding
from .attention import Attention, AttentionMask, WrittenOutAttention
from .latent_attention import LatentAttention
from .convolution import ConvolvedMixer, ShortConvolution
from .delta_rule import GatedDeltaNet
from .state_space import GroupRMSNorm, Mamba2Mixer
from .experts import (BiasedExperts, BiasedMixtureOfExperts, ClampedSwiGLU, Experts, GeGLU, GroupedExperts,
                      MixtureOfExperts, Router, SwiGLU, TopKRouter)
from .contracts import (CachedDecoder, CacheOwner, DecodingCache, InitializesWeights, MultiTokenPrediction,
                        ReadsWeightsAsMatrices, RecurrentMixer, Resettable, RoutedMixture,
                        TiesWeights)

__all__ = [
    "Embedding", "ScaledEmbedding", "PositionTable", "SinusoidalPositions", "SinusoidalPositionsInHalves",
    "LearnedPositions",
    "OffsetLearnedPositions", "FairseqSinusoidalPositions", "RelativePositionBias",
    "TokenTypeEmbedding",
    "RMSNorm", "GLU", "Activation", "MeanPool",
    "RotaryEmbedding", "LinearRotaryEmbedding", "Llama3RotaryEmbedding",
    "YarnRotaryEmbedding",
    "Attention", "AttentionMask", "WrittenOutAttention",
    "LatentAttention",
    "ConvolvedMixer", "ShortConvolution", "GatedDeltaNet", "GroupRMSNorm", "Mamba2Mixer",
    "Router", "TopKRouter", "GroupedExperts", "Experts", "BiasedExperts",
    "SwiGLU", "GeGLU", "ClampedSwiGLU",
    "MixtureOfExperts", "BiasedMixtureOfExperts",
    "DecodingCache", "CacheOwner", "CachedDecoder", "RoutedMixture", "RecurrentMixer",
    "ReadsWeightsAsMatrices", "Resettable", "TiesWeights", "InitializesWeights", "MultiTokenPrediction",
]
