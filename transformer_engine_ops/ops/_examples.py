"""What the ops' example bundles share (``lowering.examples``: the bundles
``tests/runtime/lowering_check.py`` compiles to check each lowering against eager).

A helper beside the op modules: it declares no op, so the generator writes nothing for
it. Every value is made from a fixed seed, so two calls give equal bundles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from transformer_engine_ops.quantization.stochastic import (
    RNG_STATE_DTYPE,
    uses_stochastic_rounding,
)
from transformer_engine_ops.runtime.values import GemmConfig

# A GEMM op's quantizer roles, each the bundle field ``<prefix><role>_quantizer``.
GEMM_ROLES = ("input", "weight", "output", "grad_input", "grad_weight", "grad_output")
# The dtypes every example is made in: fp32 too, where no rounding to 16 bits hides a
# reduction computed in another order.
DTYPES = (torch.bfloat16, torch.float32)


def quantizer_fields(recipe: Any, prefix: str = "") -> dict[str, Any]:
    """``<prefix><role>_quantizer`` of every GEMM role: the recipe's, or None."""
    return {
        f"{prefix}{role}_quantizer": recipe.make_quantizer(role) if recipe else None
        for role in GEMM_ROLES
    }


def gemm_fields(recipe: Any) -> dict[str, Any]:
    """``fp8`` and the three GEMM configurations (the defaults)."""
    return {
        "fp8": recipe is not None,
        "fprop_gemm": GemmConfig(),
        "dgrad_gemm": GemmConfig(),
        "wgrad_gemm": GemmConfig(),
    }


def rng_state(fields: dict[str, Any], device: torch.device) -> torch.Tensor | None:
    """A fixed ``sr_rng_state`` (seed, offset) where a quantizer among ``fields`` rounds
    stochastically (a module draws one per call; a fixed one gives eager and compiled
    runs the same bits), else None."""
    if any(uses_stochastic_rounding(q) for q in fields.values()):
        return torch.tensor([1234, 0], dtype=RNG_STATE_DTYPE, device=device)
    return None


def random_tensors(
    seed: int, dtype: torch.dtype, device: torch.device
) -> Callable[..., torch.Tensor]:
    """``make(*shape)``: seeded normal tensors of ``dtype`` on ``device``, requiring grad."""
    gen = torch.Generator().manual_seed(seed)

    def make(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(device, dtype).requires_grad_(True)

    return make
