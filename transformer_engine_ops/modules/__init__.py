"""TE-style modules compiled through the generated custom ops."""

from .attention import DotProductAttention
from .autocast import autocast, checkpoint, fp8_autocast, fp8_model_init, quantized_model_init
from .grouped_linear import GroupedLinear
from .inference import InferenceParams
from .l2normalization import L2Normalization
from .layernorm import LayerNorm, RMSNorm
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .moe import (
    Fp8Padding,
    Fp8Unpadding,
    moe_permute,
    moe_permute_and_pad_with_probs,
    moe_permute_with_probs,
    moe_sort_chunks_by_index,
    moe_sort_chunks_by_index_with_probs,
    moe_unpermute,
)
from .multi_head_attention import MultiheadAttention
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb
from .transformer import TransformerLayer

__all__ = [
    "DotProductAttention",
    "Fp8Padding",
    "Fp8Unpadding",
    "GroupedLinear",
    "InferenceParams",
    "L2Normalization",
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
    "moe_permute",
    "moe_permute_and_pad_with_probs",
    "moe_permute_with_probs",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
    "moe_unpermute",
    "quantized_model_init",
]
