"""What every module shares while it builds an op's forward bundle: the recipe's GEMM
fields, the activation dtype, ``torch.autocast``, zero-feature GEMMs and TE's weight
caching rule. How a bundle reaches its op (eager, compiled, or eagerly under compile
for a declared reason) is the generated ``call_<op>``'s business, not the modules'.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import is_autocast_enabled, is_tensor
from torch.compiler import is_compiling

from ..ops.linear import BackwardOverride
from ..quantization.availability import recipe_refusal
from ..quantization.quantizer import QuantizedData
from ..runtime._torch_private import functorch_transform_active
from ..runtime.values import GemmConfig
from .autocast import RecipeQuantizers

# A recipe's backward_override string -> the ops' enum.
BACKWARD_OVERRIDES = {
    None: None,
    "high_precision": BackwardOverride.HIGH_PRECISION,
    "dequantized": BackwardOverride.DEQUANTIZED,
}
# The GEMM configuration of a call without a recipe (TE's default).
_DEFAULT_GEMM = GemmConfig()


def recipe_gemm_fields(quantizers: RecipeQuantizers | None) -> dict[str, Any]:
    """The GEMM bundle fields every module takes from the active recipe: ``fp8`` and the
    recipe's ``fprop_gemm``/``dgrad_gemm``/``wgrad_gemm`` (TE's fp8_gemm_*), or the
    defaults without a recipe.

    The dict is built here, not kept as a module global: a compiled call guards what it
    reads of a global (the dict, each key, each configuration and its code: 13 checks a
    call); of one shared configuration it guards that one."""
    if quantizers is None:
        return {
            "fp8": False,
            "fprop_gemm": _DEFAULT_GEMM,
            "dgrad_gemm": _DEFAULT_GEMM,
            "wgrad_gemm": _DEFAULT_GEMM,
        }
    return {
        "fp8": True,
        "fprop_gemm": quantizers.fprop_gemm,
        "dgrad_gemm": quantizers.dgrad_gemm,
        "wgrad_gemm": quantizers.wgrad_gemm,
    }


def activation_dtype(owner: Any, inp: Any, params_dtype: torch.dtype) -> torch.dtype:
    """The dtype a module computes in: its input's, or ``params_dtype`` for an input that
    is not a tensor (a quantized storage; anything else is reported by the bundle's
    field check). An input of an integer, boolean or complex dtype is refused, as
    ``torch.nn.Linear`` refuses it, instead of being cast.

    ``owner`` (the module, or its name) is named only in that refusal: a compiled
    forward that read ``type(module)`` would guard, on every call, that each layer of a
    model has the same class as the first (a Python guard per layer)."""
    if not is_tensor(inp):
        return params_dtype
    if not inp.is_floating_point():
        name = owner if isinstance(owner, str) else type(owner).__name__
        raise TypeError(
            f"{name}: input of dtype {inp.dtype}; expected a floating-point tensor "
            "(float32, bfloat16, float16 or float64): cast it first"
        )
    return inp.dtype


def autocast_enabled(device_type: str) -> bool:
    """Whether ``torch.autocast`` is on for ``device_type``, for the device types it
    knows (a device it does not know, e.g. meta, is reported by the field checks).

    The types are written out because Dynamo on torch 2.11 cannot trace
    ``torch.amp.is_autocast_available`` (a skipped builtin), and as a literal (a constant
    of this code) because every compiled module call runs this: a module global read
    here would be guarded on every call. ``torch.is_autocast_enabled`` Dynamo folds to a
    constant."""
    known = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla", "maia")
    return device_type in known and is_autocast_enabled(device_type)


def torch_autocast_on(inp: Any) -> bool:
    """Whether an enclosing ``torch.autocast`` is on for the device of ``inp`` (a
    tensor): then the module's forward runs through :func:`under_torch_autocast`.

    Every module's ``forward`` begins with this test instead of carrying a decorator: a
    compiled call guards a decorated forward through the wrapper's closure (the wrapped
    function's code and each of its defaults, read through the cell), ~2 us on every
    call of a compiled frame on the CPU, more than all the rest of a layer's guards."""
    if not is_tensor(inp):
        return False
    # The two common devices by their flags, with no further call (a compiled call
    # guards each function it inlines); ``Tensor.device.type`` costs ~0.4 us a call.
    if inp.is_cuda:
        return is_autocast_enabled("cuda")
    if inp.is_cpu:
        return is_autocast_enabled("cpu")
    return autocast_enabled(inp.device.type)


def cast_to_autocast_dtype(inp: torch.Tensor) -> torch.Tensor:
    """``inp`` cast to the dtype of an enclosing ``torch.autocast`` on its device, where
    one is on and ``inp`` is floating point (TE's ``TransformerLayer`` casts its hidden
    states so, making its residual stream, and so its output, the autocast dtype);
    else ``inp`` itself."""
    if not torch_autocast_on(inp) or not inp.is_floating_point():
        return inp
    dtype = torch.get_autocast_dtype(inp.device.type)
    return inp if inp.dtype == dtype else inp.to(dtype)


