"""TE-style modules compiled through the generated custom ops."""

from .attention import DotProductAttention
from .autocast import autocast, checkpoint, fp8_autocast, fp8_model_init, quantized_model_init
from .grouped_linear import GroupedLinear
from .layernorm import LayerNorm, RMSNorm
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear

__all__ = [
    "DotProductAttention",
    "GroupedLinear",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "RMSNorm",
    "autocast",
    "checkpoint",
    "fp8_autocast",
    "fp8_model_init",
    "quantized_model_init",
]
