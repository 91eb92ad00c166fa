"""FP8 block scaling: one fp32 scale per 1x128 (activations, gradients) or 128x128
(weights) block, as TE's ``Float8BlockQuantizer``.

Rowwise data keeps the logical shape; columnwise data is transposed, (K, d0, ...), with
its blocks running along M. Scale-inverses are fp32, zero-padded, and stored
"blocks-along-the-row first" as TE does: 1-D rowwise (ceil(K/b), ru(M, 4)) indexed
[k // b, m], 1-D columnwise (ceil(M/b), ru(K, 4)) indexed [m // b, k]; 2-D rowwise
(ceil(M/b), ru(ceil(K/b), 4)) indexed [m // b, k // b], 2-D columnwise its transpose
(ceil(K/b), ru(ceil(M/b), 4)), each a contiguous (row-major) tensor: TE's GEMM-ready
layout, which the block-scaled GEMM reads as views (float8_block_gemm.py). Any shape is
accepted: partial blocks are zero-padded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Optional

import torch

from ..constants import DType
from ..kernels import block_kernels
from .encoding import (
    FP8_MAX,
    apply_block_scale,
    block_amax,
    block_has_inf,
    cast_to_fp8,
    ceil_div,
    fp8_dtype_argument,
    fp8_to_float,
    matrix_dims,
    pad_2d,
    require_fp8_dtype,
    round_up,
    scale_from_amax,
    te_fp8_dtype,
    to_blocks,
    transpose_2d_to,
    transposed_shape,
    untransposed_shape,
)
from .quantizer import (
    InnerLayout,
    QuantizedStorage,
    QuantizedTensor,
    Quantizer,
    RowwiseColumnwisePairs,
    check_bool,
    check_float,
    check_int,
    opaque_value_type,
    quantizer_dataclass,
    usage_fields,
)

__all__ = ["Float8BlockQuantizer", "Float8BlockwiseQTensor", "Float8BlockwiseQTensorStorage"]

# Largest block edge accepted (TE uses 128; a block never needs more than a dim).
MAX_BLOCK_LEN = 1 << 16


class _Float8BlockData(RowwiseColumnwisePairs):
    @classmethod
    def _logical_shape(cls, inner: Mapping[str, Optional[torch.Tensor]]) -> torch.Size:
        if inner.get("_rowwise_data") is not None:
            return inner["_rowwise_data"].shape
        return untransposed_shape(inner["_columnwise_data"].shape)

    def _dequantize_fp32(self, columnwise: bool) -> torch.Tensor:
        q: Float8BlockQuantizer = self._quantizer  # type: ignore[assignment]
        m, k = matrix_dims(self.shape)
        b = q.block_len
        if not columnwise:
            values = fp8_to_float(self._rowwise_data, q.fp8_dtype).reshape(m, k)
            scale_inv = _unpad_scale_inv(self._rowwise_scale_inv, m, k, b, q.block_scaling_dim)
            return apply_block_scale(values, scale_inv, *q.block_shape()).reshape(self.shape)
        values = fp8_to_float(self._columnwise_data, q.fp8_dtype).reshape(k, m)
        scale_inv = _unpad_scale_inv(self._columnwise_scale_inv, k, m, b, q.block_scaling_dim)
        return transpose_2d_to(apply_block_scale(values, scale_inv, *q.block_shape()), self.shape)

    def _derive_usage(self, columnwise: bool) -> dict[str, torch.Tensor]:
        q: Float8BlockQuantizer = self._quantizer  # type: ignore[assignment]
        if q.block_scaling_dim != 2:
            return super()._derive_usage(columnwise)
        # 128x128 blocks are the same blocks either way: transpose codes and scales.
        m, k = matrix_dims(self.shape)
        b = q.block_len
        if columnwise:
            data = self._rowwise_data.reshape(m, k)
            scale_inv = _unpad_scale_inv(self._rowwise_scale_inv, m, k, b, 2)
            return {
                "_columnwise_data": transpose_2d_to(data, transposed_shape(self.shape)),
                "_columnwise_scale_inv": _pad_scale_inv(scale_inv.t(), 2),
            }
        data = self._columnwise_data.reshape(k, m)
        scale_inv = _unpad_scale_inv(self._columnwise_scale_inv, k, m, b, 2)
        return {
            "_rowwise_data": transpose_2d_to(data, self.shape),
            "_rowwise_scale_inv": _pad_scale_inv(scale_inv.t(), 2),
        }

    def gathered_rows(
        self,
        all_gather: Callable[[torch.Tensor], torch.Tensor],
        parts: int,
        *,
        rowwise: bool,
        columnwise: bool,
    ) -> Float8BlockwiseQTensorStorage:
        """Every rank's shard concatenated along dim 0, 2-D, with the usages asked for
        (this shard must hold them): ``all_gather(t)`` gathers a contiguous ``t`` of each
        rank along dim 0. 1-D blocks only: rowwise 1 x b blocks lie within a row,
        columnwise b x 1 blocks within a shard whose rows are a multiple of b. Codes and
        unpadded fp32 scales move, then take the whole tensor's layout (transposed
        codes, padded scales): the bits of the whole tensor quantized at once."""
        q: Float8BlockQuantizer = self._quantizer  # type: ignore[assignment]
        m, k = matrix_dims(self.shape)
        b = q.block_len
        if q.block_scaling_dim != 1 or (columnwise and m % b != 0):
            raise ValueError(
                f"FP8 block scaling gathers 1-D blocks of shards of whole blocks; got "
                f"block_scaling_dim={q.block_scaling_dim}, {m} rows, block_len={b}"
            )
        for usage, held in ((rowwise, self.rowwise_usage), (columnwise, self.columnwise_usage)):
            if usage and not held:
                raise ValueError("FP8 block scaling: this shard lacks a usage to gather")
        inner: dict[str, torch.Tensor] = {}
        if rowwise:
            inner["_rowwise_data"] = all_gather(self._rowwise_data.reshape(m, k).contiguous())
            scale_inv = _unpad_scale_inv(self._rowwise_scale_inv, m, k, b, 1)  # (m, K blocks)
            inner["_rowwise_scale_inv"] = _pad_scale_inv(all_gather(scale_inv.contiguous()), 1)
        if columnwise:
            codes = all_gather(self._columnwise_data.reshape(k, m).t().contiguous())
            inner["_columnwise_data"] = codes.t().contiguous()
            scale_inv = _unpad_scale_inv(self._columnwise_scale_inv, k, m, b, 1)  # (k, m / b)
            gathered = all_gather(scale_inv.t().contiguous())  # (M / b, k)
            inner["_columnwise_scale_inv"] = _pad_scale_inv(gathered.t(), 1)
        quantizer = q.with_internal(True)
        return Float8BlockwiseQTensorStorage(
            inner, quantizer=quantizer, dtype=self._dtype, shape=(m * parts, k)
        )


def _scale_inv_shape(rows: Any, cols: Any, block_len: int, dim: int) -> tuple[Any, Any]:
    """Padded scale shape for a (rows, cols) matrix whose blocks run along cols."""
    if dim == 2:
        return ceil_div(rows, block_len), round_up(ceil_div(cols, block_len), 4)
    return ceil_div(cols, block_len), round_up(rows, 4)


def _pad_scale_inv(scale_inv: torch.Tensor, dim: int) -> torch.Tensor:
    """Per-block (Rb, Cb) scale-inverses -> the stored layout (transposed for 1-D, padded):
    a new contiguous tensor, so the block-scaled GEMM reads it as it is
    (float8_block_gemm.py), without a copy per GEMM."""
    stored = scale_inv if dim == 2 else scale_inv.t()
    rows, cols = stored.shape
    padded_cols = round_up(cols, 4)
    if padded_cols != cols:
        return pad_2d(stored, rows, padded_cols)  # a new tensor, row-major
    # Unpadded, a 1-D scale is a transposed view: copy it row-major (never an alias).
    return stored.clone(memory_format=torch.contiguous_format)


def _unpad_scale_inv(
    stored: torch.Tensor, rows: Any, cols: Any, block_len: int, dim: int
) -> torch.Tensor:
    """Stored layout -> per-block (Rb, Cb) scale-inverses."""
    cb = ceil_div(cols, block_len)
    if dim == 2:
        return stored[: ceil_div(rows, block_len), :cb]
    return stored[:cb, :rows].t()


class Float8BlockwiseQTensorStorage(_Float8BlockData, QuantizedStorage):
    """Bare FP8 block-scaled value."""


class Float8BlockwiseQTensor(_Float8BlockData, QuantizedTensor):
    """FP8 block-scaled wrapper tensor subclass."""


@opaque_value_type
@quantizer_dataclass
class Float8BlockQuantizer(Quantizer):
    """FP8 with fp32 scales per 1 x block_len (dim 1) or block_len^2 (dim 2) block.
    TE's constructor: ``Float8BlockQuantizer(fp8_dtype, *, rowwise, columnwise,
    amax_epsilon, force_pow_2_scales, block_scaling_dim)``, 2-D blocks by default as
    there; ``block_len`` (TE's is 128) is this package's keyword-only extension."""

    fp8_dtype: torch.dtype = torch.float8_e4m3fn
    block_len: int = 128
    block_scaling_dim: int = 2
    force_pow_2_scales: bool = True
    amax_epsilon: float = 0.0
    # Extension: sequence-parallel all-gathers move codes and scales (True, TE's way)
    # or the high-precision tensor (False): the same bits (docs/distributed.md).
    fp8_all_gather: bool = True

    storage_cls: ClassVar[type] = Float8BlockwiseQTensorStorage
    wrapper_cls: ClassVar[type] = Float8BlockwiseQTensor
    format_name: ClassVar[str] = "FP8 block scaling"

    def __init__(
        self,
        fp8_dtype: Any = torch.float8_e4m3fn,
        *,
        rowwise: Optional[bool] = None,
        columnwise: Optional[bool] = None,
        amax_epsilon: float = 0.0,
        force_pow_2_scales: bool = True,
        block_scaling_dim: int = 2,
        block_len: int = 128,
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
            block_len=block_len,
            block_scaling_dim=block_scaling_dim,
            force_pow_2_scales=force_pow_2_scales,
            amax_epsilon=amax_epsilon,
            fp8_all_gather=fp8_all_gather,
        )

    @property
    def dtype(self) -> DType:
        """TE's attribute: the FP8 format as a ``te.DType``."""
        return te_fp8_dtype(self.fp8_dtype)

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        """TE's: at least 2-D, with K and M multiples of the block length."""
        if inp.dim() < 2:
            return False
        m, k = matrix_dims(inp.shape)
        return k % self.block_len == 0 and m % self.block_len == 0

    # The recipe class whose quantized weights it makes (recipes.compatible_recipe).
    _COMPATIBLE_RECIPE = "Float8BlockScaling"

    def lowers_bitwise_on(self, device: Optional[torch.device]) -> bool:
        # On CUDA the fused kernel is recorded as one op (block_kernels.eligible); other
        # block lengths would trace the reference ops, which Inductor fuses its own way.
        return (
            device is not None
            and device.type == "cuda"
            and block_kernels.supports(self.block_len)
            and block_kernels.available()
        )

    def _init_fields(self) -> None:
        super()._init_fields()
        owner = "Float8BlockQuantizer"
        require_fp8_dtype(owner, self.fp8_dtype)
        checked = {
            "block_len": check_int(owner, "block_len", self.block_len, 1, MAX_BLOCK_LEN),
            "block_scaling_dim": check_int(
                owner, "block_scaling_dim", self.block_scaling_dim, 1, 2
            ),
            "amax_epsilon": check_float(owner, "amax_epsilon", self.amax_epsilon),
        }
        check_bool(owner, "force_pow_2_scales", self.force_pow_2_scales)
        check_bool(owner, "fp8_all_gather", self.fp8_all_gather)
        for name, value in checked.items():  # exact ints/floats (an IntEnum becomes int)
            object.__setattr__(self, name, value)

    def block_shape(self) -> tuple[int, int]:
        """(rows, cols) of one block of the rowwise matrix (and of the transposed one)."""
        return (self.block_len if self.block_scaling_dim == 2 else 1), self.block_len

    def inner_layout(self, shape: Sequence[Any]) -> InnerLayout:
        self.check_shape(shape)
        m, k = matrix_dims(shape)
        b, dim = self.block_len, self.block_scaling_dim
        layout: list[tuple[str, tuple[Any, ...], torch.dtype]] = []
        if self.rowwise_usage:
            layout.append(("_rowwise_data", tuple(shape), torch.uint8))
            layout.append(("_rowwise_scale_inv", _scale_inv_shape(m, k, b, dim), torch.float32))
        if self.columnwise_usage:
            layout.append(("_columnwise_data", transposed_shape(shape), torch.uint8))
            layout.append(("_columnwise_scale_inv", _scale_inv_shape(k, m, b, dim), torch.float32))
        return tuple(layout)

    def _quantize_matrix(self, x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(R, C) -> (uint8 codes (R, C), per-block scale-inverses (Rb, Cb))."""
        rows, cols = self.block_shape()
        blocks = to_blocks(x2d, rows, cols)
        scale = scale_from_amax(
            block_amax(blocks),
            FP8_MAX[self.fp8_dtype],
            force_pow_2=self.force_pow_2_scales,
            epsilon=self.amax_epsilon,
        )
        codes = cast_to_fp8(apply_block_scale(x2d, scale, rows, cols), self.fp8_dtype)
        # A block holding an Inf: saturated codes, scale_inv +Inf (dequantizes non-finite).
        inv = 1.0 / scale
        return codes, torch.where(block_has_inf(blocks), torch.full_like(inv, float("inf")), inv)

    def _quantize_impl(self, x: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        if block_kernels.eligible(x, self.block_len):  # one Triton kernel; the same bits
            return block_kernels.fused_quantize(  # type: ignore[return-value]
                x,
                self.fp8_dtype,
                self.block_len,
                self.block_scaling_dim,
                self.force_pow_2_scales,
                self.amax_epsilon,
                self.rowwise_usage,
                self.columnwise_usage,
            )
        return self._quantize_reference(x)

    def _quantize_reference(self, x: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        """The ground truth: torch ops (CPU tensors, tracing, other block lengths)."""
        m, k = matrix_dims(x.shape)
        x2d = x.float().reshape(m, k)
        dim = self.block_scaling_dim
        inner: dict[str, Optional[torch.Tensor]] = {}
        rowwise = self._quantize_matrix(x2d) if self.rowwise_usage or dim == 2 else None
        if self.rowwise_usage:
            codes, scale_inv = rowwise
            inner["_rowwise_data"] = codes.reshape(x.shape)
            inner["_rowwise_scale_inv"] = _pad_scale_inv(scale_inv, dim)
        if self.columnwise_usage:
            if dim == 2:  # same 128x128 blocks: the transpose of the rowwise result
                # (a copy: never a view of the rowwise codes, even for M or K == 1)
                codes, scale_inv = transpose_2d_to(rowwise[0], (k, m)), rowwise[1].t()
            else:
                codes, scale_inv = self._quantize_matrix(x2d.t().contiguous())
            inner["_columnwise_data"] = codes.contiguous().reshape(transposed_shape(x.shape))
            inner["_columnwise_scale_inv"] = _pad_scale_inv(scale_inv, dim)
        return inner


# ``torch.load(weights_only=True)`` (torch's default) rebuilds quantized weights from
# these classes and the quantizers they hold.
torch.serialization.add_safe_globals(
    [Float8BlockwiseQTensor, Float8BlockwiseQTensorStorage, Float8BlockQuantizer]
)
