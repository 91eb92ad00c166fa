"""TE-style modules compiled through the generated custom ops."""

from .attention import DotProductAttention
from .autocast import autocast, checkpoint, fp8_autocast, fp8_model_init, quantized_model_init
from .grouped_linear import GroupedLinear
from .inference import InferenceParams
from .layernorm import LayerNorm, RMSNorm
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .multi_head_attention import MultiheadAttention
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb
from .transformer import TransformerLayer

__all__ = [
    "DotProductAttention",
    "GroupedLinear",
    "InferenceParams",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "MultiheadAttention",
    "RMSNorm",
    "RotaryPositionEmbedding",
    "TransformerLayer",
    "apply_rotary_pos_emb",
    "autocast",
    "checkpoint",
    "fp8_autocast",
    "fp8_model_init",
    "quantized_model_init",
]
