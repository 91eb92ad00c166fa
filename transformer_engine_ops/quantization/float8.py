"""FP8 with one scale per tensor: delayed scaling and current scaling.

Layout: ``_data`` (uint8, logical shape; rowwise), ``_transpose`` (uint8, (K, d0, ...);
columnwise), ``_scale_inv`` (fp32, (1,), always). The two data buffers hold the same
codes, so either usage can be created from the other exactly.
"""

from __future__ import annotations

import copy
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
    check_choice,
    check_float,
    check_int,
)
from .encoding import (
    FP8_MAX,
    cast_to_fp8,
    fp8_to_float,
    matrix_dims,
    require_fp8_dtype,
    scale_from_amax,
    tensor_amax,
    transpose_2d_to,
    transposed_shape,
    untransposed_shape,
)

__all__ = [
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "Float8TensorStorage",
]


class _Float8Data(QuantizedData):
    INNER_NAMES: ClassVar[tuple[str, ...]] = ("_data", "_transpose", "_scale_inv")
    ROWWISE_NAMES: ClassVar[tuple[str, ...]] = ("_data",)
    COLUMNWISE_NAMES: ClassVar[tuple[str, ...]] = ("_transpose",)

    _data: Optional[torch.Tensor]
    _transpose: Optional[torch.Tensor]
    _scale_inv: torch.Tensor

    @classmethod
    def _logical_shape(cls, inner: Mapping[str, Optional[torch.Tensor]]) -> torch.Size:
        if inner.get("_data") is not None:
            return inner["_data"].shape
        return untransposed_shape(inner["_transpose"].shape)

    @property
    def _fp8_dtype(self) -> torch.dtype:
        return self._quantizer.fp8_dtype

    def _dequantize_fp32(self, columnwise: bool) -> torch.Tensor:
        if not columnwise:
            values = fp8_to_float(self._data, self._fp8_dtype)
        else:
            m, k = matrix_dims(self.shape)
            codes = fp8_to_float(self._transpose, self._fp8_dtype).reshape(k, m)
            values = transpose_2d_to(codes, self.shape)
        return values * self._scale_inv

    def _derive_usage(self, columnwise: bool) -> dict[str, torch.Tensor]:
        m, k = matrix_dims(self.shape)
        if columnwise:
            return {"_transpose": transpose_2d_to(self._data.reshape(m, k), (k, *self.shape[:-1]))}
        return {"_data": transpose_2d_to(self._transpose.reshape(k, m), self.shape)}


class Float8TensorStorage(_Float8Data, QuantizedStorage):
    """Bare per-tensor FP8 value."""


class Float8Tensor(_Float8Data, QuantizedTensor):
    """Per-tensor FP8 wrapper tensor subclass."""


