"""The GroupedLinear op: ``num_gemms`` Linear GEMMs over consecutive row groups.

``m_splits`` (an int64 tensor, one row count per GEMM, zeros allowed) splits the input's
rows; group ``i`` runs the Linear op's own GEMM stage with weight ``i`` and bias ``i``
(``ops/_fused.py``) and the outputs are concatenated. The output's shape is the input's
rows by ``out_features`` whatever the split values, and the split values are read only
inside the kernels, so one compiled graph serves every split. The op keeps the original
input and re-quantizes each group in the backward (TE's ``save_original_input``), so
what it saves does not depend on the split values either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from transformer_engine_ops.ops._fused import (
    GemmQuantizers,
    linear_stage,
    quantized_for_backward,
)
from transformer_engine_ops.ops.linear import (
    LinearFwdArgs,
    linear_backward,
    linear_forward,
    linear_setup_context,
)
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.quantizer import Quantizer
from transformer_engine_ops.runtime.tensor_spec import TensorSpec
from transformer_engine_ops.runtime.types import TensorOrQuantized
from transformer_engine_ops.runtime.values import GemmConfig


@dataclass
class GroupedLinearFwdArgs:
    """Everything the GroupedLinear forward needs."""

    # --- Differentiable inputs ---
    inp: torch.Tensor
    # One (out_features, in_features) weight per GEMM: plain, or quantized (made under
    # quantized_model_init); each receives its gradient.
    weights: list[TensorOrQuantized]
    biases: Optional[list[torch.Tensor]]  # one (out_features,) bias per GEMM, or None

    # --- Rows of each GEMM (int64, one per GEMM; read inside the kernels only) ---
    m_splits: torch.Tensor

    # --- requires_grad, recorded so the backward does not re-query ---
    input_requires_grad: bool
    weights_requires_grad: bool
    biases_requires_grad: bool

    # --- One quantizer per GEMM (None when the recipe does not quantize that tensor) ---
    input_quantizers: list[Optional[Quantizer]]
    weight_quantizers: list[Optional[Quantizer]]
    grad_output_quantizers: list[Optional[Quantizer]]

    # --- Numerics ---
    activation_dtype: torch.dtype
    fp8: bool
    fprop_gemm: GemmConfig
    dgrad_gemm: GemmConfig
    wgrad_gemm: GemmConfig

    num_gemms: int
    in_features: int
    out_features: int

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class GroupedLinearBwdArgs:
    """Everything the GroupedLinear backward needs."""

    grad_outputs: list[torch.Tensor]

    # --- Kept by the forward (its own inputs: the op saves nothing new) ---
    inp: torch.Tensor
    weights: list[TensorOrQuantized]
    m_splits: torch.Tensor

    # --- What to compute ---
    requires_dgrad: bool
    requires_wgrad: bool
    requires_bgrad: bool
    has_biases: bool  # a bias list crossed (its gradient is then a list too)

    input_quantizers: list[Optional[Quantizer]]
    weight_quantizers: list[Optional[Quantizer]]
    grad_output_quantizers: list[Optional[Quantizer]]

    activation_dtype: torch.dtype
    fp8: bool
    fprop_gemm: GemmConfig
    dgrad_gemm: GemmConfig
    wgrad_gemm: GemmConfig

    num_gemms: int
    in_features: int
    out_features: int


# --- The plan: what the real and fake kernels share ----------------------------------


def _check(args: GroupedLinearFwdArgs | GroupedLinearBwdArgs) -> None:
    """Shapes and list lengths (the split values are checked by the real kernels)."""
    where = type(args).__name__
    n, k, m = args.num_gemms, args.in_features, args.out_features
    lists = {
        "weights": args.weights,
        "input_quantizers": args.input_quantizers,
        "weight_quantizers": args.weight_quantizers,
        "grad_output_quantizers": args.grad_output_quantizers,
    }
    if isinstance(args, GroupedLinearFwdArgs) and args.biases is not None:
        lists["biases"] = args.biases
    for name, values in lists.items():
        if len(values) != n:
            raise ValueError(f"{where}.{name}: expected num_gemms={n} entries, got {len(values)}")
    for i, w in enumerate(args.weights):
        if tuple(w.shape) != (m, k):
            raise ValueError(f"{where}.weights[{i}]: shape {tuple(w.shape)}, expected ({m}, {k})")
    if tuple(args.m_splits.shape) != (n,):
        raise ValueError(
            f"{where}.m_splits: shape {tuple(args.m_splits.shape)}, expected ({n},) "
            "(one row count per GEMM)"
        )
    if args.inp.shape[-1] != k:
        raise ValueError(f"{where}.inp: last dim {args.inp.shape[-1]}, expected {k}")


def _splits(args: GroupedLinearFwdArgs | GroupedLinearBwdArgs, rows: int) -> list[int]:
    """The split values (real kernels only), validated against the input's rows."""
    splits = [int(s) for s in args.m_splits.tolist()]
    if any(s < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(
            f"{type(args).__name__}.m_splits: {splits} must be non-negative and sum to the "
            f"input's {rows} rows"
        )
    return splits


def _stage(
    args: GroupedLinearFwdArgs | GroupedLinearBwdArgs,
    i: int,
    x: torch.Tensor,
    bias: Any,
    input_rg: bool,
    weight_rg: bool,
    bias_rg: bool,
) -> LinearFwdArgs:
    """GEMM ``i``'s Linear stage on its rows ``x``."""
    return linear_stage(
        weight=args.weights[i],
        inp=x,
        bias=bias,
        input_requires_grad=input_rg,
        weight_requires_grad=weight_rg,
        bias_requires_grad=bias_rg,
        quantizers=GemmQuantizers(
            args.input_quantizers[i],
            args.weight_quantizers[i],
            None,
            None,
            None,
            args.grad_output_quantizers[i],
        ),
        activation_dtype=args.activation_dtype,
        fp8=args.fp8,
        gemms=(args.fprop_gemm, args.dgrad_gemm, args.wgrad_gemm),
        parallel_mode=None,
        tp_group=None,
        tp_size=1,
        sequence_parallel=False,
        in_features=args.in_features,
        out_features=args.out_features,
        is_grad_enabled=True,
    )


def _output_shape(args: GroupedLinearFwdArgs) -> tuple[Any, ...]:
    return (*args.inp.shape[:-1], args.out_features)


# --- Forward ---------------------------------------------------------------------


def grouped_linear_forward(
    args: GroupedLinearFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((out,), ())``: the backward re-quantizes from the forward's own inputs."""
    _check(args)
    x = args.inp.reshape(-1, args.in_features)
    outs = []
    for i, x_i in enumerate(x.split(_splits(args, x.shape[0]))):
        bias = None if args.biases is None else args.biases[i]
        stage = _stage(args, i, x_i, bias, False, False, False)
        outs.append(linear_forward(stage)[0][0])
    out = torch.cat(outs) if outs else x.new_empty((0, args.out_features))
    return (out.view(_output_shape(args)),), ()


def grouped_linear_forward_spec(
    args: GroupedLinearFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    _check(args)
    out = TensorSpec(_output_shape(args), args.activation_dtype, device=args.inp.device)
    return (out,), ()


def grouped_linear_setup_context(
    args: GroupedLinearFwdArgs, saved: tuple[Any, ...]
) -> GroupedLinearBwdArgs:
    grad = args.is_grad_enabled
    return GroupedLinearBwdArgs(
        grad_outputs=[],
        inp=args.inp,
        weights=args.weights,
        m_splits=args.m_splits,
        requires_dgrad=grad and args.input_requires_grad,
        requires_wgrad=grad and args.weights_requires_grad,
        requires_bgrad=grad and args.biases is not None and args.biases_requires_grad,
        has_biases=args.biases is not None,
        input_quantizers=args.input_quantizers,
        weight_quantizers=args.weight_quantizers,
        grad_output_quantizers=args.grad_output_quantizers,
        activation_dtype=args.activation_dtype,
        fp8=args.fp8,
        fprop_gemm=args.fprop_gemm,
        dgrad_gemm=args.dgrad_gemm,
        wgrad_gemm=args.wgrad_gemm,
        num_gemms=args.num_gemms,
        in_features=args.in_features,
        out_features=args.out_features,
    )


# --- Backward --------------------------------------------------------------------


def grouped_linear_backward(args: GroupedLinearBwdArgs) -> tuple[Any, ...]:
    """``(dgrad, [wgrad per GEMM], [bgrad per GEMM])``; None (or Nones) where not required."""
    _check(args)
    n = args.num_gemms
    x = args.inp.reshape(-1, args.in_features)
    dy = args.grad_outputs[0].reshape(-1, args.out_features)
    splits = _splits(args, x.shape[0])
    dgrads, wgrads, bgrads = [], [None] * n, [None] * n
    # A bias stands in only to ask Linear's backward for its gradient.
    stand_in = dy.new_empty((args.out_features,)) if args.requires_bgrad else None
    for i, (x_i, dy_i) in enumerate(zip(x.split(splits), dy.split(splits), strict=True)):
        stage = _stage(
            args,
            i,
            x_i,
            stand_in,
            args.requires_dgrad,
            args.requires_wgrad,
            args.requires_bgrad,
        )
        backward = linear_setup_context(stage, quantized_for_backward(stage))
        backward.grad_outputs = [dy_i]
        dgrad, wgrads[i], bgrads[i] = linear_backward(backward)
        dgrads.append(dgrad)
    dgrad = None
    if args.requires_dgrad:
        dgrad = torch.cat(dgrads) if dgrads else x.new_empty(x.shape)
        dgrad = dgrad.to(args.inp.dtype).view(args.inp.shape)
    return dgrad, wgrads, bgrads if args.has_biases else None


def grouped_linear_backward_spec(args: GroupedLinearBwdArgs) -> tuple[Any, ...]:
    _check(args)
    n, device, dtype = args.num_gemms, args.inp.device, args.activation_dtype
    dgrad = TensorSpec(tuple(args.inp.shape), args.inp.dtype, device=device)
    wgrad = TensorSpec((args.out_features, args.in_features), dtype, device=device)
    bgrad = TensorSpec((args.out_features,), dtype, device=device)
    return (
        dgrad if args.requires_dgrad else None,
        [wgrad if args.requires_wgrad else None] * n,
        [bgrad if args.requires_bgrad else None] * n if args.has_biases else None,
    )


GROUPED_LINEAR = OpDeclaration(
    name="grouped_linear",
    forward=GroupedLinearFwdArgs,
    backward=GroupedLinearBwdArgs,
    grad_fields=("inp", "weights", "biases"),
    forward_impl=grouped_linear_forward,
    backward_impl=grouped_linear_backward,
    forward_spec=grouped_linear_forward_spec,
    backward_spec=grouped_linear_backward_spec,
    setup_context=grouped_linear_setup_context,
)