def under_torch_autocast(forward: Callable[..., Any], module: Any, inp: Any, *args: Any) -> Any:
    """``forward(module, inp, *args)`` as TE runs a module under ``torch.autocast``: a
    floating-point input is cast to the autocast dtype of its device (so the module
    computes, and returns, that dtype whatever its parameters' dtype), and the call runs
    with autocast off, so that the op's own fp32 math (norm statistics, scales, the
    quantizers' arithmetic) is not lowered to 16 bits behind its back. ``forward`` is
    the class's own (``Linear.forward``, not ``type(module).forward``): a subclass's
    override that calls it is not run twice."""
    device_type = inp.device.type
    dtype = torch.get_autocast_dtype(device_type)
    if inp.is_floating_point() and inp.dtype != dtype:
        inp = inp.to(dtype)
    with torch.autocast(device_type, enabled=False):
        return forward(module, inp, *args)


def zero_feature_gemms(
    owner: str,
    inp: Any,
    weights: list[Any],
    biases: list[Any] | None,
    m_splits: Any,
    params_dtype: torch.dtype,
) -> torch.Tensor:
    """The output of GEMMs with no input or no output features (``inp @ W_i^T + b_i``
    over the rows of ``m_splits``; one GEMM: ``m_splits`` None), in the activation
    dtype, through torch: there is nothing to quantize or multiply, and the op kernels
    reshape by -1, which an empty operand makes ambiguous. Its gradients are TE's:
    zeros (or empty) for the input and weights, the output gradient's row sums per GEMM
    for the biases."""
    dtype = activation_dtype(owner, inp, params_dtype)
    x = inp.reshape(math.prod(inp.shape[:-1]), inp.shape[-1]).to(dtype)
    plain = [w.dequantize() if isinstance(w, QuantizedData) else w for w in weights]
    out = functools.reduce(torch.add, [F.linear(x, w.to(dtype)) for w in plain])
    if biases is not None:
        stacked = torch.stack([b.to(dtype) for b in biases])
        if m_splits is None:
            out = out + stacked[0]
        else:
            out = out + stacked.repeat_interleave(m_splits, dim=0, output_size=x.shape[0])
    return out.reshape(*inp.shape[:-1], out.shape[-1])


def backward_override_of(quantizers: RecipeQuantizers | None) -> BackwardOverride | None:
    """The recipe's ``backward_override`` as the ops' enum (None without a recipe)."""
    return None if quantizers is None else BACKWARD_OVERRIDES[quantizers.backward_override]


@torch.compiler.assume_constant_result
def _transform_traced() -> bool:
    """Whether Dynamo is tracing inside a torch.func transform (a compiled
    ``torch.func.grad(f)``): run for real while tracing, a constant of the graph."""
    return functorch_transform_active()


def refuse_torch_func(module: Any) -> None:
    """Raise, naming ``module`` (a module or its class name) and what is supported, when
    a torch.func transform runs its forward: the ops' autograd Functions define no
    ``setup_context`` (nor vmap rules), so torch would raise its generic error from
    inside the op. Each module's forward begins with it. Compiled, the question is
    answered while tracing (a transform Dynamo traces is active then); the refusal then
    reaches the caller as Dynamo's error quoting it (``fullgraph=True``), or from the
    eager call behind the graph break."""
    if not (_transform_traced() if is_compiling() else functorch_transform_active()):
        return
    name = module if isinstance(module, str) else type(module).__name__
    raise RuntimeError(
        f"{name}: torch.func transforms (grad, vmap, jvp, vjp, jacrev, jacfwd, hessian) "
        "are not supported: its ops' autograd Functions define no setup_context, which "
        "the transforms need. Supported: torch.autograd (loss.backward(), "
        "torch.autograd.grad, create_graph=True for a second order), eagerly or under "
        "torch.compile; torch.func.functional_call outside a transform calls the module "
        "with other parameters and buffers"
    )


def refuse_unsupported(q: RecipeQuantizers | None, weight: Any) -> None:
    """Raise where ``weight`` (the module's weight, which says where it computes) is on a
    CUDA device that cannot run the formats of ``q`` natively, unless emulation is
    switched on (``availability.recipe_refusal``: the recipe and TE's reason). Nothing
    to do without a recipe or on the CPU."""
    if q is not None and weight.is_cuda:
        reason = recipe_refusal(q.needs, weight.device.index)
        if reason:
            raise RuntimeError(reason)


def quantizes_weight(quantizer: Any, weight: Any) -> bool:
    """TE's rule for what a weight workspace caches: a recipe quantizes the weight, which
    is not quantized already (a ``quantized_model_init`` weight is used as it is)."""
    return quantizer is not None and not isinstance(weight, QuantizedData)
