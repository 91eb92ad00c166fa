"""TE's quantizer factories (``transformer_engine.pytorch.custom_recipes.
quantizer_factories``): ``CustomRecipe(qfactory=...)`` with one of these quantizes as
the built-in recipe it is named after does, for every role a ``Linear`` or
``GroupedLinear`` asks for, and is a starting point for a factory that changes some
roles::

    from transformer_engine_ops.custom_recipes.quantizer_factories import nvfp4_factory

    def factory(role):
        if role is not None and role.name == "proj":
            return te.MXFP8Quantizer()
        return nvfp4_factory(role)

    with te.autocast(recipe=te.recipe.CustomRecipe(qfactory=factory)):
        ...
"""

from __future__ import annotations

from typing import Optional

import torch

from ..constants import DType
from ..quantization.float8 import Float8CurrentScalingQuantizer
from ..quantization.float8_block import Float8BlockQuantizer
from ..quantization.mxfp8 import MXFP8Quantizer
from ..quantization.nvfp4 import NVFP4Quantizer
from ..quantization.recipes import (
    DelayedScalingRequest,
    Format,
    IdentityQuantizer,
    QuantizerRole,
)

__all__ = [
    "current_scaling_factory",
    "delayed_scaling_factory",
    "float8_block_scaling_factory",
    "high_precision_factory",
    "mxfp8_factory",
    "nvfp4_factory",
]


def _linear(role: Optional[QuantizerRole], tensor_type: str) -> bool:
    """Whether ``role`` is a ``Linear``/``GroupedLinear`` slot of ``tensor_type``."""
    return (
        role is not None
        and role.module_type in ("linear", "grouped_linear")
        and role.tensor_type == tensor_type
    )


def high_precision_factory(role: Optional[QuantizerRole]) -> IdentityQuantizer:
    """Every slot in high precision (TE's ``IdentityQuantizer``): the GEMMs run as
    without a recipe."""
    del role
    return IdentityQuantizer()


def delayed_scaling_factory(role: Optional[QuantizerRole]) -> DelayedScalingRequest:
    """``DelayedScaling()``'s defaults: every slot a delayed-scaling request (HYBRID:
    E4M3 forward, E5M2 backward; an amax history of 1024), which each module answers
    with its own state."""
    del role
    return DelayedScalingRequest(fp8_format=Format.HYBRID)


def current_scaling_factory(role: Optional[QuantizerRole]) -> Float8CurrentScalingQuantizer:
    """``Float8CurrentScaling()``'s defaults: E4M3, E5M2 for the output gradient."""
    backward = role is not None and role.tensor_type == "grad_output"
    return Float8CurrentScalingQuantizer(
        fp8_dtype=DType.kFloat8E5M2 if backward else DType.kFloat8E4M3,
        device=torch.device("cuda"),
        force_pow_2_scales=False,
        amax_epsilon=0.0,
    )


def float8_block_scaling_factory(role: Optional[QuantizerRole]) -> Float8BlockQuantizer:
    """``Float8BlockScaling()``'s defaults: E4M3, power-of-2 scales, 128x128 blocks for
    a Linear's or GroupedLinear's weight and 1x128 blocks otherwise."""
    return Float8BlockQuantizer(
        fp8_dtype=DType.kFloat8E4M3,
        rowwise=True,
        columnwise=True,
        amax_epsilon=0.0,
        force_pow_2_scales=True,
        block_scaling_dim=2 if _linear(role, "weight") else 1,
    )


def mxfp8_factory(role: Optional[QuantizerRole]) -> MXFP8Quantizer:
    """``MXFP8BlockScaling()``'s defaults: E4M3 blocks of 32 with E8M0 scales."""
    del role
    return MXFP8Quantizer(fp8_dtype=DType.kFloat8E4M3)


def nvfp4_factory(role: Optional[QuantizerRole]) -> NVFP4Quantizer:
    """``NVFP4BlockScaling()``'s defaults for a Linear's or GroupedLinear's roles: the
    weight in 16x16 blocks; the output gradient with the random Hadamard transform (of
    its columnwise data) and stochastic rounding; every other slot with the transform."""
    if _linear(role, "weight"):
        return NVFP4Quantizer(
            fp4_dtype=DType.kFloat4E2M1,
            with_rht=False,
            with_post_rht_amax=False,
            with_2d_quantization=True,
            stochastic_rounding=False,
            with_random_sign_mask=True,
        )
    return NVFP4Quantizer(
        fp4_dtype=DType.kFloat4E2M1,
        with_rht=True,
        with_post_rht_amax=True,
        with_2d_quantization=False,
        stochastic_rounding=_linear(role, "grad_output"),
        with_random_sign_mask=True,
    )
