"""FP8 with one scale per tensor: delayed scaling and current scaling.

Layout: ``_data`` (uint8, logical shape; rowwise), ``_transpose`` (uint8, (K, d0, ...);
columnwise), ``_scale_inv`` (fp32, (1,), always). The two data buffers hold the same
codes, so either usage can be created from the other exactly.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Optional, Union

import torch

from ..constants import DType
from ..kernels import cuda_kernels
from ..runtime import _torch_private as _private
from . import fsdp2
from .encoding import (
    FP8_MAX,
    FP32_MAX,
    cast_to_fp8,
    fp8_dtype_argument,
    fp8_to_float,
    has_inf,
    matrix_dims,
    require_fp8_dtype,
    scale_from_amax,
    te_fp8_dtype,
    tensor_amax,
    transpose_2d_to,
    transposed_shape,
    untransposed_shape,
)
from .quantizer import (
    InnerLayout,
    QuantizedData,
    QuantizedStorage,
    QuantizedTensor,
    Quantizer,
    all_reduce_max,
    check_bool,
    check_choice,
    check_float,
    check_int,
    opaque_value_type,
    quantizer_dataclass,
    usage_fields,
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


@quantizer_dataclass
class _Float8PerTensorQuantizer(Quantizer):
    """What the delayed- and current-scaling per-tensor FP8 quantizers share."""

    fp8_dtype: torch.dtype = torch.float8_e4m3fn

    storage_cls: ClassVar[type] = Float8TensorStorage
    wrapper_cls: ClassVar[type] = Float8Tensor
    format_name: ClassVar[str] = "FP8 per-tensor"

    def _init_fields(self) -> None:
        super()._init_fields()
        require_fp8_dtype(type(self).__name__, self.fp8_dtype)

    @property
    def dtype(self) -> DType:
        """TE's attribute: the FP8 format as a ``te.DType``."""
        return te_fp8_dtype(self.fp8_dtype)

    def supports_only_rowwise_all_gather(self) -> bool:
        return True

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


@opaque_value_type
@quantizer_dataclass
class Float8CurrentScalingQuantizer(_Float8PerTensorQuantizer):
    """Per-tensor FP8 with the scale computed from this tensor's amax (stateless).

    TE's constructor: ``Float8CurrentScalingQuantizer(fp8_dtype, device, *, rowwise,
    columnwise, use_existing_amax, with_amax_reduction, amax_reduction_group,
    force_pow_2_scales, amax_epsilon, scale, amax)``. As in TE, ``device`` is unused
    (a value lives on its input's device) and ``use_existing_amax``, ``scale`` and
    ``amax`` are ignored with TE's ``DeprecationWarning``. ``with_amax_reduction``:
    each quantize takes the maximum amax over ``amax_reduction_group`` (the default
    process group when None) before computing its scale, so every rank quantizes its
    tensor with the group's scale."""

    force_pow_2_scales: bool = False
    amax_epsilon: float = 0.0
    with_amax_reduction: bool = False
    # Extension (TE always gathers FP8): a sequence-parallel all-gather of a tensor this
    # quantizer quantizes moves FP8 codes quantized with the group's amax (True), or the
    # high-precision tensor, quantized once gathered (False). Both give the same bits;
    # FP8 moves half the bytes of bf16 (docs/distributed.md).
    fp8_all_gather: bool = True

    format_name: ClassVar[str] = "FP8 current scaling"

    def __init__(
        self,
        fp8_dtype: Any = torch.float8_e4m3fn,
        device: Any = None,
        *,
        rowwise: Optional[bool] = None,
        columnwise: Optional[bool] = None,
        use_existing_amax: bool = False,
        with_amax_reduction: bool = False,
        amax_reduction_group: Any = None,
        force_pow_2_scales: bool = False,
        amax_epsilon: float = 0.0,
        scale: Optional[torch.Tensor] = None,
        amax: Optional[torch.Tensor] = None,
        fp8_all_gather: bool = True,
        rowwise_usage: Optional[bool] = None,
        columnwise_usage: Optional[bool] = None,
        internal: bool = False,
    ) -> None:
        owner = type(self).__name__
        if use_existing_amax or scale is not None or amax is not None:
            warnings.warn(
                "Float8CurrentScalingQuantizer ignores `use_existing_amax`, `scale`, "
                "and `amax`; kept for backward compatibility and will be removed.",
                DeprecationWarning,
                stacklevel=2,
            )
        del device  # TE's: accepted, unused
        self.amax_reduction_group = amax_reduction_group
        self._construct(
            **usage_fields(owner, rowwise, columnwise, rowwise_usage, columnwise_usage),
            internal=internal,
            fp8_dtype=fp8_dtype_argument(owner, fp8_dtype),
            force_pow_2_scales=force_pow_2_scales,
            amax_epsilon=amax_epsilon,
            with_amax_reduction=with_amax_reduction,
            fp8_all_gather=fp8_all_gather,
        )

    # The recipe class whose quantized weights it makes (recipes.compatible_recipe).
    _COMPATIBLE_RECIPE = "Float8CurrentScaling"

    def _quantize_value(self, x: torch.Tensor, dtype: torch.dtype) -> Any:
        if not self.with_amax_reduction:
            return super()._quantize_value(x, dtype)
        # TE's amax reduction: the group's amax (and Inf flag), then this tensor
        # quantized with it; the value's quantizer no longer reduces (nor holds a group).
        stats = all_reduce_max(self.amax_stats(x), self.amax_reduction_group, type(self).__name__)
        plain = self._derived(with_amax_reduction=False)
        return plain.quantize_with_stats(x, stats, dtype=dtype)

    def lowers_bitwise_on(self, device: Optional[torch.device]) -> bool:
        # On CUDA the fused kernels are recorded as one op (cuda_kernels.eligible).
        return device is not None and device.type == "cuda" and cuda_kernels.available()

    def _init_fields(self) -> None:
        super()._init_fields()
        owner = type(self).__name__
        check_bool(owner, "force_pow_2_scales", self.force_pow_2_scales)
        check_bool(owner, "with_amax_reduction", self.with_amax_reduction)
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
        self, x: torch.Tensor, stats: torch.Tensor, *, dtype: Optional[torch.dtype] = None
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
        return self._quantized_value(inner, x, dtype)


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


