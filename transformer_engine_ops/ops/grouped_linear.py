"""The GroupedLinear op: ``num_gemms`` Linear GEMMs over consecutive row groups.

``m_splits`` (an int64 tensor, one row count per GEMM, zeros allowed) splits the input's
rows; group ``i`` runs the Linear op's own GEMM stage with weight ``i`` and bias ``i``
(``ops/_fused.py``) and the outputs are concatenated. The output's shape is the input's
rows by ``out_features`` whatever the split values, and the split values are read only
inside the kernels, so one compiled graph serves every split. The op keeps the original
input and re-quantizes each group in the backward (TE's ``save_original_input``), so
what it saves does not depend on the split values either. The recipe's
``backward_override`` is Linear's, per GEMM: the backward reads each group's original
input and weight (``HIGH_PRECISION``) or their rowwise quantized values dequantized
(``DEQUANTIZED``).

Weight caching (TE's ``is_first_microbatch``) is Linear's, per GEMM: each GEMM's stage
gets its cached ``weight_workspace`` (or makes one with ``cache_weight``), and the
backward's dgrad reads that workspace instead of quantizing the weight again.

Delayed scaling (``Float8Quantizer``, stateful) quantizes with a scale that autocast's
exit updates between the forward and the backward. The forward keeps the scale each
GEMM's input and weight quantizer quantized with (``forward_scales``), and the backward
quantizes again with those (:func:`~transformer_engine_ops.ops._fused.replaying`): the
forward's bits, as TE's backward reads the quantized tensors its forward saved, and no
amax of a forward role recorded twice in a step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch

from transformer_engine_ops.ops import _wgrad
from transformer_engine_ops.ops._fused import (
    GemmQuantizers,
    linear_stage,
    quantized_for_backward,
    replaying,
)
from transformer_engine_ops.ops.linear import (
    LINEAR,
    BackwardOverride,
    LinearFwdArgs,
    _check_columnwise_weight,
    _forward_plan,
    _is_quantized,
    _made_weight_quantizer,
    _Usage,
    linear_backward,
    linear_forward,
)
from transformer_engine_ops.quantization.float8 import Float8Quantizer
from transformer_engine_ops.quantization.quantizer import Quantizer
from transformer_engine_ops.quantization.stochastic import stage_rng_state
from transformer_engine_ops.runtime.declaration import OpDeclaration
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

    # --- Cached quantized weights, one per GEMM (None entries: none cached), reused across
    # microbatches as Linear's weight_workspace ---
    weight_workspaces: Optional[list[TensorOrQuantized]]

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
    # Linear's, per GEMM: an unquantized backward on the original (HIGH_PRECISION) or
    # the dequantized (DEQUANTIZED) input and weight; None: the recipe's quantized one.
    backward_override: Optional[BackwardOverride]
    fprop_gemm: GemmConfig
    dgrad_gemm: GemmConfig
    wgrad_gemm: GemmConfig

    num_gemms: int
    in_features: int
    out_features: int

    # --- Weight-workspace caching (TE's is_first_microbatch), per GEMM as Linear's ---
    is_first_microbatch: Optional[bool]
    cache_weight: bool

    # --- Autograd state ---
    is_grad_enabled: bool

    # --- Stochastic rounding of the output gradients: (seed, offset), int64 (2,); GEMM i
    # draws its bits at offset + i ---
    sr_rng_state: Optional[torch.Tensor] = None

    # --- Weight-gradient scheduling (eager only: the weights' main_grad, deferred GEMMs) ---
    fuse_wgrad_accumulation: bool = False
    delay_wgrad_compute: bool = False

    # --- Calibration (autocast(enabled=False, calibrating=True)): GEMM i's input and
    # weight quantizers at 2i and 2i + 1 ---
    calibration_quantizers: Optional[list[Optional[Quantizer]]] = None


@dataclass
class GroupedLinearBwdArgs:
    """Everything the GroupedLinear backward needs."""

    grad_outputs: list[torch.Tensor]

    # --- Kept by the forward (its own inputs: the op saves nothing new) ---
    inp: torch.Tensor
    weights: list[TensorOrQuantized]
    m_splits: torch.Tensor
    # The quantized weight each GEMM's dgrad reads instead of re-quantizing its weight:
    # the workspace the forward used or made (None: re-quantize, or no workspaces at all).
    weight_workspaces: Optional[list[TensorOrQuantized]]

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
    backward_override: Optional[BackwardOverride]
    fprop_gemm: GemmConfig
    dgrad_gemm: GemmConfig
    wgrad_gemm: GemmConfig

    num_gemms: int
    in_features: int
    out_features: int

    # --- Stochastic rounding of the output gradients: (seed, offset), int64 (2,); GEMM i
    # draws its bits at offset + i ---
    sr_rng_state: Optional[torch.Tensor] = None

    # --- Delayed scaling: the scales GEMM i's input (row 0) and weight (row 1) quantizer
    # quantized with in the forward, fp32 (2, num_gemms) (1 for a stateless quantizer);
    # the backward quantizes those operands again with them. None: no stateful quantizer ---
    forward_scales: Optional[torch.Tensor] = None

    # --- Where each GEMM's weight gradient goes instead of being returned (eager only):
    # a list of routes (ops/_wgrad.py), one per GEMM ---
    wgrad_routes: Optional[Any] = None


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
    if args.weight_workspaces is not None:
        lists["weight_workspaces"] = args.weight_workspaces
    for name, values in lists.items():
        if len(values) != n:
            raise ValueError(f"{where}.{name}: expected num_gemms={n} entries, got {len(values)}")
    for i, w in enumerate(args.weights):
        if tuple(w.shape) != (m, k):
            raise ValueError(f"{where}.weights[{i}]: shape {tuple(w.shape)}, expected ({m}, {k})")
    if args.m_splits.dtype not in _ROW_COUNT_DTYPES:
        raise TypeError(
            f"{where}.m_splits: dtype {args.m_splits.dtype}; row counts must be an integer "
            "tensor (int64), not truncated from another dtype"
        )
    if tuple(args.m_splits.shape) != (n,):
        raise ValueError(
            f"{where}.m_splits: shape {tuple(args.m_splits.shape)}, expected ({n},) "
            "(one row count per GEMM)"
        )
    if args.inp.shape[-1] != k:
        raise ValueError(f"{where}.inp: last dim {args.inp.shape[-1]}, expected {k}")


_ROW_COUNT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _check_dgrad_weights(args: GroupedLinearFwdArgs) -> None:
    """Refuse at the forward, as Linear's plan does, a quantized weight the backward's
    quantized dgrad GEMM could not read (rowwise data only, in a block format): the
    forward's stages run without gradients, the backward's re-quantize."""
    if not (args.is_grad_enabled and args.input_requires_grad) or args.backward_override:
        return
    for weight, grad_output_quantizer in zip(
        args.weights, args.grad_output_quantizers, strict=False
    ):
        if grad_output_quantizer is not None and _is_quantized(weight):
            _check_columnwise_weight(weight.quantizer)


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
    caching: tuple[Any, Optional[bool], bool] = (None, None, False),
) -> LinearFwdArgs:
    """GEMM ``i``'s Linear stage on its rows ``x``; ``caching`` is Linear's
    ``(weight_workspace, is_first_microbatch, cache_weight)`` for it."""
    stage = linear_stage(
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
    stage.backward_override = args.backward_override
    workspace, first, cache = caching
    if workspace is None and not cache:
        return stage
    return dataclasses.replace(
        stage, weight_workspace=workspace, is_first_microbatch=first, cache_weight=cache
    )


def _at(values: Optional[list[Any]], i: int) -> Any:
    return None if values is None else values[i]


def _caching_stage(args: GroupedLinearFwdArgs, i: int, x: Any) -> LinearFwdArgs:
    """GEMM ``i``'s forward stage when weights are cached: the input's requires_grad is
    real, so the weight is quantized with the usage the backward's dgrad reads (the
    workspace later microbatches reuse); nothing else is saved (the backward
    re-quantizes the input)."""
    input_rg = args.is_grad_enabled and args.input_requires_grad
    caching = (_at(args.weight_workspaces, i), args.is_first_microbatch, args.cache_weight)
    return _stage(args, i, x, _at(args.biases, i), input_rg, False, False, caching)


def _made_weight(args: GroupedLinearFwdArgs, i: int) -> Optional[_Usage]:
    """The usages of the quantized weight GEMM ``i``'s forward makes for the workspace
    cache (None: it makes none). Linear's plan decides; it does not depend on the rows."""
    if not args.cache_weight:
        return None
    return _forward_plan(_caching_stage(args, i, args.inp)).saved_weight


