"""NVFP4: E2M1 elements packed two per byte, an E4M3 scale per 16 elements and a
per-tensor fp32 scale derived from the tensor's amax.

Encoding (fp32 throughout): ``S = 448 * 6 / amax`` (1 when amax is 0); a block's scale
code is ``e4m3(block_amax / 6 * S)``; elements are ``e2m1(x * S / block_scale)``.
Dequantization: ``e2m1 * block_scale / S``. Rowwise blocks are 1x16 along K; columnwise
data is the transposed matrix (K, M) with 1x16 blocks along M. With 2-D quantization
(weights) blocks are 16x16 and both usages hold the same codes, transposed.

Layout: ``_rowwise_data`` (..., K/2), ``_rowwise_scale_inv`` (ru(M,128), ru(ceil(K/16),4)),
``_columnwise_data`` (K, M/2) (always 2-D, so a columnwise-only value's logical shape
is (M, K) unless the caller passes it), ``_columnwise_scale_inv``
(ru(K,128), ru(ceil(M/16),4)), ``_amax_rowwise`` and ``_amax_columnwise`` (fp32 (1,)).
Packing needs K even (rowwise) and M even (columnwise). Partial blocks are zero-padded.
NaN and Inf: E2M1 has neither, so a block holding one gets the E4M3 NaN scale code and
dequantizes to NaN as a whole. Random Hadamard transforms and stochastic rounding,
which TE applies to some NVFP4 tensors, are not part of this reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

import torch

from ..runtime.quantizer import (
    InnerLayout,
    QuantizedData,
    QuantizedStorage,
    QuantizedTensor,
    Quantizer,
    check_bool,
)
from .encoding import (
    E2M1_MAX,
    E4M3_MAX,
    E4M3_NAN,
    apply_block_scale,
    block_amax,
    ceil_div,
    e2m1_to_float,
    encode_e2m1,
    encode_e4m3,
    fp8_to_float,
    from_blocks,
    matrix_dims,
    pack_e2m1,
    pad_2d,
    round_up,
    scale_from_amax,
    tensor_amax,
    to_blocks,
    unpack_e2m1,
)

__all__ = ["NVFP4Quantizer", "NVFP4Tensor", "NVFP4TensorStorage", "nvfp4_global_scale"]

NVFP4_BLOCK = 16


def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """Per-tensor encode scale ``448 * 6 / amax`` (1 when amax is 0, FP32_MAX if Inf)."""
    return scale_from_amax(amax, E4M3_MAX * E2M1_MAX)


def _scale_inv_shape(rows: Any, cols: Any) -> tuple[Any, Any]:
    """Padded scale shape for a (rows, cols) matrix with 1x16 blocks along cols."""
    return round_up(rows, 128), round_up(ceil_div(cols, NVFP4_BLOCK), 4)


def _quantize_matrix(
    x2d: torch.Tensor, global_scale: torch.Tensor, block_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, C) fp32 -> (packed (R, C/2), padded E4M3 scale codes) with 1x16 or 16x16 blocks."""
    r, c = x2d.shape
    blocks = to_blocks(x2d, block_rows, NVFP4_BLOCK)
    # NaN or Inf (E2M1 has neither): the block gets the NaN scale code and dequantizes
    # to NaN, so an overflow stays detectable downstream.
    has_nan = (~torch.isfinite(blocks)).any(dim=3).any(dim=1)
    scale_codes = encode_e4m3(block_amax(blocks) / E2M1_MAX * global_scale)
    scale_codes = torch.where(has_nan, torch.full_like(scale_codes, E4M3_NAN), scale_codes)
    block_scale = fp8_to_float(scale_codes, torch.float8_e4m3fn)
    encode = torch.where(
        block_scale > 0, global_scale / block_scale, torch.zeros_like(block_scale)
    )  # NaN and zero scales encode everything as 0
    scaled = torch.clamp(apply_block_scale(x2d, encode, block_rows, NVFP4_BLOCK), -6.0, 6.0)
    codes = encode_e2m1(torch.nan_to_num(scaled, nan=0.0))
    row_scales = scale_codes.repeat_interleave(block_rows, dim=0)[:r]
    return pack_e2m1(codes), pad_2d(row_scales, *_scale_inv_shape(r, c))


