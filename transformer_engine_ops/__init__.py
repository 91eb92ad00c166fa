"""Transformer Engine style modules under ``torch.compile(fullgraph=True)``.

Use it as TE is used: ``import transformer_engine_ops as te``; ``te.Linear``,
``te.LayerNormLinear``, ``te.LayerNormMLP``, ``te.GroupedLinear``, ``te.MultiheadAttention``,
``te.TransformerLayer``, ``te.InferenceParams``, ``te.RotaryPositionEmbedding``, ``te.apply_rotary_pos_emb``, ``te.LayerNorm``, ``te.RMSNorm``,
``te.autocast``, ``te.checkpoint``, TE's MoE helpers (``te.moe_permute``,
``te.moe_unpermute``, ``te.moe_sort_chunks_by_index``, ``te.Fp8Padding``, ... and the
fused router functions in ``transformer_engine_ops.router``), ``te.quantized_model_init`` (and their deprecated TE names
``te.fp8_autocast``, ``te.fp8_model_init``), the recipes in ``te.recipe`` and the factories
for its ``CustomRecipe`` in ``te.custom_recipes``, TE's
availability queries (``te.is_fp8_available``, ...), ``te.DType``, and the quantized
tensor and quantizer classes.

The names resolve on first use (PEP 562): importing a subpackage
(``transformer_engine_ops.generated.linear``, ``...quantization``) does not import the
modules and, through them, torch's compiler stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import custom_recipes, recipe
    from .constants import (
        DType,
    )
    from .graph import (
        make_graphed_callables,
    )
    from .modules import (
        DotProductAttention,
        Fp8Padding,
        Fp8Unpadding,
        GroupedLinear,
        InferenceParams,
        LayerNorm,
        LayerNormLinear,
        LayerNormMLP,
        Linear,
        MultiheadAttention,
        RMSNorm,
        RotaryPositionEmbedding,
        TransformerLayer,
        apply_rotary_pos_emb,
        autocast,
        checkpoint,
        fp8_autocast,
        fp8_model_init,
        moe_permute,
        moe_permute_and_pad_with_probs,
        moe_permute_with_probs,
        moe_sort_chunks_by_index,
        moe_sort_chunks_by_index_with_probs,
        moe_unpermute,
        quantized_model_init,
    )
    from .quantization.availability import (
        get_default_recipe,
        get_device_compute_capability,
        is_bf16_available,
        is_fp8_available,
        is_fp8_block_scaling_available,
        is_mxfp8_available,
        is_nvfp4_available,
    )
    from .quantization.float8 import (
        Float8CurrentScalingQuantizer,
        Float8Quantizer,
        Float8Tensor,
        Float8TensorStorage,
    )
    from .quantization.float8_block import (
        Float8BlockQuantizer,
        Float8BlockwiseQTensor,
        Float8BlockwiseQTensorStorage,
    )
    from .quantization.mxfp8 import (
        MXFP8Quantizer,
        MXFP8Tensor,
        MXFP8TensorStorage,
    )
    from .quantization.nvfp4 import (
        NVFP4Quantizer,
        NVFP4Tensor,
        NVFP4TensorStorage,
    )
    from .quantization.quantizer import (
        QuantizedTensor,
        Quantizer,
    )
    from .quantization.recipes import (
        DelayedScalingRequest,
        IdentityQuantizer,
        QuantizerRequest,
        QuantizerRole,
    )
    from .runtime.lowering import (
        inductor_backend,
    )

# public name -> the module that defines it
_EXPORTS = {
    "DType": ".constants",
    "DelayedScalingRequest": ".quantization.recipes",
    "DotProductAttention": ".modules",
    "Float8BlockQuantizer": ".quantization.float8_block",
    "Float8BlockwiseQTensor": ".quantization.float8_block",
    "Float8BlockwiseQTensorStorage": ".quantization.float8_block",
    "Float8CurrentScalingQuantizer": ".quantization.float8",
    "Float8Quantizer": ".quantization.float8",
    "Float8Tensor": ".quantization.float8",
    "Float8TensorStorage": ".quantization.float8",
    "Fp8Padding": ".modules",
    "Fp8Unpadding": ".modules",
    "GroupedLinear": ".modules",
    "IdentityQuantizer": ".quantization.recipes",
    "InferenceParams": ".modules",
    "LayerNorm": ".modules",
    "LayerNormLinear": ".modules",
    "LayerNormMLP": ".modules",
    "Linear": ".modules",
    "MultiheadAttention": ".modules",
    "MXFP8Quantizer": ".quantization.mxfp8",
    "MXFP8Tensor": ".quantization.mxfp8",
    "MXFP8TensorStorage": ".quantization.mxfp8",
    "NVFP4Quantizer": ".quantization.nvfp4",
    "NVFP4Tensor": ".quantization.nvfp4",
    "NVFP4TensorStorage": ".quantization.nvfp4",
    "QuantizedTensor": ".quantization.quantizer",
    "Quantizer": ".quantization.quantizer",
    "QuantizerRequest": ".quantization.recipes",
    "QuantizerRole": ".quantization.recipes",
    "RMSNorm": ".modules",
    "RotaryPositionEmbedding": ".modules",
    "TransformerLayer": ".modules",
    "apply_rotary_pos_emb": ".modules",
    "autocast": ".modules",
    "checkpoint": ".modules",
    "fp8_autocast": ".modules",
    "fp8_model_init": ".modules",
    "get_default_recipe": ".quantization.availability",
    "get_device_compute_capability": ".quantization.availability",
    "inductor_backend": ".runtime.lowering",
    "make_graphed_callables": ".graph",
    "is_bf16_available": ".quantization.availability",
    "is_fp8_available": ".quantization.availability",
    "is_fp8_block_scaling_available": ".quantization.availability",
    "is_mxfp8_available": ".quantization.availability",
    "is_nvfp4_available": ".quantization.availability",
    "moe_permute": ".modules",
    "moe_permute_and_pad_with_probs": ".modules",
    "moe_permute_with_probs": ".modules",
    "moe_sort_chunks_by_index": ".modules",
    "moe_sort_chunks_by_index_with_probs": ".modules",
    "moe_unpermute": ".modules",
    "quantized_model_init": ".modules",
}

__all__ = [
    "DType",
    "DelayedScalingRequest",
    "DotProductAttention",
    "Float8BlockQuantizer",
    "Float8BlockwiseQTensor",
    "Float8BlockwiseQTensorStorage",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "Float8TensorStorage",
    "Fp8Padding",
    "Fp8Unpadding",
    "GroupedLinear",
    "IdentityQuantizer",
    "InferenceParams",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "MultiheadAttention",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "MXFP8TensorStorage",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "NVFP4TensorStorage",
    "QuantizedTensor",
    "Quantizer",
    "QuantizerRequest",
    "QuantizerRole",
    "RMSNorm",
    "RotaryPositionEmbedding",
    "TransformerLayer",
    "apply_rotary_pos_emb",
    "autocast",
    "checkpoint",
    "custom_recipes",
    "fp8_autocast",
    "fp8_model_init",
    "get_default_recipe",
    "get_device_compute_capability",
    "inductor_backend",
    "is_bf16_available",
    "is_fp8_available",
    "is_fp8_block_scaling_available",
    "is_mxfp8_available",
    "is_nvfp4_available",
    "make_graphed_callables",
    "moe_permute",
    "moe_permute_and_pad_with_probs",
    "moe_permute_with_probs",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
    "moe_unpermute",
    "quantized_model_init",
    "recipe",
]


def __getattr__(name: str) -> Any:
    if name in ("recipe", "custom_recipes"):
        return importlib.import_module(f".{name}", __name__)
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
