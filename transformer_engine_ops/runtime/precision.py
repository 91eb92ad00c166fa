"""The precision the reference kernels compute in.

TE computes in fp32 whatever the data's dtype (its kernels take fp32, bf16 and fp16).
The reference kernels do the same, except for float64 data, which they compute in
float64: widening fp32 math to it keeps ``torch.autograd.gradcheck`` usable on every
module, as it is on ``torch.nn.Linear`` and ``torch.nn.LayerNorm``.
"""

from __future__ import annotations

import torch

__all__ = ["math_dtype"]


def math_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 when any of ``dtypes`` is float64, else float32."""
    return torch.float64 if torch.float64 in dtypes else torch.float32
