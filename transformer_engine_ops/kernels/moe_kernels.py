"""A Triton kernel for the MoE permutation ops on CUDA: each token's sum over its rows.

Unpermuting (and the permute's backward) sums, for every token, the rows its routed
experts produced, weighted by the merging probabilities when given, in fp32. A token's
routed count varies (a mask map may route a token to any number of experts), so as
torch ops the sum either walks every slot (``E`` passes over the rows) or reads the
largest count on the host first (a synchronization). This kernel walks each token's
own slots, reading the count on the device: one pass, no synchronization, safe under
CUDA graphs (TE's unpermute kernel works the same way).

The ops run it for real CUDA tensors of fp32, bf16 or fp16, eagerly and, being op
nodes, compiled too: both run this kernel, so they agree bit for bit. Its bits may
differ from the torch ops' (a contracted multiply-add); tests bound the difference
against float64. The CPU, float64 and any tracing keep the torch ops.

Triton is imported lazily: this module imports fine on a CPU-only torch without it.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from . import triton_support

__all__ = ["available", "eligible", "token_sum", "unavailable_reason"]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCK = 1024  # features a program sums
WARPS = 4


@functools.cache
def unavailable_reason() -> Optional[str]:
    """Why the kernel cannot run here (None when Triton imports and the kernel builds)."""
    return triton_support.unavailable_reason(_kernels)


def available() -> bool:
    """True when Triton is importable (the kernel is built on first use)."""
    return unavailable_reason() is None


def eligible(x: torch.Tensor) -> bool:
    """Whether a sum over ``x``'s rows takes the kernel: a real CUDA tensor of fp32,
    bf16 or fp16, outside tracing."""
    if type(x) is not torch.Tensor or x.device.type != "cuda" or x.dtype not in DTYPES:
        return False
    return triton_support.launchable_here() and available()


@functools.cache
def _kernels(interpret: bool = False) -> tuple[Any]:
    from . import _moe_triton

    return _moe_triton.build(interpret)


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def token_sum(
    x: torch.Tensor,
    rows: torch.Tensor,
    counts: Optional[torch.Tensor],
    weights: Optional[torch.Tensor],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * x[rows[t, j]]`` over the slots ``j < counts[t]``
    (every slot when ``counts`` is None) whose row is not -1, added in slot order in
    fp32; ``out`` is ``[T, H]`` of ``out_dtype``. ``rows`` is ``[T, J]`` (int64),
    ``weights`` ``[T, J]`` (any float dtype) or None (each weight 1)."""
    fn = "token_sum"
    triton_support.check_runnable(fn, x.device, unavailable_reason)
    if x.dim() != 2 or rows.dim() != 2:
        raise ValueError(
            f"{fn}: x [rows, H] and rows [T, J] expected, got x {tuple(x.shape)}, rows "
            f"{tuple(rows.shape)}"
        )
    tokens, slots = rows.shape
    hidden = x.shape[1]
    out = torch.empty((tokens, hidden), dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    rows = rows.to(torch.int64).contiguous()
    counts_arg = rows if counts is None else counts.to(torch.int64).contiguous()
    weights_arg = rows if weights is None else weights.contiguous()
    block = min(BLOCK, _next_power_of_2(hidden))
    (kernel,) = _kernels(x.device.type != "cuda")
    constexprs = (
        ("HAS_COUNTS", counts is not None),
        ("HAS_WEIGHTS", weights is not None),
        ("BLOCK", block),
    )
    grid = (tokens, (hidden + block - 1) // block, 1)
    with triton_support.on_its_device(x):
        kernel(
            grid,
            (x, rows, counts_arg, weights_arg, out, hidden, slots, x.stride(0)),
            constexprs,
            num_warps=WARPS,
        )
    return out
