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
