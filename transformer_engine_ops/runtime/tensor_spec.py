"""TensorSpec: a data-free description of a plain or quantized tensor.

Fake kernels compute specs, not tensors: a spec knows the inner buffers a real value of
that shape would have (names, order, shapes, dtypes) and can allocate them with
``torch.empty`` on its device, which under FakeTensorMode touches no device memory.
A plain tensor is described as one inner buffer named ``"data"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional, Union

import torch

from ..quantization.quantizer import (
    FlattenContext,
    InnerLayout,
    QuantizedData,
    QuantizedStorage,
    QuantizedTensor,
    Quantizer,
    flatten_context,
)

__all__ = ["PLAIN_INNER_NAME", "TensorSpec", "to_tensor_spec"]

PLAIN_INNER_NAME = "data"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape, dtype, quantizer (which holds usage and storage/wrapper form), device.

    ``dtype`` is the high-precision (fake) dtype of a quantized value. ``device`` None
    means torch's default device.
    """

    shape: tuple[Any, ...]
    dtype: torch.dtype
    quantizer: Optional[Quantizer] = None
    requires_grad: bool = False
    device: Optional[torch.device] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if isinstance(self.device, str):
            object.__setattr__(self, "device", torch.device(self.device))

    @property
    def is_quantized(self) -> bool:
        return self.quantizer is not None

    def with_usage(
        self, *, rowwise: Optional[bool] = None, columnwise: Optional[bool] = None
    ) -> TensorSpec:
        """This spec with other quantized usage flags (TensorSpec is immutable)."""
        if self.quantizer is None:
            raise ValueError("with_usage on a TensorSpec of a plain (unquantized) tensor")
        quantizer = self.quantizer.with_usage(rowwise=rowwise, columnwise=columnwise)
        return dataclasses.replace(self, quantizer=quantizer)

    def inner_layout(self) -> InnerLayout:
        """(name, shape, dtype) of each inner buffer, in flatten order."""
        if self.quantizer is None:
            return ((PLAIN_INNER_NAME, self.shape, self.dtype),)
        return self.quantizer.inner_layout(self.shape)

    def inner_names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.inner_layout())

    def create_metadata(self) -> Optional[FlattenContext]:
        """The ``__tensor_flatten__`` context a real value would have (None if plain)."""
        if self.quantizer is None:
            return None
        return flatten_context(self.quantizer, self.dtype)

    def create_inner_tensors(self) -> list[torch.Tensor]:
        """Uninitialised inner buffers (``torch.empty`` on ``device``), in flatten order."""
        return [
            torch.empty(shape, dtype=dtype, device=self.device)
            for _, shape, dtype in self.inner_layout()
        ]

    def assemble(
        self, inner: Sequence[torch.Tensor]
    ) -> Union[torch.Tensor, QuantizedStorage, QuantizedTensor]:
        """Rebuild the value from inner buffers given in :meth:`inner_names` order.

        Does not set ``requires_grad`` (autograd owns that at an op boundary).
        """
        names = self.inner_names()
        if len(inner) != len(names):
            raise ValueError(
                f"TensorSpec.assemble: expected {len(names)} inner tensors {names}, "
                f"got {len(inner)}"
            )
        if self.quantizer is None:
            return inner[0]
        cls = self.quantizer.storage_cls if self.quantizer.internal else self.quantizer.wrapper_cls
        return cls.__tensor_unflatten__(
            dict(zip(names, inner, strict=False)), self.create_metadata(), self.shape, None
        )

    def create_tensor(self) -> Union[torch.Tensor, QuantizedStorage, QuantizedTensor]:
        """An uninitialised value matching this spec (fake under FakeTensorMode)."""
        if self.quantizer is None:
            return torch.empty(
                self.shape, dtype=self.dtype, device=self.device, requires_grad=self.requires_grad
            )
        value = self.assemble(self.create_inner_tensors())
        if self.requires_grad and isinstance(value, QuantizedTensor):
            value.requires_grad_(True)
        return value


def to_tensor_spec(t: Union[torch.Tensor, QuantizedData]) -> TensorSpec:
    """Describe ``t`` (plain tensor, quantized wrapper or bare storage) without its data."""
    if isinstance(t, QuantizedData):
        return TensorSpec(
            shape=tuple(t.shape),
            dtype=t._dtype,
            quantizer=t._quantizer,
            requires_grad=bool(getattr(t, "requires_grad", False)),
            device=t.device,
        )
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"to_tensor_spec: expected a tensor or quantized value, got {type(t)}")
    return TensorSpec(
        shape=tuple(t.shape), dtype=t.dtype, requires_grad=t.requires_grad, device=t.device
    )
