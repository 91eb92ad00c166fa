"""Calling an op from a module: eagerly through its implementations, compiled through
its generated custom op, or eagerly with a named reason where the op path cannot serve.

The same two paths ``modules/linear.py`` takes for Linear, written once for every op
whose user outputs are plain tensors (one flat slot each). The generator's call
functions replace this module once they exist.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from ..runtime.custom_ops import registration_error
from ..runtime.fallback import run_eagerly
from ..runtime.opaque import quantizer_compile_limitation, value_type_registration_error
from ..runtime.quantizer import QuantizedData
from .autocast import RecipeQuantizers

_REGISTRATION_PROBLEM = registration_error() or value_type_registration_error()
_QUANTIZER_LIMITATION = quantizer_compile_limitation()


class _EagerOp(torch.autograd.Function):
    """The op's forward and backward implementations, with no op boundary."""

    @staticmethod
    def forward(ctx: Any, op: OpCall, args: Any, *grad_inputs: Any) -> Any:
        outputs, saved = op.forward_impl(args)
        ctx.op = op
        ctx.backward_args = op.setup_context(args, saved)
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[Any, ...]:
        backward_args = ctx.backward_args
        ctx.backward_args = None
        backward_args.grad_outputs = list(grad_outputs)
        return (None, None, *ctx.op.backward_impl(backward_args))


class OpCall:
    """Calls one generated op (``generated.<name>``) with a forward bundle."""

    def __init__(self, generated: ModuleType, name: str, flatten: Any) -> None:
        self.name = name
        self.forward_impl = getattr(generated, f"{name}_forward")
        self.backward_impl = getattr(generated, f"{name}_backward")
        self.setup_context = getattr(generated, f"{name}_setup_context")
        self.flatten = flatten  # the generated flatten of the forward bundle
        self.op = getattr(generated, f"{name}_fwd")
        self.grad_fields: tuple[str, ...] = generated.GRAD_FIELDS

    def __call__(
        self, args: Any, n_outputs: int, quantizers: RecipeQuantizers | None = None
    ) -> tuple[Any, ...]:
        """The op's first ``n_outputs`` outputs (plain tensors)."""
        if torch.compiler.is_compiling():
            reason = self.unsupported_reason(args, quantizers)
            if reason is None:
                flat = self.op(*self.flatten(args))
                return tuple(flat[:n_outputs])
            return run_eagerly(reason, self.eager, args)
        return self.eager(args)

    def unsupported_reason(self, args: Any, quantizers: RecipeQuantizers | None) -> str | None:
        """Why the op path cannot serve this call (None when it can)."""
        if _REGISTRATION_PROBLEM is not None:
            return _REGISTRATION_PROBLEM
        if quantizers is not None and quantizers.compile_blocker is not None:
            return quantizers.compile_blocker
        if quantizers is not None and _QUANTIZER_LIMITATION is not None:
            return _QUANTIZER_LIMITATION
        if isinstance(getattr(args, "inp", None), QuantizedData):
            return "a quantized input tensor"
        return None

    def eager(self, args: Any) -> tuple[Any, ...]:
        # The generated flatten checks every field, as the compiled path does.
        self.flatten(args)
        if not args.is_grad_enabled:
            outputs, _ = self.forward_impl(args)
            return tuple(outputs)
        grad_inputs = [getattr(args, f) for f in self.grad_fields]
        return _EagerOp.apply(self, args, *grad_inputs)
