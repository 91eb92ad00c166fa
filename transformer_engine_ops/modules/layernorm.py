"""``LayerNorm`` and ``RMSNorm``: TE's standalone norms, through the generated ``layernorm`` op.

Constructor arguments follow TE 2.20.2 (``normalized_shape, eps, sequence_parallel,
params_dtype, zero_centered_gamma, hidden_size, **kwargs`` with ``device``/``dtype``
among the keywords); parameters are ``weight`` (and ``bias`` for LayerNorm), with
``_extra_state`` in the state dict as TE writes it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import is_grad_enabled, is_tensor, nn

from ..generated.layernorm import call_layernorm
from ._base import ExtraStateMixin
from ._call import activation_dtype, refuse_torch_func, torch_autocast_on, under_torch_autocast
from ._device import default_device


def _hidden_size(cls: str, normalized_shape: Any, hidden_size: int | None) -> int:
    if normalized_shape is None:
        if hidden_size is None:
            raise ValueError(f"{cls}: pass normalized_shape (or the deprecated hidden_size)")
        warnings.warn(
            f"{cls}: `hidden_size` is deprecated, use `normalized_shape`",
            DeprecationWarning,
            stacklevel=3,
        )
        normalized_shape = hidden_size
    elif hidden_size is not None:
        raise ValueError(f"{cls}: pass normalized_shape or hidden_size, not both")
    shape = (
        (normalized_shape,)
        if isinstance(normalized_shape, int)
        else tuple(normalized_shape)
        if isinstance(normalized_shape, Iterable)
        else None
    )
    if shape is None or len(shape) != 1 or not isinstance(shape[0], int) or shape[0] < 1:
        raise NotImplementedError(
            f"{cls}: normalized_shape={normalized_shape!r}: only one positive normalized "
            "dimension (the last) is implemented"
        )
    return shape[0]


class _Norm(ExtraStateMixin, nn.Module):
    normalization = "LayerNorm"

    def __init__(
        self,
        normalized_shape: Iterable[int] | int | None = None,
        eps: float = 1e-5,
        sequence_parallel: bool | None = None,
        params_dtype: torch.dtype | None = None,
        zero_centered_gamma: bool = False,
        hidden_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        cls = type(self).__name__
        hidden = _hidden_size(cls, normalized_shape, hidden_size)
        device = default_device(kwargs.pop("device", None))  # TE's: CUDA where available
        dtype = kwargs.pop("dtype", None)
        if params_dtype is not None:
            if dtype is not None:
                raise ValueError(f"{cls}: pass dtype or params_dtype (deprecated), not both")
            dtype = params_dtype
        if kwargs:
            raise TypeError(f"{cls}: unexpected keyword argument(s) {sorted(kwargs)}")
        self.normalized_shape = (hidden,)
        self.eps = float(eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        # A Megatron-LM marker only (TE reads it outside the module); kept for parity.
        self.sequence_parallel = sequence_parallel
        dtype = dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.empty(hidden, dtype=dtype, device=device))
        if self.normalization == "LayerNorm":
            self.bias = nn.Parameter(torch.empty(hidden, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        refuse_torch_func(self)  # a torch.func transform: a clear error
        if torch_autocast_on(inp):  # TE's rule: cast the input, run with autocast off
            return under_torch_autocast(_Norm.forward, self, inp)
        activation_dtype(self, inp, self.weight.dtype)  # refuses integers
        bias = self.bias
        return call_layernorm(
            inp=inp,
            weight=self.weight,
            bias=bias,
            input_requires_grad=is_tensor(inp) and inp.requires_grad,
            weight_requires_grad=self.weight.requires_grad,
            bias_requires_grad=bias is not None and bias.requires_grad,
            normalization=self.normalization,
            eps=self.eps,
            zero_centered_gamma=self.zero_centered_gamma,
            is_grad_enabled=is_grad_enabled(),
        )[0]

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"zero_centered_gamma={self.zero_centered_gamma}"
        )


class LayerNorm(_Norm):
    """``y = (x - mean) / sqrt(var + eps) * gamma + beta`` over the last dim (fp32 math,
    float64 for float64 data);
    with ``zero_centered_gamma`` the weight stores ``gamma - 1``."""

    normalization = "LayerNorm"


class RMSNorm(_Norm):
    """``y = x / sqrt(mean(x^2) + eps) * gamma`` over the last dim (fp32 math, float64
    for float64 data)."""

    normalization = "RMSNorm"
