"""MXFP8: FP8 elements with one power-of-two (E8M0) scale per 32 consecutive elements.

Rowwise blocks run along K (1x32), columnwise blocks along M (32x1); both data buffers
keep the logical shape. Scale-inverses are E8M0 codes stored as uint8 and zero-padded:
rowwise (ru(M, 128), ru(K/32, 4)) indexed [m, k // 32], columnwise
(ru(M/32, 4), ru(K, 128)) indexed [m // 32, k]. Hence K % 32 == 0 for rowwise and
M % 32 == 0 for columnwise usage.

With ``with_2d_quantization`` (TE's 2-D MXFP8 weights) one scale covers a 32x32 tile
(the tile's amax): both usages then hold the same codes and the tile's scale in every
row (rowwise) or column (columnwise) entry the tile spans.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Optional

import torch

from ..constants import DType
from .encoding import (
    E8M0_BIAS,
    E8M0_NAN,
    FP8_MAX,
    apply_block_scale,
    block_amax,
    block_has_inf,
    cast_to_fp8,
    e8m0_scale_inv_code,
    e8m0_to_float,
    fp8_dtype_argument,
    fp8_to_float,
    matrix_dims,
    pad_2d,
    require_fp8_dtype,
    round_up,
    te_fp8_dtype,
    to_blocks,
)
from .quantizer import (
    InnerLayout,
    QuantizedStorage,
    QuantizedTensor,
    Quantizer,
    RowwiseColumnwisePairs,
    check_bool,
    opaque_value_type,
    quantizer_dataclass,
    usage_fields,
)

__all__ = ["MXFP8Quantizer", "MXFP8Tensor", "MXFP8TensorStorage"]

MXFP8_BLOCK = 32


def _block_shape(columnwise: bool) -> tuple[int, int]:
    return (MXFP8_BLOCK, 1) if columnwise else (1, MXFP8_BLOCK)


class _MXFP8Data(RowwiseColumnwisePairs):
    @classmethod
    def _logical_shape(cls, inner: Mapping[str, Optional[torch.Tensor]]) -> torch.Size:
        data = inner.get("_rowwise_data")
        return (data if data is not None else inner["_columnwise_data"]).shape

    def _dequantize_fp32(self, columnwise: bool) -> torch.Tensor:
        prefix = "_columnwise" if columnwise else "_rowwise"
        data, codes = getattr(self, prefix + "_data"), getattr(self, prefix + "_scale_inv")
        m, k = matrix_dims(self.shape)
        rows, cols = _block_shape(columnwise)
        values = fp8_to_float(data, self._quantizer.fp8_dtype).reshape(m, k)
        scale_inv = e8m0_to_float(codes[: m // rows, : k // cols])
        return apply_block_scale(values, scale_inv, rows, cols).reshape(self.shape)

    def gathered_rows(
        self,
        all_gather: Callable[[torch.Tensor], torch.Tensor],
        parts: int,
        *,
        rowwise: bool,
        columnwise: bool,
    ) -> MXFP8TensorStorage:
        """Every rank's shard concatenated along dim 0, 2-D, with the usages asked for
        (this shard must hold them): ``all_gather(t)`` gathers a contiguous ``t`` of each
        rank along dim 0. Codes and E8M0 scales move unpadded (rowwise 1x32 blocks lie
        within a row; columnwise 32x1 blocks within a shard of a multiple of 32 rows),
        then the scales are padded as a whole tensor's are: the bits of the whole tensor
        quantized at once."""
        if self._quantizer.with_2d_quantization:
            raise ValueError("MXFP8 with 32x32 tiles (with_2d_quantization) is not gathered")
        m, k = matrix_dims(self.shape)
        total = m * parts
        inner: dict[str, torch.Tensor] = {}
        for usage, prefix in ((False, "_rowwise"), (True, "_columnwise")):
            if not (columnwise if usage else rowwise):
                continue
            if not (self.columnwise_usage if usage else self.rowwise_usage):
                raise ValueError(f"MXFP8: this shard holds no {prefix[1:]} data to gather")
            rows, cols = _block_shape(usage)
            data = all_gather(getattr(self, prefix + "_data").reshape(m, k).contiguous())
            codes = getattr(self, prefix + "_scale_inv")[: m // rows, : k // cols]
            codes = all_gather(codes.contiguous())
            if usage:
                codes = pad_2d(codes, round_up(total // MXFP8_BLOCK, 4), round_up(k, 128))
            else:
                codes = pad_2d(codes, round_up(total, 128), round_up(k // MXFP8_BLOCK, 4))
            inner[prefix + "_data"] = data
            inner[prefix + "_scale_inv"] = codes
        quantizer = self._quantizer.with_internal(True)
        return MXFP8TensorStorage(inner, quantizer=quantizer, dtype=self._dtype, shape=(total, k))


class MXFP8TensorStorage(_MXFP8Data, QuantizedStorage):
    """Bare MXFP8 value."""


class MXFP8Tensor(_MXFP8Data, QuantizedTensor):
    """MXFP8 wrapper tensor subclass."""


@opaque_value_type
@quantizer_dataclass
class MXFP8Quantizer(Quantizer):
    """MXFP8 (OCP microscaling) quantizer: 32-element blocks, E8M0 scales; 32x32 tiles
    with ``with_2d_quantization`` (TE's option for weights). TE's constructor:
    ``MXFP8Quantizer(fp8_dtype, *, rowwise, columnwise, with_2d_quantization)``."""

    fp8_dtype: torch.dtype = torch.float8_e4m3fn
    with_2d_quantization: bool = False
    # Extension: sequence-parallel all-gathers move MXFP8 codes and scales (True, TE's
    # way) or the high-precision tensor (False): the same bits (docs/distributed.md).
    fp8_all_gather: bool = True

    storage_cls: ClassVar[type] = MXFP8TensorStorage
    wrapper_cls: ClassVar[type] = MXFP8Tensor
    format_name: ClassVar[str] = "MXFP8"

    def __init__(
        self,
        fp8_dtype: Any = torch.float8_e4m3fn,
        *,
        rowwise: Optional[bool] = None,
        columnwise: Optional[bool] = None,
        with_2d_quantization: bool = False,
        fp8_all_gather: bool = True,
        rowwise_usage: Optional[bool] = None,
        columnwise_usage: Optional[bool] = None,
        internal: bool = False,
    ) -> None:
        owner = type(self).__name__
        self._construct(
            **usage_fields(owner, rowwise, columnwise, rowwise_usage, columnwise_usage),
            internal=internal,
            fp8_dtype=fp8_dtype_argument(owner, fp8_dtype),
            with_2d_quantization=with_2d_quantization,
            fp8_all_gather=fp8_all_gather,
        )

    def _init_fields(self) -> None:
        super()._init_fields()
        require_fp8_dtype("MXFP8Quantizer", self.fp8_dtype)
        check_bool("MXFP8Quantizer", "with_2d_quantization", self.with_2d_quantization)
        check_bool("MXFP8Quantizer", "fp8_all_gather", self.fp8_all_gather)

    @property
    def dtype(self) -> DType:
        """TE's attribute: the FP8 format as a ``te.DType``."""
        return te_fp8_dtype(self.fp8_dtype)

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        """TE's: at least 2-D, with K and M multiples of the 32-element block."""
        m, k = matrix_dims(inp.shape) if inp.dim() >= 1 else (0, 0)
        return inp.dim() >= 2 and k % MXFP8_BLOCK == 0 and m % MXFP8_BLOCK == 0

    # The recipe class whose quantized weights it makes (recipes.compatible_recipe).
    _COMPATIBLE_RECIPE = "MXFP8BlockScaling"

    def check_shape(self, shape: Sequence[Any]) -> None:
        super().check_shape(shape)
        m, k = matrix_dims(shape)
        if self.rowwise_usage and k % MXFP8_BLOCK != 0:
            raise ValueError(
                f"MXFP8 rowwise usage needs the last dim K to be a multiple of {MXFP8_BLOCK}, "
                f"got shape {tuple(shape)}"
            )
        if self.columnwise_usage and m % MXFP8_BLOCK != 0:
            raise ValueError(
                f"MXFP8 columnwise usage needs the product of the leading dims M to be a "
                f"multiple of {MXFP8_BLOCK}, got shape {tuple(shape)}"
            )

    def inner_layout(self, shape: Sequence[Any]) -> InnerLayout:
        self.check_shape(shape)
        m, k = matrix_dims(shape)
        layout: list[tuple[str, tuple[Any, ...], torch.dtype]] = []
        if self.rowwise_usage:
            layout.append(("_rowwise_data", tuple(shape), torch.uint8))
            scale_shape = (round_up(m, 128), round_up(k // MXFP8_BLOCK, 4))
            layout.append(("_rowwise_scale_inv", scale_shape, torch.uint8))
        if self.columnwise_usage:
            layout.append(("_columnwise_data", tuple(shape), torch.uint8))
            scale_shape = (round_up(m // MXFP8_BLOCK, 4), round_up(k, 128))
            layout.append(("_columnwise_scale_inv", scale_shape, torch.uint8))
        return tuple(layout)

    def _quantize_usage(self, x2d: torch.Tensor, columnwise: bool) -> tuple[torch.Tensor, ...]:
        rows, cols = (
            (MXFP8_BLOCK, MXFP8_BLOCK) if self.with_2d_quantization else (_block_shape(columnwise))
        )
        fmax = FP8_MAX[self.fp8_dtype]
        blocks = to_blocks(x2d, rows, cols)
        codes = e8m0_scale_inv_code(block_amax(blocks), fmax)
        scale = torch.exp2(E8M0_BIAS - codes.float())  # exact: 1 / 2**(code - 127)
        data = cast_to_fp8(apply_block_scale(x2d, scale, rows, cols), self.fp8_dtype)
        # A block holding an Inf: saturated codes, the NaN scale code (dequantizes NaN).
        codes = torch.where(block_has_inf(blocks), torch.full_like(codes, E8M0_NAN), codes)
        m, k = x2d.shape
        if self.with_2d_quantization:  # the tile's code in every entry of its 1-D blocks
            if columnwise:
                codes = codes.repeat_interleave(MXFP8_BLOCK, dim=1)[:, :k]
            else:
                codes = codes.repeat_interleave(MXFP8_BLOCK, dim=0)[:m]
        if columnwise:
            padded = pad_2d(codes, round_up(m // MXFP8_BLOCK, 4), round_up(k, 128))
        else:
            padded = pad_2d(codes, round_up(m, 128), round_up(k // MXFP8_BLOCK, 4))
        return data, padded

    def _quantize_impl(self, x: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        x2d = x.float().reshape(matrix_dims(x.shape))
        inner: dict[str, Optional[torch.Tensor]] = {}
        for columnwise, prefix in ((False, "_rowwise"), (True, "_columnwise")):
            if self.columnwise_usage if columnwise else self.rowwise_usage:
                data, codes = self._quantize_usage(x2d, columnwise)
                inner[prefix + "_data"] = data.reshape(x.shape)
                inner[prefix + "_scale_inv"] = codes
        return inner


# ``torch.load(weights_only=True)`` (torch's default) rebuilds quantized weights from
# these classes and the quantizers they hold.
torch.serialization.add_safe_globals([MXFP8Tensor, MXFP8TensorStorage, MXFP8Quantizer])