def _dequantize_matrix(
    packed: torch.Tensor, scale_codes: torch.Tensor, amax: torch.Tensor, r: Any, c: Any
) -> torch.Tensor:
    values = e2m1_to_float(unpack_e2m1(packed.reshape(r, c // 2)))
    block_scale = fp8_to_float(scale_codes[:r, : ceil_div(c, NVFP4_BLOCK)], torch.float8_e4m3fn)
    blocks = to_blocks(values, 1, NVFP4_BLOCK) * block_scale[:, None, :, None]
    return from_blocks(blocks, r, c) / nvfp4_global_scale(amax)


class _NVFP4Data(QuantizedData):
    INNER_NAMES: ClassVar[tuple[str, ...]] = (
        "_rowwise_data",
        "_rowwise_scale_inv",
        "_columnwise_data",
        "_columnwise_scale_inv",
        "_amax_rowwise",
        "_amax_columnwise",
    )
    ROWWISE_NAMES: ClassVar[tuple[str, ...]] = (
        "_rowwise_data",
        "_rowwise_scale_inv",
        "_amax_rowwise",
    )
    COLUMNWISE_NAMES: ClassVar[tuple[str, ...]] = (
        "_columnwise_data",
        "_columnwise_scale_inv",
        "_amax_columnwise",
    )

    @classmethod
    def _logical_shape(cls, inner: Mapping[str, Optional[torch.Tensor]]) -> torch.Size:
        data = inner.get("_rowwise_data")
        if data is not None:
            return torch.Size((*data.shape[:-1], data.shape[-1] * 2))
        k, half_m = inner["_columnwise_data"].shape
        return torch.Size((half_m * 2, k))

    def _dequantize_fp32(self, columnwise: bool) -> torch.Tensor:
        m, k = matrix_dims(self.shape)
        if not columnwise:
            x2d = _dequantize_matrix(
                self._rowwise_data, self._rowwise_scale_inv, self._amax_rowwise, m, k
            )
        else:
            x2d = _dequantize_matrix(
                self._columnwise_data, self._columnwise_scale_inv, self._amax_columnwise, k, m
            ).t()
        return x2d.reshape(self.shape)


class NVFP4TensorStorage(_NVFP4Data, QuantizedStorage):
    """Bare NVFP4 value."""


class NVFP4Tensor(_NVFP4Data, QuantizedTensor):
    """NVFP4 wrapper tensor subclass."""


@dataclasses.dataclass(frozen=True)
class NVFP4Quantizer(Quantizer):
    """NVFP4 quantizer; ``with_2d_quantization`` uses 16x16 blocks (TE's choice for weights)."""

    with_2d_quantization: bool = False

    def _init_fields(self) -> None:
        super()._init_fields()
        check_bool(type(self).__name__, "with_2d_quantization", self.with_2d_quantization)

    storage_cls: ClassVar[type] = NVFP4TensorStorage
    wrapper_cls: ClassVar[type] = NVFP4Tensor
    format_name: ClassVar[str] = "NVFP4"

    def check_shape(self, shape: Sequence[Any]) -> None:
        super().check_shape(shape)
        m, k = matrix_dims(shape)
        if self.rowwise_usage and k % 2 != 0:
            raise ValueError(
                "NVFP4 rowwise usage packs two values per byte along K, so the last dim must "
                f"be even, got shape {tuple(shape)}"
            )
        if self.columnwise_usage and m % 2 != 0:
            raise ValueError(
                "NVFP4 columnwise usage packs two values per byte along M, so the product of "
                f"the leading dims must be even, got shape {tuple(shape)}"
            )

    def inner_layout(self, shape: Sequence[Any]) -> InnerLayout:
        self.check_shape(shape)
        m, k = matrix_dims(shape)
        layout: list[tuple[str, tuple[Any, ...], torch.dtype]] = []
        if self.rowwise_usage:
            layout.append(("_rowwise_data", (*shape[:-1], k // 2), torch.uint8))
            layout.append(("_rowwise_scale_inv", _scale_inv_shape(m, k), torch.uint8))
        if self.columnwise_usage:
            layout.append(("_columnwise_data", (k, m // 2), torch.uint8))
            layout.append(("_columnwise_scale_inv", _scale_inv_shape(k, m), torch.uint8))
        if self.rowwise_usage:
            layout.append(("_amax_rowwise", (1,), torch.float32))
        if self.columnwise_usage:
            layout.append(("_amax_columnwise", (1,), torch.float32))
        return tuple(layout)

    def _quantize_impl(self, x: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        x2d = x.float().reshape(matrix_dims(x.shape))
        amax = tensor_amax(x2d)
        global_scale = nvfp4_global_scale(amax)
        block_rows = NVFP4_BLOCK if self.with_2d_quantization else 1
        inner: dict[str, Optional[torch.Tensor]] = {}
        if self.rowwise_usage:
            data, scales = _quantize_matrix(x2d, global_scale, block_rows)
            inner["_rowwise_data"] = data.reshape(*x.shape[:-1], x.shape[-1] // 2)
            inner["_rowwise_scale_inv"] = scales
            inner["_amax_rowwise"] = amax.reshape(1)
        if self.columnwise_usage:
            data, scales = _quantize_matrix(x2d.t(), global_scale, block_rows)
            # Contiguous like every buffer a fake kernel describes (torch.empty layout).
            inner["_columnwise_data"] = data.contiguous()
            inner["_columnwise_scale_inv"] = scales.contiguous()
            inner["_amax_columnwise"] = amax.reshape(1).clone()
        return inner
