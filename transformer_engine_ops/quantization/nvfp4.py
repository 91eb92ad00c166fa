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
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional, Union

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
    encode_e2m1_stochastic,
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
from .hadamard import HADAMARD_SIZE, apply_rht, undo_rht
from .philox import check_rng_state, uniform

__all__ = ["NVFP4Quantizer", "NVFP4Tensor", "NVFP4TensorStorage", "nvfp4_global_scale"]

NVFP4_BLOCK = 16


def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """Per-tensor encode scale ``448 * 6 / amax`` (1 when amax is 0, FP32_MAX if Inf)."""
    return scale_from_amax(amax, E4M3_MAX * E2M1_MAX)


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
    scale_codes = encode_e4m3(block_amax(blocks) / E2M1_MAX * global_scale)
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
            xt = _dequantize_matrix(
                self._columnwise_data, self._columnwise_scale_inv, self._amax_columnwise, k, m
            )
            if self._quantizer.with_rht:  # back from the transformed domain
                xt = undo_rht(xt)
            x2d = xt.t()
        return x2d.reshape(self.shape)


class NVFP4TensorStorage(_NVFP4Data, QuantizedStorage):
    """Bare NVFP4 value."""


class NVFP4Tensor(_NVFP4Data, QuantizedTensor):
    """NVFP4 wrapper tensor subclass."""


@dataclasses.dataclass(frozen=True)
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
      gradients); :meth:`quantize` then needs ``rng_state``, an int64 (seed, offset)
      tensor of shape (2,).
    """

    with_2d_quantization: bool = False
    with_rht: bool = False
    with_post_rht_amax: bool = False
    stochastic_rounding: bool = False

    def _init_fields(self) -> None:
        super()._init_fields()
        owner = type(self).__name__
        for name in (
            "with_2d_quantization",
            "with_rht",
            "with_post_rht_amax",
            "stochastic_rounding",
        ):
            check_bool(owner, name, getattr(self, name))

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
        if self.rowwise_usage:
            layout.append(("_amax_rowwise", (1,), torch.float32))
        if self.columnwise_usage:
            layout.append(("_amax_columnwise", (1,), torch.float32))
        return tuple(layout)

    # ----- quantize -----

    def quantize(
        self, t: torch.Tensor, rng_state: Optional[torch.Tensor] = None
    ) -> Union[QuantizedStorage, QuantizedTensor]:
        """Quantize ``t``; ``rng_state`` (int64 (seed, offset), shape (2,)) is required
        with ``stochastic_rounding`` and refused without it."""
        self.check_input(t)
        self._check_rng_state(rng_state)
        x = t.detach() if t.requires_grad else t
        return self._quantized_value(self._quantize_nvfp4(x, rng_state), t)

    def quantize_with_bias_grad(
        self, t: torch.Tensor, rng_state: Optional[torch.Tensor] = None
    ) -> tuple[Union[QuantizedStorage, QuantizedTensor], torch.Tensor]:
        """``(quantize(t, rng_state), t.sum(0) in fp32)`` of a 2-D ``t``."""
        if len(t.shape) != 2:
            raise ValueError(
                f"NVFP4 ({type(self).__name__}): the bias gradient is taken of a 2-D tensor, "
                f"got shape {tuple(t.shape)}"
            )
        return self.quantize(t, rng_state), t.sum(0, dtype=torch.float32)

    def _check_rng_state(self, rng_state: Optional[torch.Tensor]) -> None:
        owner = type(self).__name__
        if self.stochastic_rounding:
            check_rng_state(owner, rng_state)
        elif rng_state is not None:
            raise ValueError(f"{owner}: rng_state given to a quantizer without stochastic_rounding")

    def _quantize_impl(self, x: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        self._check_rng_state(None)  # the base class's quantize passes no random bits
        return self._quantize_nvfp4(x, None)

    def _quantize_nvfp4(
        self, x: torch.Tensor, rng_state: Optional[torch.Tensor]
    ) -> dict[str, Optional[torch.Tensor]]:
        x2d = x.float().reshape(matrix_dims(x.shape))
        amax = tensor_amax(x2d)
        global_scale = nvfp4_global_scale(amax)
        block_rows = NVFP4_BLOCK if self.with_2d_quantization else 1

        def bits(shape: tuple[Any, Any], stream: int) -> Optional[torch.Tensor]:
            if rng_state is None:
                return None
            return uniform(rng_state, shape[0] * shape[1], stream).to(x2d.device).reshape(shape)

        inner: dict[str, Optional[torch.Tensor]] = {}
        if self.rowwise_usage:
            data, scales = _quantize_matrix(x2d, global_scale, block_rows, bits(x2d.shape, 0))
            inner["_rowwise_data"] = data.reshape(*x.shape[:-1], x.shape[-1] // 2)
            inner["_rowwise_scale_inv"] = scales
            inner["_amax_rowwise"] = amax.reshape(1)
        if self.columnwise_usage:
            xt = x2d.t()
            col_amax, col_scale = amax, global_scale
            if self.with_rht:
                xt = apply_rht(xt)
                if self.with_post_rht_amax:
                    col_amax = tensor_amax(xt)
                    col_scale = nvfp4_global_scale(col_amax)
            data, scales = _quantize_matrix(xt, col_scale, block_rows, bits(xt.shape, 1))
            # Contiguous like every buffer a fake kernel describes (torch.empty layout).
            inner["_columnwise_data"] = data.contiguous()
            inner["_columnwise_scale_inv"] = scales.contiguous()
            inner["_amax_columnwise"] = col_amax.reshape(1).clone()
        return inner