def _uses_workspace(args: GroupedLinearFwdArgs, i: int) -> bool:
    return _forward_plan(_caching_stage(args, i, args.inp)).weight_from_workspace


def _calibration_pair(args: GroupedLinearFwdArgs, i: int) -> list[Any]:
    """GEMM ``i``'s calibration quantizers: its input's and its weight's."""
    quantizers = args.calibration_quantizers
    assert quantizers is not None
    if len(quantizers) != 2 * len(args.weights):
        raise ValueError(
            f"GroupedLinearFwdArgs.calibration_quantizers: {len(quantizers)} quantizers for "
            f"{len(args.weights)} GEMMs; expected 2 per GEMM (input's, weight's)"
        )
    return quantizers[2 * i : 2 * i + 2]


def _output_shape(args: GroupedLinearFwdArgs) -> tuple[Any, ...]:
    return (*args.inp.shape[:-1], args.out_features)


def _replays(args: GroupedLinearFwdArgs) -> bool:
    """Whether the backward quantizes a forward operand again with a stateful quantizer
    (delayed scaling's), so the forward keeps the scales it quantized with. Another
    stateful class is refused: its state cannot be replayed here."""
    quantizers = [*args.input_quantizers, *args.weight_quantizers]
    for q in quantizers:
        if q is not None and not getattr(q, "value_opaque", True):
            if not isinstance(q, Float8Quantizer):
                raise ValueError(
                    f"GroupedLinearFwdArgs: the stateful quantizer {type(q).__name__} cannot "
                    "be replayed by the backward, which quantizes the input and weight again"
                )
    needs_backward = args.input_requires_grad or args.weights_requires_grad
    return (
        args.is_grad_enabled
        and needs_backward
        and args.backward_override is not BackwardOverride.HIGH_PRECISION
        and any(isinstance(q, Float8Quantizer) for q in quantizers)
    )


