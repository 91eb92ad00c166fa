"""``L2Normalization``: TE's parameter-free query/key norm, through the generated
``l2normalization`` op (``MultiheadAttention(qk_norm_type="L2Normalization")``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import is_grad_enabled, is_tensor, nn

from ..generated.l2normalization import call_l2normalization
from ._call import activation_dtype, refuse_torch_func, torch_autocast_on


class L2Normalization(nn.Module):
    """TE's ``L2Normalization``: ``y = x / sqrt(sum(x^2) + eps)`` over the last dim, no
    parameters (fp32 math, float64 for float64 data; the output in the input's dtype),
    through the generated ``l2normalization`` op. TE's keyword-only arguments:
    ``seq_length`` and ``micro_batch_size`` only warm up TE's JIT kernels there, so here
    they are recorded and change nothing. As TE, it runs with ``torch.autocast`` off and
    keeps the input's dtype."""

    def __init__(
        self,
        *,
        eps: float = 1e-6,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        self.eps = float(eps)
        self.seq_length = seq_length
        self.micro_batch_size = micro_batch_size

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        refuse_torch_func(self)  # a torch.func transform: a clear error
        if torch_autocast_on(inp):  # TE: autocast off, the input's dtype kept
            with torch.autocast(inp.device.type, enabled=False):
                return self.forward(inp)
        activation_dtype(self, inp, torch.float32)  # refuses integers
        return call_l2normalization(
            inp=inp,
            input_requires_grad=is_tensor(inp) and inp.requires_grad,
            eps=self.eps,
            is_grad_enabled=is_grad_enabled(),
        )[0]

    def get_extra_state(self) -> torch.Tensor:
        """TE's ``_extra_state`` of an operation with no quantizer: an empty byte tensor
        (so a TE checkpoint's ``q_norm._extra_state`` keys load, and ours load in TE)."""
        return torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state: Any) -> None:
        if state is not None and not (is_tensor(state) and state.numel() == 0):
            raise ValueError(
                f"{type(self).__name__}: _extra_state must be empty (it has no quantizer "
                f"state), got {type(state).__name__}"
                + (f" of {state.numel()} elements" if is_tensor(state) else "")
            )

    def extra_repr(self) -> str:
        return f"eps={self.eps}"