@quantizer_dataclass
class Float8Quantizer(_Float8PerTensorQuantizer):
    """Per-tensor FP8 with delayed scaling (TE's ``Float8Quantizer``): stateful.

    TE's constructor, ``Float8Quantizer(scale, amax, fp8_dtype, *, rowwise, columnwise)``:
    the quantizer reads ``scale`` (a one-element fp32 tensor) and records into ``amax``
    the maximum amax of what it quantizes (``calibrate`` overwrites it), both held by
    reference, and leaves updating the scale to whoever owns the two tensors, as TE's
    recipe state does.

    Made by a ``DelayedScaling`` recipe (no ``scale``/``amax``; the keyword-only
    ``margin``, ``amax_history_len``, ``amax_compute_algo`` and
    ``scaling_factor_compute_algo`` are the recipe's) it owns its state: it quantizes
    with ``scale`` (derived from earlier steps' amaxes) and records the tensor's amax
    into ``amax_history[0]`` (``amax`` is that slot). ``update_scale`` then runs TE's
    delayed-scaling update. When it runs: inside ``autocast``, at the exit of the
    outermost region (forward roles); in a backward pass, once at the end of that
    backward (gradient roles, as TE updates them after the backward); otherwise right
    after the quantize. Usage copies share one state. Equality is identity.
    """

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: Any = "max"
    scaling_factor_compute_algo: Any = None

    value_opaque: ClassVar[bool] = False
    not_value_opaque_reason: ClassVar[Optional[str]] = _DELAYED_REASON
    format_name: ClassVar[str] = "FP8 delayed scaling"

    __eq__ = object.__eq__  # type: ignore[assignment]
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __init__(
        self,
        scale: Optional[torch.Tensor] = None,
        amax: Optional[torch.Tensor] = None,
        fp8_dtype: Any = torch.float8_e4m3fn,
        *,
        rowwise: Optional[bool] = None,
        columnwise: Optional[bool] = None,
        margin: int = 0,
        amax_history_len: int = 1024,
        amax_compute_algo: Any = "max",
        scaling_factor_compute_algo: Any = None,
        rowwise_usage: Optional[bool] = None,
        columnwise_usage: Optional[bool] = None,
        internal: bool = False,
    ) -> None:
        owner = type(self).__name__
        self._given_state = (scale, amax)
        self._construct(
            **usage_fields(owner, rowwise, columnwise, rowwise_usage, columnwise_usage),
            internal=internal,
            fp8_dtype=fp8_dtype_argument(owner, fp8_dtype),
            margin=margin,
            amax_history_len=amax_history_len,
            amax_compute_algo=amax_compute_algo,
            scaling_factor_compute_algo=scaling_factor_compute_algo,
        )

    def _init_fields(self) -> None:
        super()._init_fields()
        owner = type(self).__name__
        if not callable(self.amax_compute_algo):
            check_choice(owner, "amax_compute_algo", self.amax_compute_algo, ("max", "most_recent"))
        if self.scaling_factor_compute_algo is not None and not callable(
            self.scaling_factor_compute_algo
        ):
            raise TypeError(
                f"{owner}: scaling_factor_compute_algo must be None or a callable "
                "(amax, scale, fp8_max, recipe) -> scale, got "
                f"{self.scaling_factor_compute_algo!r}"
            )
        object.__setattr__(self, "margin", check_int(owner, "margin", self.margin, 0, 64))
        object.__setattr__(
            self,
            "amax_history_len",
            check_int(owner, "amax_history_len", self.amax_history_len, 1, MAX_AMAX_HISTORY_LEN),
        )
        scale, amax = self.__dict__.pop("_given_state", (None, None))
        if scale is None and amax is None:
            # One state shared by every usage copy (a dict, so a device move is seen by all).
            state = {"scale": torch.ones(1), "amax_history": torch.zeros(self.amax_history_len)}
        else:
            if scale is None:
                scale = torch.ones(1, dtype=torch.float32, device=amax.device)
            if amax is None:
                amax = torch.zeros(1, dtype=torch.float32, device=scale.device)
            for name, tensor in (("scale", scale), ("amax", amax)):
                if not isinstance(tensor, torch.Tensor) or tensor.numel() != 1:
                    raise ValueError(
                        f"{owner}: {name} must be a one-element tensor, got "
                        f"{type(tensor).__name__}"
                        + (
                            f" of shape {tuple(tensor.shape)}"
                            if isinstance(tensor, torch.Tensor)
                            else ""
                        )
                    )
                if tensor.dtype != torch.float32:
                    raise TypeError(f"{owner}: {name} must be float32, got {tensor.dtype}")
            state = {"scale": scale, "amax": amax}  # the caller's tensors, by reference
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_queued_task", [None])

    @property
    def owns_state(self) -> bool:
        """Whether this quantizer keeps its own amax history and updates its own scale
        (made without TE's ``scale``/``amax`` tensors)."""
        return "amax_history" in self._state

    @property
    def scale(self) -> torch.Tensor:
        return self._state["scale"]

    @property
    def amax(self) -> torch.Tensor:
        """TE's attribute: the tensor the next quantizes record their amax into (the
        owned history's slot 0, a one-element view)."""
        if self.owns_state:
            return self._state["amax_history"][:1]
        return self._state["amax"]

    @property
    def amax_history(self) -> torch.Tensor:
        if not self.owns_state:
            raise AttributeError(
                f"{type(self).__name__} made with TE's scale and amax tensors keeps no amax "
                "history (its scale is updated by whoever owns those tensors)"
            )
        return self._state["amax_history"]

    def _require_own_state(self, what: str) -> None:
        if not self.owns_state:
            raise RuntimeError(
                f"{type(self).__name__}.{what}: this quantizer was made with TE's scale and "
                "amax tensors; their owner updates the scale (it keeps no amax history)"
            )

    def load_state(self, scale: torch.Tensor, amax_history: torch.Tensor) -> None:
        """Replace the scaling state (checkpoint loading); shapes must match."""
        self._require_own_state("load_state")
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
        new = self._replace()
        object.__setattr__(new, "_state", {k: v.clone() for k, v in self._state.items()})
        return new

    def observe(self, x: torch.Tensor) -> None:
        """Record ``x``'s amax and update the scale now (seeds the state from a tensor
        before its first quantize, e.g. a weight made under ``quantized_model_init``)."""
        self._require_own_state("observe")
        slot = self.amax_history[0]
        slot.copy_(torch.maximum(slot, tensor_amax(x).to(slot.device)))
        self.update_scale()

    def calibrate(self, tensor: torch.Tensor) -> None:
        """TE's: record ``tensor``'s amax (the maximum magnitude, NaN and Inf included)
        in place of the current one, without quantizing it or updating the scale."""
        amin, amax = tensor.detach().float().aminmax()
        slot = self.amax
        slot.copy_(torch.maximum(-amin, amax).to(slot.device).reshape(slot.shape))

    def is_requantization_safe(self) -> bool:
        return False

    def _encoding(self) -> tuple[Any, ...]:
        return (self.fp8_dtype,)  # the scale a value was made with is its scale_inv

    def _same_quantizer(self, other: Quantizer) -> bool:
        return (
            type(other) is type(self)
            and other._state is self._state
            and all(
                getattr(other, name) == getattr(self, name)
                for name in ("fp8_dtype", "margin", "amax_history_len")
            )
            and other.amax_compute_algo == self.amax_compute_algo
            and other.scaling_factor_compute_algo == self.scaling_factor_compute_algo
        )

    # The recipe class whose quantized weights it makes (recipes.compatible_recipe).
    _COMPATIBLE_RECIPE = "DelayedScaling"

    def _replace(self, **changes: Any) -> Quantizer:
        new = copy.copy(self)  # shares _state: one state, several usages
        new._drop_shared_marks()  # the copy's own (its boundary text is its identity)
        for name, value in changes.items():
            object.__setattr__(new, name, value)
        return new

    def __fx_repr__(self) -> tuple[str, dict[str, Any]]:
        raise TypeError(f"{type(self).__name__} cannot be baked into a graph: {_DELAYED_REASON}")

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the recipe that made it (``_recipe`` makes an equal one from
        the fields), so a quantized weight loads with ``weights_only=True``."""
        state = super().__getstate__()
        state.pop("_teops_recipe", None)
        return state

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        if not self.owns_state:
            scale = self.scale.detach().to(x.device, torch.float32).clone().reshape(())
            amax = self._state["amax"]
            amax.copy_(torch.maximum(amax, tensor_amax(x).to(amax.device).reshape(amax.shape)))
            return scale
        if self.scale.device != x.device:
            for key, value in self._state.items():
                self._state[key] = value.to(x.device)
        scale = self.scale.clone().reshape(())
        self._record_amax(tensor_amax(x))
        return scale

    def update_quantized(
        self,
        src: torch.Tensor,
        dst: QuantizedData,
        *,
        noop_flag: Optional[torch.Tensor] = None,
    ) -> QuantizedData:
        """As the base's; with ``noop_flag`` set to 1 the amax it records and any scale
        update it makes are undone on the device too."""
        if noop_flag is None:
            return super().update_quantized(src, dst)
        before = {key: value.clone() for key, value in self._state.items()}
        super().update_quantized(src, dst, noop_flag=noop_flag)
        skip = noop_flag.reshape(()) == 1
        for key, value in self._state.items():
            value.copy_(torch.where(skip.to(value.device), before[key].to(value.device), value))
        return dst

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
        """TE's delayed-scaling update: take the amax of the history (``max``), its
        newest entry (``most_recent``) or what a callable ``amax_compute_algo`` returns
        for it (called with the history as TE's ``(amax_history_len, 1)`` tensor), roll
        the history one step (``roll(-1)``, slot 0 zeroed for the next step), and set
        the scale: ``scaling_factor_compute_algo(amax, scale, fp8_max, recipe)`` when
        given (TE's signature; ``recipe`` the ``DelayedScaling`` this quantizer was
        made from), else ``(fp8_max / amax) / 2**margin``, keeping the previous scale
        where the amax is 0 or not finite and using FP32_MAX where the quotient
        overflows."""
        self._require_own_state("update_scale")
        history, scale = self.amax_history, self.scale
        algo = self.amax_compute_algo
        if callable(algo):
            amax = torch.as_tensor(algo(history.reshape(-1, 1))).to(history).reshape(())
        elif algo == "max":
            amax = history.amax()
        else:
            amax = history[0].clone()
        if history.shape[0] > 1:
            history.copy_(torch.roll(history, -1, 0))
        history[0] = 0.0
        fp8_max = FP8_MAX[self.fp8_dtype]
        if self.scaling_factor_compute_algo is not None:
            new = self.scaling_factor_compute_algo(
                amax.reshape(1), scale.clone(), fp8_max, self._recipe()
            )
            scale.copy_(torch.as_tensor(new).to(scale).reshape(1))
            return
        fp8_max_t = torch.full_like(amax, fp8_max)
        new = (fp8_max_t / amax) / (2.0**self.margin)
        new = torch.where((amax > 0) & torch.isfinite(amax), new, scale.reshape(()))
        new = torch.where(torch.isinf(new), torch.full_like(new, FP32_MAX), new)
        scale.copy_(new.reshape(1))

    # How recipes.py makes the DelayedScaling of a quantizer's settings (set there: the
    # recipes import the formats, so a format cannot import them back).
    recipe_of_settings: ClassVar[Optional[Callable[[Float8Quantizer], Any]]] = None

    def _recipe(self) -> Any:
        """The ``DelayedScaling`` a ``scaling_factor_compute_algo`` is given: the one
        that made this quantizer, else one of this quantizer's settings (a quantizer
        decoded from an op boundary's text, or unpickled, carries no recipe)."""
        made_by = self.__dict__.get("_teops_recipe")
        if made_by is not None:
            return made_by
        if Float8Quantizer.recipe_of_settings is None:
            raise RuntimeError(
                "Float8Quantizer.scaling_factor_compute_algo needs the recipes module "
                "(import transformer_engine_ops.recipe)"
            )
        return Float8Quantizer.recipe_of_settings(self)


# ``torch.load(weights_only=True)`` (torch's default) rebuilds quantized weights from
# these classes and the quantizers they hold.
torch.serialization.add_safe_globals(
    [Float8Tensor, Float8TensorStorage, Float8CurrentScalingQuantizer, Float8Quantizer]
)