def _scale_of(quantizer: Optional[Quantizer], device: torch.device) -> torch.Tensor:
    """The scale ``quantizer`` quantizes with now, as a new fp32 scalar on ``device``."""
    if isinstance(quantizer, Float8Quantizer):
        return quantizer.scale.detach().to(device, torch.float32).reshape(()).clone()
    return torch.ones((), dtype=torch.float32, device=device)


# --- Forward ---------------------------------------------------------------------


def grouped_linear_forward(
    args: GroupedLinearFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((out,), saved)``: the backward re-quantizes from the forward's own inputs;
    ``saved`` is empty, or with ``cache_weight`` the quantized weight each GEMM made
    for the workspace cache (None where it made none)."""
    _check(args)
    _check_dgrad_weights(args)
    x = args.inp.reshape(-1, args.in_features)
    outs, made, scales = [], [], []
    caching = args.cache_weight or args.weight_workspaces is not None
    replays = _replays(args)
    for i, x_i in enumerate(x.split(_splits(args, x.shape[0]))):
        if caching:
            stage = _caching_stage(args, i, x_i)
        else:
            stage = _stage(args, i, x_i, _at(args.biases, i), False, False, False)
        if replays:  # read before GEMM i quantizes (an update may follow its quantize)
            for q in (args.input_quantizers[i], args.weight_quantizers[i]):
                scales.append(_scale_of(q, x.device))
        if args.calibration_quantizers is not None:
            stage.calibration_quantizers = _calibration_pair(args, i)
        (out_i,), (_, made_i) = linear_forward(stage)
        outs.append(out_i)
        made.append(made_i)
    out = torch.cat(outs) if outs else x.new_empty((0, args.out_features))
    # What the forward made for the cache (one per GEMM), for the module to keep; then
    # the scales the backward quantizes with again.
    saved = tuple(made) if args.cache_weight else ()
    if replays:
        shape = (2, args.num_gemms)
        saved += (torch.stack(scales).view(args.num_gemms, 2).t().contiguous().view(shape),)
    return (out.view(_output_shape(args)),), saved


def grouped_linear_forward_spec(
    args: GroupedLinearFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    _wgrad.refuse_traced(
        "GroupedLinearFwdArgs", args.fuse_wgrad_accumulation, args.delay_wgrad_compute
    )
    _check(args)
    _check_dgrad_weights(args)
    dtype, device = args.activation_dtype, args.inp.device
    out = TensorSpec(_output_shape(args), dtype, device=device)
    scales: tuple[Any, ...] = ()
    if _replays(args):
        scales = (TensorSpec((2, args.num_gemms), torch.float32, device=device),)
    if not args.cache_weight:
        return (out,), scales
    made = []
    for i in range(args.num_gemms):
        usage = _made_weight(args, i)
        quantizer = (
            None
            if usage is None
            else _made_weight_quantizer(args.weight_quantizers[i], usage, cache_weight=True)
        )
        shape = tuple(args.weights[i].shape)
        made.append(None if usage is None else TensorSpec(shape, dtype, quantizer, device=device))
    return (out,), tuple(made) + scales


def grouped_linear_setup_context(
    args: GroupedLinearFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    grad = args.is_grad_enabled
    # The quantized weight each dgrad reads: the one the forward made, or the workspace
    # it used; the backward re-quantizes the others.
    workspaces = None
    if args.cache_weight or args.weight_workspaces is not None:
        made = saved[: args.num_gemms] if args.cache_weight else (None,) * args.num_gemms
        workspaces = [
            made[i]
            if made[i] is not None
            else args.weight_workspaces[i]
            if _uses_workspace(args, i)
            else None
            for i in range(args.num_gemms)
        ]
        if all(w is None for w in workspaces):
            workspaces = None
    return dict(
        weight_workspaces=workspaces,
        requires_dgrad=grad and args.input_requires_grad,
        requires_wgrad=grad and args.weights_requires_grad,
        requires_bgrad=grad and args.biases is not None and args.biases_requires_grad,
        has_biases=args.biases is not None,
        forward_scales=saved[-1] if _replays(args) else None,
        wgrad_routes=[
            _wgrad.route_of(
                weight,
                args.fuse_wgrad_accumulation,
                args.delay_wgrad_compute,
                args.is_first_microbatch,
            )
            for weight in args.weights
        ]
        if grad
        and args.weights_requires_grad
        and (args.fuse_wgrad_accumulation or args.delay_wgrad_compute)
        else None,
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
        workspace = _at(args.weight_workspaces, i)
        stage = _stage(
            args,
            i,
            x_i,
            stand_in,
            args.requires_dgrad,
            args.requires_wgrad,
            args.requires_bgrad,
            (workspace, False, False) if workspace is not None else (None, None, False),
        )
        if args.forward_scales is not None:  # delayed scaling: the forward's scales
            stage = dataclasses.replace(
                stage,
                input_quantizer=replaying(stage.input_quantizer, args.forward_scales[0, i]),
                weight_quantizer=replaying(stage.weight_quantizer, args.forward_scales[1, i]),
            )
        # A high-precision backward reads the original input and weight: nothing to
        # re-quantize.
        high_precision = args.backward_override is BackwardOverride.HIGH_PRECISION
        saved = (None, None) if high_precision else quantized_for_backward(stage)
        backward = LINEAR.backward_args(stage, (), saved)
        backward.grad_outputs = [dy_i]
        backward.sr_rng_state = stage_rng_state(args.sr_rng_state, i)
        backward.wgrad_route = _at(args.wgrad_routes, i)
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
    # Backward fields setup_context computes although a forward field has their name.
    derived=("weight_workspaces",),
    # The kernels read m_splits' values on the host to split the rows: a CUDA graph
    # would replay the captured split for any later m_splits.
    cudagraph_unsafe="its kernels read m_splits on the host (a replay would reuse the captured row split)",
    # Compiled calls that run eagerly, with the reason (the generated compile blocker).
    eager_when=(
        ("quantized(inp)", "a quantized input tensor"),
        (
            "fuse_wgrad_accumulation",
            "fused wgrad accumulation into main_grad (fuse_wgrad_accumulation)",
        ),
        ("delay_wgrad_compute", "delayed wgrad compute (delay_wgrad_compute, run by backward_dw)"),
    ),
)
