"""``te.DType``: TE's data-type tags, value for value as TE's backend enum
(``NVTEDType``), so a script comparing or passing them behaves as under TE."""

from __future__ import annotations

import enum

import torch


class DType(enum.IntEnum):
    """TE's ``transformer_engine.pytorch.DType`` members, with the torch dtype of each
    (``torch_dtype``; FP4 has none: its values are packed two to a ``uint8``)."""

    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat4E2M1 = 10

    @property
    def torch_dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self]


_TORCH_DTYPES = {
    DType.kByte: torch.uint8,
    DType.kInt32: torch.int32,
    DType.kFloat32: torch.float32,
    DType.kFloat16: torch.float16,
    DType.kBFloat16: torch.bfloat16,
    DType.kFloat8E4M3: torch.float8_e4m3fn,
    DType.kFloat8E5M2: torch.float8_e5m2,
    DType.kFloat4E2M1: torch.uint8,
}
