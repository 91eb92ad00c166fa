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
    from ._exports import *  # noqa: F403  (generated from _EXPORTS by `make codegen`)

# The one list of public names: name -> the module that defines it, relative to this
# package ("." for a subpackage of that name); "modules.Name" is exported by `modules` only
# (TE has no such top-level name). `__all__` follows from it here; `make codegen`
# writes from it `_exports.py` (the names as imports, for type checkers) and
# `modules/__init__.py`. Add a public name here, then run `make codegen`.
_EXPORTS = {
    "DType": ".constants",
    "DelayedScalingRequest": ".quantization.recipes",
    "DotProductAttention": ".modules.attention",
    "Float8BlockQuantizer": ".quantization.float8_block",
    "Float8BlockwiseQTensor": ".quantization.float8_block",
    "Float8BlockwiseQTensorStorage": ".quantization.float8_block",
    "Float8CurrentScalingQuantizer": ".quantization.float8",
    "Float8Quantizer": ".quantization.float8",
    "Float8Tensor": ".quantization.float8",
    "Float8TensorStorage": ".quantization.float8",
    "Fp8Padding": ".modules.moe",
    "Fp8Unpadding": ".modules.moe",
    "GroupedLinear": ".modules.grouped_linear",
    "IdentityQuantizer": ".quantization.recipes",
    "InferenceParams": ".modules.inference",
    "LayerNorm": ".modules.layernorm",
    "LayerNormLinear": ".modules.layernorm_linear",
    "LayerNormMLP": ".modules.layernorm_mlp",
    "Linear": ".modules.linear",
    "MultiheadAttention": ".modules.multi_head_attention",
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
    "RMSNorm": ".modules.layernorm",
    "RotaryPositionEmbedding": ".modules.rope",
    "TransformerLayer": ".modules.transformer",
    "apply_rotary_pos_emb": ".modules.rope",
    "autocast": ".modules.autocast",
    "checkpoint": ".modules.autocast",
    "custom_recipes": ".",
    "fp8_autocast": ".modules.autocast",
    "fp8_model_init": ".modules.autocast",
    "get_default_recipe": ".quantization.availability",
    "get_device_compute_capability": ".quantization.availability",
    "inductor_backend": ".runtime.lowering",
    "make_graphed_callables": ".graph",
    "modules.L2Normalization": ".modules.l2normalization",
    "is_bf16_available": ".quantization.availability",
    "is_fp8_available": ".quantization.availability",
    "is_fp8_block_scaling_available": ".quantization.availability",
    "is_mxfp8_available": ".quantization.availability",
    "is_nvfp4_available": ".quantization.availability",
    "moe_permute": ".modules.moe",
    "moe_permute_and_pad_with_probs": ".modules.moe",
    "moe_permute_with_probs": ".modules.moe",
    "moe_sort_chunks_by_index": ".modules.moe",
    "moe_sort_chunks_by_index_with_probs": ".modules.moe",
    "moe_unpermute": ".modules.moe",
    "quantized_model_init": ".modules.autocast",
    "recipe": ".",
}

__all__ = sorted(name for name in _EXPORTS if "." not in name)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None or "." in name:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module == ".":  # a subpackage: `from . import recipe`
        value = importlib.import_module(f".{name}", __name__)
    else:
        value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
