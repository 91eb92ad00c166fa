"""Recipes, named and configured as TE users know them, each making its quantizers.

A recipe is a frozen configuration; ``make_quantizer(role)`` returns the quantizer TE
would use for a tensor in that role of a Linear: forward roles ``input``, ``weight``,
``output`` and backward roles ``grad_output``, ``grad_input``, ``grad_weight``.
"""

from __future__ import annotations

import dataclasses
import enum

import torch

from ..runtime.quantizer import Quantizer
from .float8 import Float8CurrentScalingQuantizer, Float8Quantizer
from .float8_block import Float8BlockQuantizer
from .mxfp8 import MXFP8Quantizer
from .nvfp4 import NVFP4Quantizer

__all__ = [
    "ROLES",
    "DelayedScaling",
    "Float8BlockScaling",
    "Float8CurrentScaling",
    "Format",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
    "Recipe",
]

FORWARD_ROLES = ("input", "weight", "output")
BACKWARD_ROLES = ("grad_output", "grad_input", "grad_weight")
ROLES = FORWARD_ROLES + BACKWARD_ROLES


class Format(enum.Enum):
    """FP8 formats per direction: E4M3 both ways, E5M2 both ways, or HYBRID
    (E4M3 forward, E5M2 for gradients)."""

    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"

    def dtype_for(self, role: str) -> torch.dtype:
        backward = _check_role(role) in BACKWARD_ROLES
        if self is Format.E5M2 or (self is Format.HYBRID and backward):
            return torch.float8_e5m2
        return torch.float8_e4m3fn


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown quantizer role {role!r}; expected one of {ROLES}")
    return role


class Recipe:
    """Base of all recipes."""

    def make_quantizer(self, role: str) -> Quantizer:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class DelayedScaling(Recipe):
    """Per-tensor FP8 with scales from an amax history: stateful, so never value-opaque."""

    fp8_format: Format = Format.HYBRID
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"

    def make_quantizer(self, role: str) -> Quantizer:
        return Float8Quantizer(
            fp8_dtype=self.fp8_format.dtype_for(role),
            margin=self.margin,
            amax_history_len=self.amax_history_len,
            amax_compute_algo=self.amax_compute_algo,
        )


@dataclasses.dataclass(frozen=True)
class Float8CurrentScaling(Recipe):
    """Per-tensor FP8 with the scale from each tensor's own amax."""

    fp8_format: Format = Format.HYBRID
    force_pow_2_scales: bool = False
    amax_epsilon: float = 0.0

    def make_quantizer(self, role: str) -> Quantizer:
        return Float8CurrentScalingQuantizer(
            fp8_dtype=self.fp8_format.dtype_for(role),
            force_pow_2_scales=self.force_pow_2_scales,
            amax_epsilon=self.amax_epsilon,
        )


@dataclasses.dataclass(frozen=True)
class MXFP8BlockScaling(Recipe):
    """MXFP8: 32-element blocks with E8M0 scales; E4M3 everywhere by default."""

    fp8_format: Format = Format.E4M3

    def make_quantizer(self, role: str) -> Quantizer:
        return MXFP8Quantizer(fp8_dtype=self.fp8_format.dtype_for(role))


@dataclasses.dataclass(frozen=True)
class NVFP4BlockScaling(Recipe):
    """NVFP4 everywhere; weights use 16x16 (2-D) blocks unless disabled."""

    disable_2d_quantization: bool = False

    def make_quantizer(self, role: str) -> Quantizer:
        two_d = _check_role(role) == "weight" and not self.disable_2d_quantization
        return NVFP4Quantizer(with_2d_quantization=two_d)


@dataclasses.dataclass(frozen=True)
class Float8BlockScaling(Recipe):
    """FP8 block scaling: 128x128 blocks for weights, 1x128 for activations and grads."""

    fp8_format: Format = Format.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    block_len: int = 128
    force_pow_2_scales: bool = True
    amax_epsilon: float = 0.0

    def make_quantizer(self, role: str) -> Quantizer:
        if _check_role(role) == "weight":
            dim = self.w_block_scaling_dim
        elif role in BACKWARD_ROLES:
            dim = self.grad_block_scaling_dim
        else:
            dim = self.x_block_scaling_dim
        return Float8BlockQuantizer(
            fp8_dtype=self.fp8_format.dtype_for(role),
            block_len=self.block_len,
            block_scaling_dim=dim,
            force_pow_2_scales=self.force_pow_2_scales,
            amax_epsilon=self.amax_epsilon,
        )
