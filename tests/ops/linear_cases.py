"""Builders for the Linear op tests: bundles made directly, as the module would make them."""

from __future__ import annotations

import functools
from typing import Any

import torch

from transformer_engine_ops.ops.linear import (
    LINEAR,
    BackwardOverride,
    LinearFwdArgs,
    linear_forward,
)
from transformer_engine_ops.quantization import (
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from transformer_engine_ops.runtime.values import GemmConfig

IN, OUT, BATCH = 64, 32, (4, 16)

# name -> recipe factory (None: unquantized bf16)
RECIPES: dict[str, Any] = {
    "bf16": None,
    "fp8_current": Float8CurrentScaling,
    "mxfp8": MXFP8BlockScaling,
    "nvfp4": functools.partial(
        NVFP4BlockScaling, disable_rht=True, disable_stochastic_rounding=True
    ),
    "fp8_block": Float8BlockScaling,
}


def make_fwd_args(
    recipe: str = "bf16",
    *,
    bias: bool = True,
    requires_grad: bool = True,
    weight_form: str = "tensor",
    fp8_output: bool = False,
    grad_enabled: bool = True,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    in_features: int = IN,
    backward_override: BackwardOverride | None = None,
    cache_weight: bool = False,
) -> LinearFwdArgs:
    """A forward bundle. ``weight_form``: ``tensor``, ``storage`` (a bare quantized
    storage) or ``wrapper`` (a quantized tensor subclass)."""
    gen = torch.Generator().manual_seed(seed)
    factory = RECIPES[recipe]
    rec = factory() if factory is not None else None

    def q(role: str) -> Any:
        return rec.make_quantizer(role) if rec is not None else None

    w = torch.randn(OUT, in_features, generator=gen).to(dtype)
    weight: Any = w.requires_grad_(requires_grad)
    weight_rg = requires_grad
    if weight_form != "tensor":
        assert rec is not None, "a quantized weight needs a recipe"
        internal = weight_form == "storage"
        weight = q("weight").with_internal(internal).quantize(w.detach())
        weight_rg = False
    x = torch.randn(*BATCH, in_features, generator=gen).to(dtype).requires_grad_(requires_grad)
    b = torch.randn(OUT, generator=gen).to(dtype).requires_grad_(requires_grad) if bias else None
    return LinearFwdArgs(
        weight=weight,
        inp=x,
        bias=b,
        weight_workspace=None,
        input_requires_grad=requires_grad,
        weight_requires_grad=weight_rg,
        bias_requires_grad=requires_grad and bias,
        input_quantizer=q("input"),
        weight_quantizer=q("weight"),
        output_quantizer=q("output"),
        grad_input_quantizer=q("grad_input"),
        grad_weight_quantizer=q("grad_weight"),
        grad_output_quantizer=q("grad_output"),
        activation_dtype=dtype,
        fp8=rec is not None,
        fp8_output=fp8_output,
        backward_override=backward_override,
        fprop_gemm=GemmConfig(),
        dgrad_gemm=GemmConfig(),
        wgrad_gemm=GemmConfig(),
        is_first_microbatch=None,
        cache_weight=cache_weight,
        parallel_mode=None,
        tp_group=None,
        tp_size=1,
        sequence_parallel=False,
        in_features=in_features,
        out_features=OUT,
        ub_overlap_ag_fprop=False,
        ub_overlap_rs_fprop=False,
        ub_name=None,
        wgrad_store=None,
        is_grad_enabled=grad_enabled,
    )


def make_bwd_args(fwd: LinearFwdArgs, seed: int = 1) -> Any:
    """The backward bundle a forward run of ``fwd`` leads to, with a random output grad."""
    with torch.no_grad():
        (out,), saved = linear_forward(fwd)
    bwd = LINEAR.backward_args(fwd, (out,), saved)
    # The backward op runs inside autograd's backward (no graph of its own): detached.
    for field in ("inputmat", "weight_fp8"):
        value = getattr(bwd, field)
        if isinstance(value, torch.Tensor) and not hasattr(value, "inner_tensors"):
            setattr(bwd, field, value.detach())
    gen = torch.Generator().manual_seed(seed)
    bwd.grad_outputs = [torch.randn(out.shape, generator=gen).to(fwd.activation_dtype)]
    return bwd


# (id, kwargs of make_fwd_args): every recipe x bias x requires_grad, quantized weights.
CONFIGS: list[tuple[str, dict[str, Any]]] = []
for _name in RECIPES:
    for _bias in (True, False):
        for _rg in (True, False):
            CONFIGS.append(
                (
                    f"{_name}-{'bias' if _bias else 'nobias'}-{'grad' if _rg else 'nograd'}",
                    dict(recipe=_name, bias=_bias, requires_grad=_rg),
                )
            )
for _name in RECIPES:
    if RECIPES[_name] is not None:
        CONFIGS.append((f"{_name}-storage_weight", dict(recipe=_name, weight_form="storage")))
# Wide enough that every block format has several scale blocks per row (with 64
# features, FP8 block's 1x128 scale buffer is (1, M) and a transposed one goes unseen).
for _name in RECIPES:
    CONFIGS.append((f"{_name}-k256", dict(recipe=_name, in_features=256)))
# What the backward keeps differs per backward_override and for a cached weight (the
# saved usages are reduced after the fprop GEMM; the fakes must declare the same).
for _name in RECIPES:
    if RECIPES[_name] is not None:
        for _override in BackwardOverride:
            CONFIGS.append(
                (
                    f"{_name}-override_{_override.value}",
                    dict(recipe=_name, backward_override=_override),
                )
            )
        CONFIGS.append((f"{_name}-cache_weight", dict(recipe=_name, cache_weight=True)))
# All optional fields None: no bias, no quantizers, no workspace, no group.
CONFIGS.append(("all_none_optionals", dict(recipe="bf16", bias=False)))
