"""Shared quantizer cases and documented error bounds for the quantization tests."""

from __future__ import annotations

import torch

from transformer_engine_ops.quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from transformer_engine_ops.quantization.quantizer import Quantizer

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
# Round-to-nearest relative error and half the subnormal spacing, per FP8 element format.
FP8_REL = {E4M3: 2.0**-4, E5M2: 2.0**-3}
FP8_SUBNORMAL_HALF_STEP = {E4M3: 2.0**-10, E5M2: 2.0**-17}
FP32_SLACK = 1e-6

# Stateless quantizers of every format (delayed scaling is tested on its own).
QUANTIZERS: dict[str, Quantizer] = {
    "fp8_current_e4m3": Float8CurrentScalingQuantizer(),
    "fp8_current_e5m2_pow2": Float8CurrentScalingQuantizer(fp8_dtype=E5M2, force_pow_2_scales=True),
    "mxfp8_e4m3": MXFP8Quantizer(),
    "mxfp8_e5m2": MXFP8Quantizer(fp8_dtype=E5M2),
    "nvfp4_1d": NVFP4Quantizer(),
    "nvfp4_2d": NVFP4Quantizer(with_2d_quantization=True),
    "fp8_block_1d": Float8BlockQuantizer(block_scaling_dim=1),
    "fp8_block_2d": Float8BlockQuantizer(block_scaling_dim=2),
    "fp8_block_1d_fp32_scales": Float8BlockQuantizer(
        block_len=16, block_scaling_dim=1, force_pow_2_scales=False
    ),
}

# Shapes every format takes with both usages (MXFP8 needs M and K multiples of 32).
COMMON_SHAPES = [(32, 64), (2, 16, 96), (0, 64), (64, 32)]
# Shapes that are not block multiples, for the formats that allow them.
RAGGED_SHAPES = {
    "nvfp4_1d": [(6, 40), (3, 2, 18)],
    "nvfp4_2d": [(6, 40), (18, 34)],
    "fp8_block_1d": [(5, 130), (3, 7, 200)],
    "fp8_block_2d": [(130, 5), (3, 7, 200)],
    "fp8_block_1d_fp32_scales": [(5, 33)],
    "fp8_current_e4m3": [(7,), (3, 5, 7)],
    "fp8_current_e5m2_pow2": [(1, 1), (5, 3)],
    "mxfp8_e4m3": [(3, 64)],  # rowwise only: M is free
    "mxfp8_e5m2": [(3, 64)],
}


def finite_amax(x: torch.Tensor) -> float:
    x = x.float()
    finite = x[torch.isfinite(x)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def error_bound(q: Quantizer, x: torch.Tensor) -> torch.Tensor:
    """Documented elementwise bound on |dequantize(quantize(x)) - x| (finite x)."""
    x = x.float()
    amax = finite_amax(x)
    if isinstance(q, NVFP4Quantizer):
        return x.abs() / 4 + 0.046 * amax + FP32_SLACK * x.abs()
    fp8 = q.fp8_dtype
    largest_scale_inv = 2.0 * amax / FP8_MAX[fp8]  # pow-2 / E8M0 scales at most double it
    return (
        FP8_REL[fp8] * x.abs()
        + FP8_SUBNORMAL_HALF_STEP[fp8] * largest_scale_inv
        + FP32_SLACK * x.abs()
    )


def usable_for(q: Quantizer, shape: tuple[int, ...]) -> Quantizer:
    """MXFP8 ragged shapes are only valid rowwise."""
    if isinstance(q, MXFP8Quantizer) and shape and (torch.Size(shape).numel() // shape[-1]) % 32:
        return q.with_usage(columnwise=False)
    return q


def random_input(shape: tuple[int, ...], seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g))
    return x.to(dtype)
