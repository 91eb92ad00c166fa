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
dequantizes to NaN as a whole.

TE's default recipe adds two options per quantizer (docs/quantization.md): ``with_rht``
transforms the columnwise data by the random Hadamard transform (``hadamard.py``)
before quantizing (its amax taken after the transform with ``with_post_rht_amax``), and
``stochastic_rounding`` rounds elements to one of their two neighbouring E2M1 values at
random, with bits drawn from the ``(seed, offset)`` pair the quantize call receives
(``philox.py``): rowwise data from stream 0, columnwise data from stream 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Optional

import torch

from ..constants import DType
from ..kernels import nvfp4_kernels
from .encoding import (
    E2M1_MAX,
    E4M3_NAN,
    FP32_MAX,
    apply_block_scale,
    block_amax,
    ceil_div,
    e2m1_to_float,
    encode_e2m1,
    encode_e2m1_stochastic,
    encode_e4m3,
    finite_abs,
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
from .hadamard import HADAMARD_SIZE, apply_rht, undo_rht
from .philox import check_rng_state, uniform
from .quantizer import (
    InnerLayout,
    QuantizedData,
    QuantizedStorage,
    QuantizedTensor,
    Quantizer,
    all_reduce_max,
    check_bool,
    check_choice,
    check_int,
    opaque_value_type,
    quantizer_dataclass,
    usage_fields,
)

__all__ = ["NVFP4Quantizer", "NVFP4Tensor", "NVFP4TensorStorage", "nvfp4_global_scale"]

NVFP4_BLOCK = 16


def nvfp4_global_scale(amax: torch.Tensor, e4m3_max: int = 448) -> torch.Tensor:
    """Per-tensor (or, row-scaled, per-row) encode scale ``e4m3_max * 6 / amax`` (1 when
    amax is 0, FP32_MAX if Inf); ``e4m3_max`` is 448, or 256 for TE's 4over6 tensors."""
    return scale_from_amax(amax, e4m3_max * E2M1_MAX)


def _scale_inv_shape(rows: Any, cols: Any) -> tuple[Any, Any]:
    """Padded scale shape for a (rows, cols) matrix with 1x16 blocks along cols."""
    return round_up(rows, 128), round_up(ceil_div(cols, NVFP4_BLOCK), 4)


def _quantize_matrix(
    x2d: torch.Tensor,
    global_scale: torch.Tensor,
    block_rows: int,
    u: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, C) fp32 -> (packed (R, C/2), padded E4M3 scale codes) with 1x16 or 16x16 blocks;
    elements rounded to nearest, or stochastically with ``u`` (uniform, shape (R, C))."""
    r, c = x2d.shape
    blocks = to_blocks(x2d, block_rows, NVFP4_BLOCK)
    # NaN or Inf (E2M1 has neither): the block gets the NaN scale code and dequantizes
    # to NaN, so an overflow stays detectable downstream.
    has_nan = (~torch.isfinite(blocks)).any(dim=3).any(dim=1)
    scale_codes = encode_e4m3(_over_e2m1_max(block_amax(blocks)) * global_scale)
    scale_codes = torch.where(has_nan, torch.full_like(scale_codes, E4M3_NAN), scale_codes)
    block_scale = fp8_to_float(scale_codes, torch.float8_e4m3fn)
    encode = torch.where(
        block_scale > 0, global_scale / block_scale, torch.zeros_like(block_scale)
    )  # NaN and zero scales encode everything as 0
    scaled = torch.clamp(apply_block_scale(x2d, encode, block_rows, NVFP4_BLOCK), -6.0, 6.0)
    scaled = torch.nan_to_num(scaled, nan=0.0)
    codes = encode_e2m1(scaled) if u is None else encode_e2m1_stochastic(scaled, u)
    row_scales = scale_codes.repeat_interleave(block_rows, dim=0)[:r]
    return pack_e2m1(codes), pad_2d(row_scales, *_scale_inv_shape(r, c))


def _quantize_matrix_4over6(
    x2d: torch.Tensor,
    amax: torch.Tensor,
    global_scale: torch.Tensor,
    q: NVFP4Quantizer,
    block_rows: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TE's 4over6 (``_quantize_blockwise_4over6_reference``): each block is quantized
    twice, its amax mapped to 6 (the standard scale) and to 4 (the scale times 1.5),
    and keeps the candidate whose dequantized values are closer to ``x2d`` (summed
    absolute or squared error over the block; a tie keeps map-to-6)."""
    r, c = x2d.shape
    blocks = to_blocks(x2d, block_rows, NVFP4_BLOCK)
    has_nan = (~torch.isfinite(blocks)).any(dim=3).any(dim=1)
    base = _over_e2m1_max(block_amax(blocks)) * global_scale
    decode_global = torch.ones_like(global_scale) / global_scale
    denominator = float(E2M1_MAX * q.nvfp4_e4m3_max)
    candidates = []
    for factor in (1.5, 1.0):  # map to 4, map to 6
        scale_codes = encode_e4m3(base * factor)
        scale_codes = torch.where(has_nan, torch.full_like(scale_codes, E4M3_NAN), scale_codes)
        block_scale = fp8_to_float(scale_codes, torch.float8_e4m3fn)
        encode = torch.where(
            block_scale > 0,
            torch.clamp(torch.ones_like(block_scale) / (block_scale * decode_global), max=FP32_MAX),
            torch.zeros_like(block_scale),
        )
        scaled = apply_block_scale(x2d, encode, block_rows, NVFP4_BLOCK)
        codes = encode_e2m1(torch.nan_to_num(torch.clamp(scaled, -6.0, 6.0), nan=0.0))
        value = apply_block_scale(e2m1_to_float(codes), block_scale, block_rows, NVFP4_BLOCK)
        product = value * amax
        diff = product / torch.full_like(product, denominator) - x2d
        err = diff * diff if q.nvfp4_4over6_err_mode == "MSE" else diff.abs()
        # Summed in index order (elements of a row, then a 2-D block's rows), the
        # order the Triton kernels use: a library reduction's order is its own.
        per_row = to_blocks(err, 1, NVFP4_BLOCK)  # (R, 1, Cb, 16)
        total = per_row[..., 0]
        for i in range(1, NVFP4_BLOCK):
            total = total + per_row[..., i]
        # Sized explicitly: a -1 is ambiguous for a matrix of no rows (no tokens).
        rows = to_blocks(total.reshape(r, per_row.shape[2]), block_rows, 1)  # (Rb, rows, Cb, 1)
        block_err = rows[:, 0, :, 0]
        for i in range(1, block_rows):
            block_err = block_err + rows[:, i, :, 0]
        candidates.append((codes, scale_codes, block_err))
    (codes4, scales4, err4), (codes6, scales6, err6) = candidates
    pick4 = err4 < err6  # (Rb, Cb)
    pick4_elements = from_blocks(
        pick4[:, None, :, None].expand(-1, block_rows, -1, NVFP4_BLOCK), r, c
    )
    codes = torch.where(pick4_elements, codes4, codes6)
    scale_codes = torch.where(pick4, scales4, scales6)
    row_scales = scale_codes.repeat_interleave(block_rows, dim=0)[:r]
    return pack_e2m1(codes), pad_2d(row_scales, *_scale_inv_shape(r, c))


def _over_e2m1_max(block_amax: torch.Tensor) -> torch.Tensor:
    """``block_amax / 6``, correctly rounded on every device: divided by a tensor, as
    CUDA's ``tensor / python_scalar`` multiplies by the reciprocal instead."""
    return block_amax / torch.full_like(block_amax, E2M1_MAX)


def _dequantize_matrix(
    packed: torch.Tensor,
    scale_codes: torch.Tensor,
    amax: torch.Tensor,
    r: Any,
    c: Any,
    e4m3_max: int,
) -> torch.Tensor:
    """(R, C) fp32 from packed codes, scale codes and the amax ((1,), or (R,) per row)."""
    values = e2m1_to_float(unpack_e2m1(packed.reshape(r, c // 2)))
    block_scale = fp8_to_float(scale_codes[:r, : ceil_div(c, NVFP4_BLOCK)], torch.float8_e4m3fn)
    blocks = to_blocks(values, 1, NVFP4_BLOCK) * block_scale[:, None, :, None]
    return from_blocks(blocks, r, c) / nvfp4_global_scale(amax.reshape(-1, 1), e4m3_max)


def _row_amax(x2d: torch.Tensor) -> torch.Tensor:
    """Finite amax of each row, (R,) fp32 (0 for an empty row)."""
    return torch.cat([finite_abs(x2d), x2d.new_zeros(x2d.shape[0], 1)], dim=1).amax(dim=1)


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
        e4m3_max = self._quantizer.nvfp4_e4m3_max
        if not columnwise:
            x2d = _dequantize_matrix(
                self._rowwise_data, self._rowwise_scale_inv, self._amax_rowwise, m, k, e4m3_max
            )
        else:
            xt = _dequantize_matrix(
                self._columnwise_data,
                self._columnwise_scale_inv,
                self._amax_columnwise,
                k,
                m,
                e4m3_max,
            )
            if self._quantizer.with_rht:  # back from the transformed domain
                xt = undo_rht(xt, self._quantizer.with_random_sign_mask)
            x2d = xt.t()
        return x2d.reshape(self.shape)

    def gathered_rows(
        self,
        all_gather: Callable[[torch.Tensor], torch.Tensor],
        parts: int,
        *,
        rowwise: bool,
        columnwise: bool,
    ) -> NVFP4TensorStorage:
        """Every rank's shard concatenated along dim 0, 2-D, with the usages asked for
        (this shard must hold them): ``all_gather(t)`` gathers a contiguous ``t`` of each
        rank along dim 0. The shards must have been quantized with one amax per usage
        (``quantize_with_stats`` with reduced stats) and hold whole 16-row blocks, so
        no columnwise 1x16 block (nor a 16x16 one) straddles two shards. Packed codes
        and unpadded E4M3 scales move; the columnwise ones, (K, m/2) and (K, m/16) per
        shard, are gathered along dim 0 and their rank blocks laid side by side (TE's
        ``swap_first_dims``); then the scales are padded as the whole tensor's. The
        amax is this shard's (the same on every rank), not sent."""
        q: NVFP4Quantizer = self._quantizer  # type: ignore[assignment]
        m, k = matrix_dims(self.shape)
        if q.row_scaled_nvfp4 or m % NVFP4_BLOCK != 0 or k % NVFP4_BLOCK != 0:
            raise ValueError(
                "NVFP4 gathers shards of whole 16-element blocks with one amax per usage; "
                f"got a shard of {m} x {k} (both must be multiples of {NVFP4_BLOCK}), "
                f"row_scaled_nvfp4={q.row_scaled_nvfp4}"
            )
        for usage, held in ((rowwise, self.rowwise_usage), (columnwise, self.columnwise_usage)):
            if usage and not held:
                raise ValueError("NVFP4: this shard lacks a usage to gather")
        total = m * parts
        inner: dict[str, torch.Tensor] = {}
        if rowwise:
            inner["_rowwise_data"] = all_gather(self._rowwise_data.reshape(m, k // 2).contiguous())
            scales = all_gather(self._rowwise_scale_inv[:m, : k // NVFP4_BLOCK].contiguous())
            inner["_rowwise_scale_inv"] = pad_2d(scales, *_scale_inv_shape(total, k))
            inner["_amax_rowwise"] = self._amax_rowwise.clone()
        if columnwise:
            codes = all_gather(self._columnwise_data.contiguous())  # (parts * K, m / 2)
            inner["_columnwise_data"] = _side_by_side(codes, parts)
            scales = self._columnwise_scale_inv[:k, : m // NVFP4_BLOCK].contiguous()
            scales = _side_by_side(all_gather(scales), parts)
            inner["_columnwise_scale_inv"] = pad_2d(scales, *_scale_inv_shape(k, total))
            inner["_amax_columnwise"] = self._amax_columnwise.clone()
        quantizer = q.with_usage(rowwise=rowwise, columnwise=columnwise).with_internal(True)
        return NVFP4TensorStorage(inner, quantizer=quantizer, dtype=self._dtype, shape=(total, k))


def _side_by_side(stacked: torch.Tensor, parts: int) -> torch.Tensor:
    """``parts`` blocks of rows stacked (parts * R, C) -> laid side by side (R, parts * C)."""
    rows, cols = stacked.shape[0] // parts, stacked.shape[1]
    return stacked.reshape(parts, rows, cols).transpose(0, 1).reshape(rows, parts * cols)


class NVFP4TensorStorage(_NVFP4Data, QuantizedStorage):
    """Bare NVFP4 value."""


class NVFP4Tensor(_NVFP4Data, QuantizedTensor):
    """NVFP4 wrapper tensor subclass."""


@opaque_value_type
@quantizer_dataclass
class NVFP4Quantizer(Quantizer):
    """NVFP4 quantizer with TE's options (TE 2.20.2's ``NVFP4Quantizer`` fields):

    * ``with_2d_quantization``: 16x16 blocks (TE's choice for weights);
    * ``with_rht``: the columnwise data is the random Hadamard transform of the tensor
      along M (TE's choice for the input and the output gradient, whose columnwise data
      only the weight-gradient GEMM reads); needs M to be a multiple of 16;
    * ``with_post_rht_amax``: the columnwise per-tensor amax is taken after the
      transform (TE sets it with ``with_rht``), so no transformed element saturates;
      without ``with_rht`` there is no transform and it changes nothing (as in TE);
    * ``stochastic_rounding``: elements round stochastically (TE's choice for
      gradients); quantize with :meth:`quantize_stochastic`, which takes ``rng_state``,
      an int64 (seed, offset) tensor of shape (2,);
    * ``row_scaled_nvfp4``: every row of the stored matrix has its own fp32 amax and
      global scale (``_amax_rowwise`` (M,), ``_amax_columnwise`` (K,)); the last dim must
      be a multiple of 16 (TE's row-scaled activations);
    * ``nvfp4_use_4over6``: each block keeps the better of its amax mapped to 6 and to
      4 (``nvfp4_4over6_err_mode``: "MAE" or "MSE"), with the global scale's E4M3 bound
      ``nvfp4_e4m3_max`` (448, or 256).

    * ``with_random_sign_mask``: the transform's sign vector is TE's (True, TE's
      default), or all +1 (the plain Hadamard matrix);
    * ``with_amax_reduction``: each quantize takes the maximum per-tensor amaxes over
      ``amax_reduction_group`` (the default process group when None) first.

    TE's constructor: ``NVFP4Quantizer(fp4_dtype, rowwise, columnwise,
    with_amax_reduction, amax_reduction_group, with_rht, with_post_rht_amax,
    with_2d_quantization, stochastic_rounding, row_scaled_nvfp4, nvfp4_use_4over6,
    nvfp4_e4m3_max, nvfp4_4over6_err_mode, with_random_sign_mask)``, positional as
    there; as TE, ``nvfp4_e4m3_max`` counts only with 4over6 (448 otherwise) and the
    error mode is case-insensitive.

    TE's kernels refuse the transform, stochastic rounding and 2-D blocks with
    row-scaled data, and the transform and stochastic rounding with 4over6: so does
    construction (ValueError).
    """

    with_2d_quantization: bool = False
    with_rht: bool = False
    with_post_rht_amax: bool = False
    stochastic_rounding: bool = False
    row_scaled_nvfp4: bool = False
    nvfp4_use_4over6: bool = False
    nvfp4_e4m3_max: int = 448
    nvfp4_4over6_err_mode: str = "MAE"
    with_random_sign_mask: bool = True
    with_amax_reduction: bool = False
    # Extension (TE always gathers NVFP4 where it can): a sequence-parallel all-gather
    # of a tensor this quantizer quantizes moves NVFP4 codes and scales quantized with
    # the group's amax (True), or the high-precision tensor, quantized once gathered
    # (False). Both give the same bits (docs/distributed.md). The name is the other
    # recipes' keyword, so one flag chooses the gather for every recipe.
    fp8_all_gather: bool = dataclasses.field(default=True, kw_only=True)

    def __init__(
        self,
        fp4_dtype: Any = DType.kFloat4E2M1,
        rowwise: Optional[bool] = None,
        columnwise: Optional[bool] = None,
        with_amax_reduction: bool = False,
        amax_reduction_group: Any = None,
        with_rht: bool = False,
        with_post_rht_amax: bool = False,
        with_2d_quantization: bool = False,
        stochastic_rounding: bool = False,
        row_scaled_nvfp4: bool = False,
        nvfp4_use_4over6: bool = False,
        nvfp4_e4m3_max: int = 448,
        nvfp4_4over6_err_mode: str = "MAE",
        with_random_sign_mask: bool = True,
        *,
        fp8_all_gather: bool = True,
        rowwise_usage: Optional[bool] = None,
        columnwise_usage: Optional[bool] = None,
        internal: bool = False,
    ) -> None:
        owner = type(self).__name__
        if fp4_dtype is not DType.kFloat4E2M1:
            raise TypeError(f"{owner}: fp4_dtype must be te.DType.kFloat4E2M1, got {fp4_dtype!r}")
        if not isinstance(nvfp4_4over6_err_mode, str):
            raise TypeError(
                f"{owner}: nvfp4_4over6_err_mode must be 'MAE' or 'MSE', got "
                f"{nvfp4_4over6_err_mode!r}"
            )
        self.amax_reduction_group = amax_reduction_group
        self._construct(
            **usage_fields(owner, rowwise, columnwise, rowwise_usage, columnwise_usage),
            internal=internal,
            with_2d_quantization=with_2d_quantization,
            with_rht=with_rht,
            with_post_rht_amax=with_post_rht_amax,
            stochastic_rounding=stochastic_rounding,
            row_scaled_nvfp4=row_scaled_nvfp4,
            nvfp4_use_4over6=nvfp4_use_4over6,
            # TE's: the bound applies to 4over6 only.
            nvfp4_e4m3_max=nvfp4_e4m3_max if nvfp4_use_4over6 is True else 448,
            nvfp4_4over6_err_mode=nvfp4_4over6_err_mode.upper(),
            with_random_sign_mask=with_random_sign_mask,
            with_amax_reduction=with_amax_reduction,
            fp8_all_gather=fp8_all_gather,
        )

    @property
    def dtype(self) -> DType:
        """TE's attribute: ``te.DType.kFloat4E2M1``."""
        return DType.kFloat4E2M1

    def is_requantization_safe(self) -> bool:
        return not self.stochastic_rounding

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        """TE's: not row-scaled, at least 2-D, K and M multiples of the 16-block."""
        if self.row_scaled_nvfp4 or inp.dim() < 2:
            return False
        m, k = matrix_dims(inp.shape)
        return k % NVFP4_BLOCK == 0 and m % NVFP4_BLOCK == 0

    # The recipe class whose quantized weights it makes (recipes.compatible_recipe).
    _COMPATIBLE_RECIPE = "NVFP4BlockScaling"

    def _init_fields(self) -> None:
        super()._init_fields()
        owner = type(self).__name__
        flags = (
            "with_2d_quantization",
            "with_rht",
            "with_post_rht_amax",
            "stochastic_rounding",
            "row_scaled_nvfp4",
            "nvfp4_use_4over6",
            "with_random_sign_mask",
            "with_amax_reduction",
            "fp8_all_gather",
        )
        for name in flags:
            check_bool(owner, name, getattr(self, name))
        e4m3_max = check_int(owner, "nvfp4_e4m3_max", self.nvfp4_e4m3_max, 256, 448)
        object.__setattr__(self, "nvfp4_e4m3_max", e4m3_max)
        if e4m3_max not in (448, 256):
            raise ValueError(f"{owner}: nvfp4_e4m3_max must be 448 or 256, got {e4m3_max}")
        check_choice(owner, "nvfp4_4over6_err_mode", self.nvfp4_4over6_err_mode, ("MAE", "MSE"))
        if e4m3_max != 448 and not self.nvfp4_use_4over6:
            raise ValueError(f"{owner}: nvfp4_e4m3_max={e4m3_max} needs nvfp4_use_4over6=True")
        refused = {
            "row_scaled_nvfp4": ("with_rht", "stochastic_rounding", "with_2d_quantization"),
            "nvfp4_use_4over6": ("with_rht", "stochastic_rounding"),
        }
        for mode, others in refused.items():
            for other in others:
                if getattr(self, mode) and getattr(self, other):
                    raise ValueError(
                        f"{owner}: {mode}=True with {other}=True: TE's NVFP4 kernels do not "
                        "combine them"
                    )

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
        if self.row_scaled_nvfp4 and k % NVFP4_BLOCK != 0:
            raise ValueError(
                f"NVFP4 row-scaled data (row_scaled_nvfp4) needs the last dim to be a "
                f"multiple of {NVFP4_BLOCK}, got shape {tuple(shape)}"
            )
        if self.columnwise_usage and self.with_rht and m % HADAMARD_SIZE != 0:
            raise ValueError(
                "NVFP4 columnwise usage with the random Hadamard transform (with_rht) "
                f"transforms runs of {HADAMARD_SIZE} along M, so the product of the leading "
                f"dims must be a multiple of {HADAMARD_SIZE}, got shape {tuple(shape)} "
                "(or construct the recipe with disable_rht=True)"
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
        rows = self.row_scaled_nvfp4
        if self.rowwise_usage:
            layout.append(("_amax_rowwise", (m,) if rows else (1,), torch.float32))
        if self.columnwise_usage:
            layout.append(("_amax_columnwise", (k,) if rows else (1,), torch.float32))
        return tuple(layout)

    # ----- quantize -----

    def amax_stats(self, x: torch.Tensor) -> torch.Tensor:
        """What the per-tensor scales of ``x`` depend on, as fp32 ``(2,)``: the finite
        amax of the rowwise data and of the columnwise data (the same, or the amax after
        the random Hadamard transform with ``with_post_rht_amax``). The element-wise
        maximum of the stats of shards of whole 16-row blocks (the transform runs along
        M in runs of 16) is exactly the stats of their concatenation, so a MAX
        all-reduce gives every rank the whole tensor's (TE's ``amax_reduction_group``).
        Row-scaled data has an amax per row, which no reduction gives: refused."""
        self.check_input(x)
        if self.row_scaled_nvfp4:
            raise ValueError(
                f"{type(self).__name__}.amax_stats: row-scaled data (row_scaled_nvfp4) has "
                "one amax per row, not a per-tensor amax to reduce"
            )
        post_rht = self.columnwise_usage and self.with_rht and self.with_post_rht_amax
        if post_rht:
            self.check_shape(tuple(x.shape))  # a clear error before the transform's
        if nvfp4_kernels.eligible(x):  # Triton on CUDA; the same bits
            return nvfp4_kernels.amax_stats(self, x)
        x2d = x.detach().float().reshape(matrix_dims(x.shape))
        amax = tensor_amax(x2d)
        signs = self.with_random_sign_mask
        columnwise = tensor_amax(apply_rht(x2d.t(), signs)) if post_rht else amax
        return torch.stack([amax, columnwise])

    def quantize_with_stats(
        self, x: torch.Tensor, stats: torch.Tensor
    ) -> NVFP4TensorStorage | NVFP4Tensor:
        """``x`` quantized with the amaxes of ``stats`` (:meth:`amax_stats` of a larger
        tensor ``x`` is a shard of) instead of its own: every shard of whole 16-row
        blocks quantized with the reduced stats holds exactly its rows of the whole
        tensor quantized at once. Round-to-nearest only: stochastic rounding draws its
        bits by an element's position in the tensor it quantizes, which a shard's
        positions are not (such a tensor is gathered in high precision)."""
        self.check_input(x)
        owner = f"{type(self).__name__}.quantize_with_stats"
        if tuple(stats.shape) != (2,) or stats.dtype != torch.float32:
            raise ValueError(
                f"{owner}: stats must be the fp32 (2,) tensor amax_stats returns, got "
                f"{stats.dtype} {tuple(stats.shape)}"
            )
        if self.row_scaled_nvfp4 or self.stochastic_rounding:
            what = "row_scaled_nvfp4" if self.row_scaled_nvfp4 else "stochastic_rounding"
            raise ValueError(f"{owner}: not with {what}=True (a shard is not quantized alone)")
        stats = stats.to(x.device)
        x = x.detach() if x.requires_grad else x
        amaxes = (stats[0:1].clone(), stats[1:2].clone())  # buffers of their own
        return self._quantized_value(self._quantize_nvfp4(x, None, amaxes), x)

    def quantize_stochastic(
        self, t: torch.Tensor, rng_state: torch.Tensor, *, with_bias_grad: bool = False
    ) -> Any:
        """``quantize(t)`` rounding stochastically with the bits of ``rng_state`` (int64
        (seed, offset), shape (2,)); with ``with_bias_grad`` also ``t.sum(0)`` in fp32,
        as ``quantize_with_bias_grad``. ``quantize`` itself refuses a quantizer with
        ``stochastic_rounding``: its bits must come from somewhere."""
        self.check_input(t)
        if not self.stochastic_rounding:
            raise ValueError(
                f"{type(self).__name__}: rng_state given to a quantizer without stochastic_rounding"
            )
        check_rng_state(type(self).__name__, rng_state)
        if with_bias_grad and len(t.shape) != 2:
            raise ValueError(
                f"NVFP4 ({type(self).__name__}): the bias gradient is taken of a 2-D tensor, "
                f"got shape {tuple(t.shape)}"
            )
        x = t.detach() if t.requires_grad else t
        if self.with_amax_reduction:
            value = self._quantize_reduced(x, rng_state, t.dtype)
        else:
            value = self._quantized_value(self._quantize_nvfp4(x, rng_state), t)
        return (value, t.sum(0, dtype=torch.float32)) if with_bias_grad else value

    def _quantize_value(self, x: torch.Tensor, dtype: torch.dtype) -> Any:
        if not self.with_amax_reduction:
            return super()._quantize_value(x, dtype)
        if self.stochastic_rounding:  # ``quantize`` has no random bits to give
            check_rng_state(f"{type(self).__name__}.quantize (use quantize_stochastic)", None)
        return self._quantize_reduced(x, None, dtype)

    def _quantize_reduced(
        self, x: torch.Tensor, rng_state: Optional[torch.Tensor], dtype: torch.dtype
    ) -> Any:
        """TE's amax reduction: the group's per-tensor amaxes (:meth:`amax_stats`'s
        maximum over ``amax_reduction_group``), then ``x`` quantized with them; the
        value's quantizer no longer reduces (nor holds a group)."""
        owner = type(self).__name__
        stats = all_reduce_max(self.amax_stats(x), self.amax_reduction_group, owner)
        plain = self._derived(with_amax_reduction=False)
        amaxes = (stats[0:1].clone(), stats[1:2].clone())  # buffers of their own
        return plain._quantized_value(plain._quantize_nvfp4(x, rng_state, amaxes), x, dtype)

    def _quantize_impl(self, x: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        if self.stochastic_rounding:  # ``quantize`` has no random bits to give
            check_rng_state(f"{type(self).__name__}.quantize (use quantize_stochastic)", None)
        return self._quantize_nvfp4(x, None)

    def _quantize_nvfp4(
        self,
        x: torch.Tensor,
        rng_state: Optional[torch.Tensor],
        amaxes: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> dict[str, Optional[torch.Tensor]]:
        if nvfp4_kernels.eligible(x):  # Triton on CUDA; the same bits as the reference
            return nvfp4_kernels.quantize(self, x, rng_state, amaxes)
        return self._quantize_reference(x, rng_state, amaxes)

    def _quantize_reference(
        self,
        x: torch.Tensor,
        rng_state: Optional[torch.Tensor],
        amaxes: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> dict[str, Optional[torch.Tensor]]:
        """The inner buffers in plain torch ops (the ground truth, on every device);
        ``amaxes`` (rowwise, columnwise; fp32 (1,)) replace the tensor's own."""
        x2d = x.float().reshape(matrix_dims(x.shape))
        block_rows = NVFP4_BLOCK if self.with_2d_quantization else 1

        def bits(shape: tuple[Any, Any], stream: int) -> Optional[torch.Tensor]:
            if rng_state is None:
                return None
            return uniform(rng_state, shape[0] * shape[1], stream).to(x2d.device).reshape(shape)

        def encode(matrix: torch.Tensor, stream: int, amax: torch.Tensor) -> tuple[Any, Any]:
            """(packed codes, scale codes) of one stored matrix with its amax."""
            as_column = amax.reshape(-1, 1) if self.row_scaled_nvfp4 else amax
            global_scale = nvfp4_global_scale(as_column, self.nvfp4_e4m3_max)
            if self.nvfp4_use_4over6:
                return _quantize_matrix_4over6(matrix, as_column, global_scale, self, block_rows)
            return _quantize_matrix(matrix, global_scale, block_rows, bits(matrix.shape, stream))

        def amax_of(matrix: torch.Tensor) -> torch.Tensor:
            return _row_amax(matrix) if self.row_scaled_nvfp4 else tensor_amax(matrix)

        inner: dict[str, Optional[torch.Tensor]] = {}
        if self.rowwise_usage:
            amax = amax_of(x2d) if amaxes is None else amaxes[0].reshape(())
            data, scales = encode(x2d, 0, amax)
            inner["_rowwise_data"] = data.reshape(*x.shape[:-1], x.shape[-1] // 2)
            inner["_rowwise_scale_inv"] = scales
            inner["_amax_rowwise"] = amax.reshape(-1)
        if self.columnwise_usage:
            xt = x2d.t()
            amax = amax_of(xt) if amaxes is None else amaxes[1].reshape(())
            if self.with_rht:
                xt = apply_rht(xt, self.with_random_sign_mask)
                if self.with_post_rht_amax and amaxes is None:
                    amax = tensor_amax(xt)
            data, scales = encode(xt, 1, amax)
            # Contiguous like every buffer a fake kernel describes (torch.empty layout).
            inner["_columnwise_data"] = data.contiguous()
            inner["_columnwise_scale_inv"] = scales.contiguous()
            inner["_amax_columnwise"] = amax.reshape(-1).clone()
        return inner


# ``torch.load(weights_only=True)`` (torch's default) rebuilds quantized weights from
# these classes and the quantizers they hold.
torch.serialization.add_safe_globals([NVFP4Tensor, NVFP4TensorStorage, NVFP4Quantizer])