@dataclasses.dataclass(frozen=True)
class _Float8PerTensorQuantizer(Quantizer):
    """What the delayed- and current-scaling per-tensor FP8 quantizers share."""

    fp8_dtype: torch.dtype = torch.float8_e4m3fn

    storage_cls: ClassVar[type] = Float8TensorStorage
    wrapper_cls: ClassVar[type] = Float8Tensor
    format_name: ClassVar[str] = "FP8 per-tensor"

    def _init_fields(self) -> None:
        super()._init_fields()
        require_fp8_dtype(type(self).__name__, self.fp8_dtype)

    def inner_layout(self, shape: Sequence[Any]) -> InnerLayout:
        self.check_shape(shape)
        layout: list[tuple[str, tuple[Any, ...], torch.dtype]] = []
        if self.rowwise_usage:
            layout.append(("_data", tuple(shape), torch.uint8))
        if self.columnwise_usage:
            layout.append(("_transpose", transposed_shape(shape), torch.uint8))
        layout.append(("_scale_inv", (1,), torch.float32))
        return tuple(layout)

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _quantize_impl(self, x: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        x32 = x.float()
        scale = self._scale(x32)
        data = cast_to_fp8(x32 * scale, self.fp8_dtype)
        m, k = matrix_dims(x.shape)
        return {
            "_data": data if self.rowwise_usage else None,
            "_transpose": (
                transpose_2d_to(data.reshape(m, k), transposed_shape(x.shape))
                if self.columnwise_usage
                else None
            ),
            "_scale_inv": (1.0 / scale).reshape(1),
        }


@dataclasses.dataclass(frozen=True)
class Float8CurrentScalingQuantizer(_Float8PerTensorQuantizer):
    """Per-tensor FP8 with the scale computed from this tensor's amax (stateless)."""

    force_pow_2_scales: bool = False
    amax_epsilon: float = 0.0

    format_name: ClassVar[str] = "FP8 current scaling"

    def _init_fields(self) -> None:
        super()._init_fields()
        owner = type(self).__name__
        check_bool(owner, "force_pow_2_scales", self.force_pow_2_scales)
        object.__setattr__(
            self, "amax_epsilon", check_float(owner, "amax_epsilon", self.amax_epsilon)
        )

    def _quantize_impl(self, x: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        from . import cuda_kernels  # fused Triton kernels; same bits as the reference

        if cuda_kernels.eligible(x):
            return cuda_kernels.fp8_current_scaling_quantize(
                x,
                self.fp8_dtype,
                epsilon=self.amax_epsilon,
                force_pow_2=self.force_pow_2_scales,
                rowwise=self.rowwise_usage,
                columnwise=self.columnwise_usage,
            )
        return super()._quantize_impl(x)

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        return scale_from_amax(
            tensor_amax(x),
            FP8_MAX[self.fp8_dtype],
            force_pow_2=self.force_pow_2_scales,
            epsilon=self.amax_epsilon,
        )


# Longest amax history a delayed-scaling quantizer keeps (TE defaults to 1024).
MAX_AMAX_HISTORY_LEN = 1 << 20

_DELAYED_REASON = (
    "delayed scaling keeps an amax history and a scale tensor that every quantize call "
    "updates; that state cannot be a graph constant, so modules run it eagerly "
    "(and refuse it under fullgraph=True)"
)


@dataclasses.dataclass(frozen=True, eq=False)
class Float8Quantizer(_Float8PerTensorQuantizer):
    """Per-tensor FP8 with delayed scaling (TE's ``Float8Quantizer``): stateful.

    Quantizes with the scale derived from earlier amaxes, then records this tensor's
    amax into ``amax_history`` and updates ``scale`` in place. Equality is identity.
    """

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    scale: torch.Tensor = dataclasses.field(init=False, repr=False, compare=False)
    amax_history: torch.Tensor = dataclasses.field(init=False, repr=False, compare=False)

    value_opaque: ClassVar[bool] = False
    not_value_opaque_reason: ClassVar[Optional[str]] = _DELAYED_REASON
    format_name: ClassVar[str] = "FP8 delayed scaling"

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def _init_fields(self) -> None:
        super()._init_fields()
        owner = type(self).__name__
        check_choice(owner, "amax_compute_algo", self.amax_compute_algo, ("max", "most_recent"))
        object.__setattr__(self, "margin", check_int(owner, "margin", self.margin, 0, 64))
        object.__setattr__(
            self,
            "amax_history_len",
            check_int(owner, "amax_history_len", self.amax_history_len, 1, MAX_AMAX_HISTORY_LEN),
        )
        object.__setattr__(self, "scale", torch.ones(1))
        object.__setattr__(self, "amax_history", torch.zeros(self.amax_history_len))

    def _replace(self, **changes: Any) -> Quantizer:
        new = copy.copy(self)  # shares scale and amax_history: one state, several usages
        for name, value in changes.items():
            object.__setattr__(new, name, value)
        return new

    def __fx_repr__(self) -> tuple[str, dict[str, Any]]:
        raise TypeError(f"{type(self).__name__} cannot be baked into a graph: {_DELAYED_REASON}")

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale.device != x.device:
            object.__setattr__(self, "scale", self.scale.to(x.device))
            object.__setattr__(self, "amax_history", self.amax_history.to(x.device))
        scale = self.scale.clone().reshape(())
        self._record_amax(tensor_amax(x))
        return scale

    def _record_amax(self, amax: torch.Tensor) -> None:
        history = self.amax_history
        history.copy_(torch.roll(history, 1))
        history[0] = amax
        reference = history.amax() if self.amax_compute_algo == "max" else history[0]
        fmax = FP8_MAX[self.fp8_dtype] / (2.0**self.margin)
        self.scale.copy_(scale_from_amax(reference, fmax).reshape(1))
