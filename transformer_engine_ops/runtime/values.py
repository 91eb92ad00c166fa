"""Plain configuration values that cross an op boundary in a typed value slot.

A value type is an immutable, hashable dataclass; it crosses as its canonical text
(runtime/codec.py), a constant string that torch.compile guards on, so changing it
recompiles and an equal value re-created does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import codec


@codec.register
@dataclass(frozen=True)
class GemmConfig:
    """How one GEMM of a module runs.

    ``use_split_accumulator`` asks FP8 GEMMs on CUDA for full-precision
    accumulation (``torch._scaled_mm(use_fast_accum=False)``); the dequantizing
    CPU path always accumulates in fp32.
    """

    use_split_accumulator: bool = True

    def __post_init__(self) -> None:
        codec.code_of(self)


@codec.register
@dataclass(frozen=True)
class ClampedSwiGLUParams:
    """TE's ``activation_params`` of ``activation="clamped_swiglu"`` (GPT-OSS's SwiGLU),
    with TE's defaults: the gate half is clamped above at ``limit`` and the linear half
    to ``[-limit, limit]``; ``y = g * sigmoid(alpha * g) * (l + glu_linear_offset)``."""

    limit: float = 7.0
    alpha: float = 1.702
    glu_linear_offset: float = 1.0

    def __post_init__(self) -> None:
        for name in ("limit", "alpha", "glu_linear_offset"):
            value = getattr(self, name)
            if type(value) is int:
                object.__setattr__(self, name, float(value))
            elif type(value) is not float:
                raise TypeError(
                    f"activation_params[{name!r}]: expected a float, got {value!r} "
                    f"({type(value).__name__})"
                )
        codec.code_of(self)
