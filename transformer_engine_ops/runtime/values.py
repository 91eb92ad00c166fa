"""Plain configuration values that cross an op boundary in a typed value slot.

A value type is immutable and hashable; registered as a torch.compile
value-opaque type, it is baked into the graph as a constant and guarded by
equality, so changing it recompiles and the guard names the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from .opaque import OpaqueBase, register_value_type


@dataclass(frozen=True)
class GemmConfig(OpaqueBase):
    """How one GEMM of a module runs.

    ``use_split_accumulator`` asks FP8 GEMMs on CUDA for full-precision
    accumulation (``torch._scaled_mm(use_fast_accum=False)``); the dequantizing
    CPU path always accumulates in fp32.
    """

    use_split_accumulator: bool = True

    def __fx_repr__(self) -> tuple[str, dict[str, type]]:
        return (
            f"GemmConfig(use_split_accumulator={self.use_split_accumulator!r})",
            {"GemmConfig": GemmConfig},
        )


register_value_type(GemmConfig)
