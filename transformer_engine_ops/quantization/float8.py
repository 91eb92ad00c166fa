"""FP8 with one scale per tensor: delayed scaling and current scaling.

Layout: ``_data`` (uint8, logical shape; rowwise), ``_transpose`` (uint8, (K, d0, ...);
columnwise), ``_scale_inv`` (fp32, (1,), always). The two data buffers hold the same
codes, so either usage can be created from the other exactly.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Optional, Union

import torch

from ..runtime import _torch_private as _private
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
from . import cuda_kernels, fsdp2
from .encoding import (
    FP8_MAX,
    FP32_MAX,
    cast_to_fp8,
    fp8_to_float,
    has_inf,
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
    "deferred_scale_updates",
]


class _Float8Data(QuantizedData):
    INNER_NAMES: ClassVar[tuple[str, ...]] = ("_data", "_transpose", "_scale_inv")
    ROWWISE_NAMES: ClassVar[tuple[str, ...]] = ("_data",)
    COLUMNWISE_NAMES: ClassVar[tuple[str, ...]] = ("_transpose",)
    # One scale: the transpose holds the data's codes (TE makes one from the other).
    USAGES_SHARE_VALUES: ClassVar[bool] = True

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

    def _rows(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        # One scale for the tensor: a block of rows is encoded as a tensor of its own.
        inner = {"_scale_inv": self._scale_inv}
        if self._data is not None:
            inner["_data"] = self._data[start:stop]
        if self._transpose is not None:
            inner["_transpose"] = self._transpose[:, start:stop]
        return inner

    def gathered_rows(
        self,
        all_gather: Callable[[torch.Tensor], torch.Tensor],
        parts: int,
        *,
        rowwise: bool,
        columnwise: bool,
    ) -> Float8TensorStorage:
        """Every rank's shard concatenated along dim 0 (``all_gather(t)`` gathers a
        contiguous ``t`` of each rank), 2-D, with the usages asked for. The rowwise
        codes move (one byte per element; the transposed codes cannot be gathered along
        dim 0, TE's neither) and the transpose is derived after. The shards must share
        one scale (a reduced amax): the scale-inverse is this shard's, not sent."""
        if self._data is None:
            raise ValueError(
                f"{type(self).__name__}: only rowwise FP8 data is gathered along dim 0; "
                "this value holds columnwise data only"
            )
        m, k = matrix_dims(self.shape)
        data = all_gather(self._data.reshape(m, k).contiguous())
        quantizer = self._quantizer.with_usage(rowwise=True, columnwise=False).with_internal(True)
        inner = {"_data": data, "_scale_inv": self._scale_inv}
        gathered = Float8TensorStorage(
            inner, quantizer=quantizer, dtype=self._dtype, shape=(m * parts, k)
        )
        gathered.update_usage(rowwise_usage=rowwise, columnwise_usage=columnwise)
        return gathered

    def _derive_usage(self, columnwise: bool) -> dict[str, torch.Tensor]:
        m, k = matrix_dims(self.shape)
        if columnwise:
            return {"_transpose": transpose_2d_to(self._data.reshape(m, k), (k, *self.shape[:-1]))}
        return {"_data": transpose_2d_to(self._transpose.reshape(k, m), self.shape)}


class Float8TensorStorage(_Float8Data, QuantizedStorage):
    """Bare per-tensor FP8 value."""


class Float8Tensor(_Float8Data, QuantizedTensor):
    """Per-tensor FP8 wrapper tensor subclass; as a ``fully_shard`` parameter, gathered
    in FP8 (``quantization/fsdp2.py``)."""

    def fsdp_pre_all_gather(
        self,
        mesh: Any,
        orig_size: torch.Size,
        contiguous_orig_stride: Any,
        module: Any,
        mp_policy: Any,
    ) -> Any:
        return fsdp2.pre_all_gather(self, mesh, orig_size)

    def fsdp_post_all_gather(
        self, all_gather_outputs: Any, metadata: Any, param_dtype: torch.dtype, *, out: Any = None
    ) -> Any:
        return fsdp2.post_all_gather(self, all_gather_outputs, metadata, param_dtype, out)

    def _requantized(self, value: torch.Tensor) -> Mapping[str, torch.Tensor]:
        group = fsdp2.amax_group(self)
        if group is None:
            return super()._requantized(value)
        return fsdp2.quantize_with_group_amax(self, value, group)


def _scale_inv(x32: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``1 / scale``, or +Inf when ``x32`` holds an Inf: the codes saturate, the value
    dequantizes to non-finite numbers, and the overflow stays detectable downstream."""
    inv = 1.0 / scale
    return torch.where(has_inf(x32), torch.full_like(inv, float("inf")), inv).reshape(1)


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
            "_scale_inv": _scale_inv(x32, scale),
        }


@dataclasses.dataclass(frozen=True)
class Float8CurrentScalingQuantizer(_Float8PerTensorQuantizer):
    """Per-tensor FP8 with the scale computed from this tensor's amax (stateless)."""

    force_pow_2_scales: bool = False
    amax_epsilon: float = 0.0
    # Extension (TE always gathers FP8): a sequence-parallel all-gather of a tensor this
    # quantizer quantizes moves FP8 codes quantized with the group's amax (True), or the
    # high-precision tensor, quantized once gathered (False). Both give the same bits;
    # FP8 moves half the bytes of bf16 (docs/distributed.md).
    fp8_all_gather: bool = True

    format_name: ClassVar[str] = "FP8 current scaling"

    def lowers_bitwise_on(self, device: Optional[torch.device]) -> bool:
        # On CUDA the fused kernels are recorded as one op (cuda_kernels.eligible).
        return device is not None and device.type == "cuda" and cuda_kernels.available()

    def _init_fields(self) -> None:
        super()._init_fields()
        owner = type(self).__name__
        check_bool(owner, "force_pow_2_scales", self.force_pow_2_scales)
        check_bool(owner, "fp8_all_gather", self.fp8_all_gather)
        object.__setattr__(
            self, "amax_epsilon", check_float(owner, "amax_epsilon", self.amax_epsilon)
        )

    def fused_options(self) -> dict[str, Any]:
        """This quantizer's settings as the fused CUDA kernels' keyword arguments."""
        return {
            "epsilon": self.amax_epsilon,
            "force_pow_2": self.force_pow_2_scales,
            "rowwise": self.rowwise_usage,
            "columnwise": self.columnwise_usage,
        }

    def _quantize_impl(self, x: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        if cuda_kernels.eligible(x):  # fused Triton kernels; same bits as the reference
            return self._fused(x, False)[0]
        return super()._quantize_impl(x)

    def _fused_bias_grad_impl(
        self, x: torch.Tensor
    ) -> Optional[tuple[dict[str, Optional[torch.Tensor]], torch.Tensor]]:
        if not cuda_kernels.eligible(x):
            return None
        return self._fused(x, True)  # type: ignore[return-value]  # 2-D: the caller checked

    def _fused(
        self, x: torch.Tensor, bias_grad: bool
    ) -> tuple[dict[str, Optional[torch.Tensor]], Optional[torch.Tensor]]:
        # ``cuda_kernels``' entry points with :meth:`fused_options`, without building
        # that dict per call (a quantize is on a host-bound path).
        return cuda_kernels.fused_quantize(
            x,
            self.fp8_dtype,
            self.amax_epsilon,
            self.force_pow_2_scales,
            self.rowwise_usage,
            self.columnwise_usage,
            bias_grad,
        )

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        return self._scale_of_amax(tensor_amax(x))

    def _scale_of_amax(self, amax: torch.Tensor) -> torch.Tensor:
        return scale_from_amax(
            amax,
            FP8_MAX[self.fp8_dtype],
            force_pow_2=self.force_pow_2_scales,
            epsilon=self.amax_epsilon,
        )

    # ----- amax reduction (TE's ``with_amax_reduction``) -----

    def amax_stats(self, x: torch.Tensor) -> torch.Tensor:
        """What the scale of ``x`` depends on, as fp32 ``(2,)``: its finite amax, and 1
        where it holds an Inf (0 otherwise). The element-wise maximum of the stats of
        several tensors is exactly the stats of their concatenation, so a MAX all-reduce
        of each rank's stats gives every rank the stats of the whole tensor."""
        self.check_input(x)
        x32 = x.detach().float()
        return torch.stack([tensor_amax(x32), has_inf(x32).float()])

    def quantize_with_stats(
        self, x: torch.Tensor, stats: torch.Tensor
    ) -> Union[QuantizedStorage, QuantizedTensor]:
        """``x`` quantized with the scale of ``stats`` (:meth:`amax_stats` of a larger
        tensor ``x`` is part of) instead of its own: every shard of a tensor quantized
        with the reduced stats holds exactly the codes and scale-inverse of the whole
        tensor quantized at once. The plain-PyTorch path on every device (the fused CUDA
        kernels compute their own amax; they give the same bits as this one)."""
        self.check_input(x)
        if tuple(stats.shape) != (2,) or stats.dtype != torch.float32:
            raise ValueError(
                f"{type(self).__name__}.quantize_with_stats: stats must be the fp32 (2,) "
                f"tensor amax_stats returns, got {stats.dtype} {tuple(stats.shape)}"
            )
        x32 = x.detach().float()
        scale = self._scale_of_amax(stats[0])
        data = cast_to_fp8(x32 * scale, self.fp8_dtype)
        inv = 1.0 / scale
        inv = torch.where(stats[1] > 0, torch.full_like(inv, float("inf")), inv).reshape(1)
        m, k = matrix_dims(x.shape)
        inner = {
            "_data": data if self.rowwise_usage else None,
            "_transpose": (
                transpose_2d_to(data.reshape(m, k), transposed_shape(x.shape))
                if self.columnwise_usage
                else None
            ),
            "_scale_inv": inv,
        }
        return self._quantized_value(inner, x)


# Longest amax history a delayed-scaling quantizer keeps (TE defaults to 1024).
MAX_AMAX_HISTORY_LEN = 1 << 20

_DELAYED_REASON = (
    "delayed scaling keeps an amax history and a scale tensor that every quantize call "
    "updates; that state cannot be a graph constant, so modules run it eagerly "
    "(and refuse it under fullgraph=True)"
)


class _DeferredUpdates(threading.local):
    """Delayed-scaling quantizers of this thread that recorded an amax since their last
    scale update, while updates are deferred (inside ``autocast``)."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: dict[int, Float8Quantizer] = {}


_DEFERRED = _DeferredUpdates()


@contextlib.contextmanager
def deferred_scale_updates() -> Iterator[None]:
    """Defer delayed-scaling updates of forward quantizes to the end of the outermost
    region, as TE updates its forward scales when ``autocast`` exits: every quantize of
    one step uses the scale of the previous steps, and the step's amax (the max over its
    quantizes) enters the history once."""
    _DEFERRED.depth += 1
    try:
        yield
    finally:
        _DEFERRED.depth -= 1
        if _DEFERRED.depth == 0:
            pending, _DEFERRED.pending = _DEFERRED.pending, {}
            for quantizer in pending.values():
                quantizer.update_scale()


def _in_backward() -> bool:
    return _private.current_graph_task_id() != -1


@dataclasses.dataclass(frozen=True, eq=False)
class Float8Quantizer(_Float8PerTensorQuantizer):
    """Per-tensor FP8 with delayed scaling (TE's ``Float8Quantizer``): stateful.

    Quantizes with ``scale`` (derived from earlier steps' amaxes) and records the tensor's
    amax into ``amax_history[0]`` (the max over the step's quantizes). ``update_scale``
    then runs TE's delayed-scaling update. When it runs: inside ``autocast``, at the exit
    of the outermost region (forward roles); in a backward pass, once at the end of that
    backward (gradient roles, as TE updates them after the backward); otherwise right
    after the quantize. Usage copies share one state. Equality is identity.
    """

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"

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
        # One state shared by every usage copy (a dict, so a device move is seen by all).
        object.__setattr__(
            self,
            "_state",
            {"scale": torch.ones(1), "amax_history": torch.zeros(self.amax_history_len)},
        )
        object.__setattr__(self, "_queued_task", [None])

    @property
    def scale(self) -> torch.Tensor:
        return self._state["scale"]

    @property
    def amax_history(self) -> torch.Tensor:
        return self._state["amax_history"]

    def load_state(self, scale: torch.Tensor, amax_history: torch.Tensor) -> None:
        """Replace the scaling state (checkpoint loading); shapes must match."""
        if tuple(scale.shape) not in ((1,), ()) or amax_history.shape != self.amax_history.shape:
            raise ValueError(
                f"{type(self).__name__}: cannot load a scale of shape {tuple(scale.shape)} and "
                f"an amax history of shape {tuple(amax_history.shape)} into a state of "
                f"amax_history_len={self.amax_history_len}"
            )
        device = self.scale.device
        self._state["scale"] = scale.detach().float().reshape(1).to(device, copy=True)
        self._state["amax_history"] = amax_history.detach().float().to(device, copy=True)

    def snapshot(self) -> Float8Quantizer:
        """A copy with its own copy of the state (quantizing with it changes nothing here)."""
        new = copy.copy(self)
        object.__setattr__(new, "_state", {k: v.clone() for k, v in self._state.items()})
        object.__setattr__(new, "_queued_task", [None])
        return new

    def observe(self, x: torch.Tensor) -> None:
        """Record ``x``'s amax and update the scale now (seeds the state from a tensor
        before its first quantize, e.g. a weight made under ``quantized_model_init``)."""
        slot = self.amax_history[0]
        slot.copy_(torch.maximum(slot, tensor_amax(x).to(slot.device)))
        self.update_scale()

    def _replace(self, **changes: Any) -> Quantizer:
        new = copy.copy(self)  # shares _state: one state, several usages
        for name, value in changes.items():
            object.__setattr__(new, name, value)
        return new

    def __fx_repr__(self) -> tuple[str, dict[str, Any]]:
        raise TypeError(f"{type(self).__name__} cannot be baked into a graph: {_DELAYED_REASON}")

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale.device != x.device:
            for key, value in self._state.items():
                self._state[key] = value.to(x.device)
        scale = self.scale.clone().reshape(())
        self._record_amax(tensor_amax(x))
        return scale

    def _record_amax(self, amax: torch.Tensor) -> None:
        slot = self.amax_history[0]
        slot.copy_(torch.maximum(slot, amax.reshape(())))
        if _in_backward():
            task = _private.current_graph_task_id()
            if self._queued_task[0] != task:
                self._queued_task[0] = task

                def update() -> None:
                    self._queued_task[0] = None
                    self.update_scale()

                _private.queue_backward_callback(update)
        elif _DEFERRED.depth > 0:
            _DEFERRED.pending[id(self._state)] = self
        else:
            self.update_scale()

    def update_scale(self) -> None:
        """TE's delayed-scaling update: take the amax of the history (``max``) or its
        newest entry (``most_recent``), roll the history one step (``roll(-1)``, slot 0
        zeroed for the next step), and set ``scale = (fp8_max / amax) / 2**margin``,
        keeping the previous scale where the amax is 0 or not finite and using FP32_MAX
        where the quotient overflows."""
        history, scale = self.amax_history, self.scale
        amax = history.amax() if self.amax_compute_algo == "max" else history[0].clone()
        if history.shape[0] > 1:
            history.copy_(torch.roll(history, -1, 0))
        history[0] = 0.0
        fp8_max = torch.full_like(amax, FP8_MAX[self.fp8_dtype])
        new = (fp8_max / amax) / (2.0**self.margin)
        new = torch.where((amax > 0) & torch.isfinite(amax), new, scale.reshape(()))
        new = torch.where(torch.isinf(new), torch.full_like(new, FP32_MAX), new)
        scale.copy_(new.reshape(1))
