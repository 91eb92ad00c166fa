"""GroupedLinear on one grouped GEMM: the row counts read on the device.

``GroupedLinear`` takes this op where it serves the call (:func:`serves`); the
``grouped_linear`` op's per-GEMM loop (which reads ``m_splits`` on the host) serves the
rest. ``m_splits`` (an integer tensor on the input's device) becomes the grouped GEMM's
int32 row offsets (their cumulative sum) and, where a row needs its group, a group id
per row (a sorted search of the offsets): nothing is read on the host, so no call
synchronizes and a CUDA graph replays it with whatever row counts the device holds.
The counts must be non-negative and sum to the input's rows (a ValueError on the CPU, a
device-side assertion on CUDA).

The GEMMs, per device:

* CUDA (compute capability 9.0 or later, torch with ``torch._grouped_mm``), bf16:
  ``torch._grouped_mm`` forward (``x @ W_g^T``), dgrad (``dy @ W_g``) and wgrad
  (``dy^T x`` over each group's rows: ``dy.t()`` column-major and ``x`` row-major, the
  layout whose group sizes need no alignment and may be 0). A bias is added after the
  GEMM (the kernel has no bias epilogue: one more rounding than the loop's), its
  gradient is a grouped GEMM of ``dy`` with ones (deterministic, fp32 accumulation).
* CUDA, FP8 current scaling with E4M3 forward operands (TE's HYBRID and E4M3
  formats): each GEMM's input rows and each weight are quantized with their own amax,
  as the loop's per-GEMM quantizers do, and the forward is one
  ``torch._scaled_grouped_mm`` (each group's per-tensor scale passed as a row or column
  scale; on Hopper). The dgrad is ``torch._scaled_grouped_mm`` too where the gradient is
  E4M3 (the E4M3 format); torch 2.11 has no grouped GEMM for E5M2 operands (HYBRID's
  gradient) nor a safe one for the wgrad (its FP8 kernel needs every group non-empty
  and a multiple of 16 rows), so those run as bf16 grouped GEMMs of the dequantized
  FP8 operands, the operands' FP8 rounding kept (``quantization/gemm.py``'s rule for
  operands without a native GEMM). The per-group quantize and the dequantized operands
  are Triton kernels (``kernels/group_fp8_kernels.py``; the torch ops' bits).
* CPU: every GEMM in fp32 (``torch._grouped_mm``'s loop of ``mm``) on the operands
  widened or dequantized to fp32, the bias added in fp32 and the result rounded once:
  the numbers of the ``grouped_linear`` loop on the CPU, to the bit (its bias
  gradient reads the row counts on the host, which on the CPU waits for nothing).

Weights arrive stacked ``[G, N, K]`` (``GroupedLinear`` stacks its per-GEMM
parameters; their gradients are the stack's backward, autograd's views). FP8 forwards
save the quantized input and weights for the backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from transformer_engine_ops.kernels import group_fp8_kernels
from transformer_engine_ops.ops import _moe
from transformer_engine_ops.quantization.encoding import cast_to_fp8, finite_abs, fp8_to_float
from transformer_engine_ops.quantization.float8 import Float8CurrentScalingQuantizer
from transformer_engine_ops.quantization.quantizer import Quantizer
from transformer_engine_ops.runtime import _torch_private as _private
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.tensor_spec import TensorSpec
from transformer_engine_ops.runtime.values import GemmConfig

_E4M3 = torch.float8_e4m3fn
_BF16 = torch.bfloat16
_F32 = torch.float32
_CPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_ROW_COUNT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@dataclass
class GroupedGemmFwdArgs:
    """Everything GroupedLinear's grouped-GEMM forward needs."""

    # --- Differentiable inputs ---
    inp: torch.Tensor  # [..., K]
    weight: torch.Tensor  # [G, N, K]: the GEMMs' weights stacked
    bias: Optional[torch.Tensor]  # [G, N]: the GEMMs' biases stacked, or None

    # --- Rows of each GEMM: an integer tensor on the input's device ---
    m_splits: torch.Tensor

    input_requires_grad: bool
    weight_requires_grad: bool
    bias_requires_grad: bool

    # --- The recipe's quantizers (FP8 current scaling), or None: no quantization ---
    input_quantizer: Optional[Quantizer]
    weight_quantizer: Optional[Quantizer]
    grad_output_quantizer: Optional[Quantizer]

    # --- Numerics ---
    activation_dtype: torch.dtype
    fprop_gemm: GemmConfig
    dgrad_gemm: GemmConfig

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class GroupedGemmBwdArgs:
    """Everything the grouped-GEMM backward needs."""

    grad_outputs: list[torch.Tensor]

    inp: torch.Tensor  # the forward's input (its rows, widened: the CPU's and bf16's wgrad)
    weight: torch.Tensor
    m_splits: torch.Tensor
    # FP8: the forward's quantized input rows and weights (uint8 codes) and each group's
    # scale inverse; None without quantization.
    input_codes: Optional[torch.Tensor]
    input_scale_inv: Optional[torch.Tensor]  # [G]
    weight_codes: Optional[torch.Tensor]
    weight_scale_inv: Optional[torch.Tensor]  # [G]

    grad_output_quantizer: Optional[Quantizer]
    activation_dtype: torch.dtype
    dgrad_gemm: GemmConfig

    requires_dgrad: bool
    requires_wgrad: bool
    requires_bgrad: bool
    has_bias: bool


# --- What serves a call ------------------------------------------------------------


def _native_device(device: torch.device) -> bool:
    """A CUDA device with torch's grouped GEMM kernels (compute capability 9.0+)."""
    if device.type != "cuda" or _private.grouped_mm() is None:
        return False
    return _capability_major(device.index or 0) >= 9


@_private.mark_constant_result
def _capability_major(index: int) -> int:
    """The major compute capability of CUDA device ``index`` (read once per trace
    under torch.compile: a constant of the graph)."""
    return torch.cuda.get_device_capability(index)[0]


def serves(
    device: torch.device,
    activation_dtype: torch.dtype,
    in_features: int,
    out_features: int,
    quantizers: tuple[Optional[Quantizer], ...],
) -> Optional[str]:
    """Why this op cannot serve a GroupedLinear call (None: it serves): the device, the
    dtype, the feature alignment its kernels need, or a recipe it has no grouped GEMM
    for (the loop serves those)."""
    if _private.grouped_mm() is None:
        return f"torch {torch.__version__} has no torch._grouped_mm"
    quantized = [q for q in quantizers if q is not None]
    if quantized:
        if not all(type(q) is Float8CurrentScalingQuantizer for q in quantized):
            names = sorted({type(q).__name__ for q in quantized})
            return f"no grouped GEMM for the {', '.join(names)} recipe here"
        if quantizers[0] is None or quantizers[1] is None:
            return "FP8 current scaling without an input or weight quantizer"
        if quantizers[0].fp8_dtype != _E4M3 or quantizers[1].fp8_dtype != _E4M3:
            return "the grouped FP8 GEMM takes E4M3 forward operands"
    if device.type == "cpu":
        if activation_dtype not in _CPU_DTYPES:
            return f"{activation_dtype} activations"
        align = 4  # fp32 operands, 16-byte strides
    elif device.type == "cuda":
        if not _native_device(device):
            return "a CUDA device of compute capability below 9.0"
        if activation_dtype != _BF16:
            return f"{activation_dtype} activations (the grouped GEMM is bf16)"
        if quantized and _private.scaled_grouped_mm() is None:
            return f"torch {torch.__version__} has no torch._scaled_grouped_mm"
        align = 16 if quantized else 8
    else:
        return f"a {device.type} device"
    if in_features % align or out_features % align:
        return (
            f"in_features={in_features} and out_features={out_features} must be multiples of "
            f"{align} (16-byte strides)"
        )
    return None


# --- Shared pieces -----------------------------------------------------------------


def _check(args: GroupedGemmFwdArgs) -> tuple[Any, Any, Any]:
    """``(G, N, K)`` after checking shapes (real and fake)."""
    where = "GroupedGemmFwdArgs"
    inp, weight, bias, splits = args.inp, args.weight, args.bias, args.m_splits
    if len(weight.shape) != 3:
        raise ValueError(
            f"{where}.weight: [num_gemms, out, in] expected, got {tuple(weight.shape)}"
        )
    g, n, k = weight.shape
    if len(inp.shape) < 1 or inp.shape[-1] != k:
        raise ValueError(f"{where}.inp: last dim {tuple(inp.shape)[-1:]}, expected {k}")
    if bias is not None and tuple(bias.shape) != (g, n):
        raise ValueError(f"{where}.bias: shape {tuple(bias.shape)}, expected ({g}, {n})")
    if splits.dtype not in _ROW_COUNT_DTYPES:
        raise TypeError(
            f"{where}.m_splits: dtype {splits.dtype}; row counts must be an integer tensor "
            "(int64), not truncated from another dtype"
        )
    if tuple(splits.shape) != (g,):
        raise ValueError(
            f"{where}.m_splits: shape {tuple(splits.shape)}, expected ({g},) (one row count "
            "per GEMM)"
        )
    if splits.device != inp.device:
        raise ValueError(
            f"{where}.m_splits: on {splits.device}, the input on {inp.device}; the grouped GEMM "
            "reads the row counts on the input's device"
        )
    return g, n, k


def _offsets(splits: torch.Tensor, rows: int) -> torch.Tensor:
    """The int32 end row of each group, after checking the counts against the rows."""
    _moe.device_check(
        (splits >= 0).all() & (splits.sum() == rows),
        lambda: f"GroupedLinear: m_splits {splits.tolist()} must be non-negative and sum to "
        f"the input's {rows} rows",
        "GroupedLinear: m_splits negative or not summing to the input's rows",
    )
    return torch.cumsum(splits, 0).to(torch.int32)


def _groups(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """The group of each row (int64)."""
    index = torch.arange(rows, device=offsets.device, dtype=torch.int32)
    return torch.searchsorted(offsets, index, right=True)


def _quantize_groups(
    x: torch.Tensor, group: torch.Tensor, groups: int, quantizer: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scale_inv)``: the rows of ``x`` ``[M, K]`` quantized with one current
    scale per group (its rows' amax), as the per-GEMM quantizer would quantize each
    group on its own (the same codes): uint8 ``[M, K]`` and fp32 ``[G]`` (+Inf where a
    group holds an Inf)."""
    row_amax, row_inf = _row_stats(x)
    amax = torch.zeros(groups, dtype=_F32, device=x.device)
    inf = torch.zeros(groups, dtype=_F32, device=x.device)
    amax.scatter_reduce_(0, group, row_amax, "amax")
    inf.scatter_reduce_(0, group, row_inf.to(_F32), "amax")
    scale = quantizer._scale_of_amax(amax)
    codes = _cast_rows(x, scale[group], quantizer.fp8_dtype)
    return codes, _scale_inverse(scale, inf)


def _quantize_weights(w: torch.Tensor, quantizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes [G, N, K], scale_inv [G])``: each GEMM's weight quantized on its own."""
    g, n, k = w.shape
    rows = w.reshape(g * n, k)
    row_amax, row_inf = _row_stats(rows)
    amax = row_amax.view(g, n).amax(dim=1)  # the caller's features are never 0
    scale = quantizer._scale_of_amax(amax)
    codes = _cast_rows(rows, scale.repeat_interleave(n), quantizer.fp8_dtype)
    inf = row_inf.view(g, n).any(dim=1).to(_F32)
    return codes.view(g, n, k), _scale_inverse(scale, inf)


def _row_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(finite amax fp32 [M], has Inf bool [M])`` of each row of ``x`` ``[M, K]``: one
    read by a kernel on CUDA (``kernels/group_fp8_kernels.py``), else torch ops on an
    fp32 copy (the same values: max is exact)."""
    if group_fp8_kernels.eligible(x):
        return group_fp8_kernels.row_amax(x)
    x32 = x.to(_F32)
    if not x.shape[1]:
        return x32.new_zeros(x.shape[0]), torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    return finite_abs(x32).amax(dim=1), torch.isinf(x32).any(dim=1)


def _cast_rows(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """uint8 FP8 codes of each row of ``x`` ``[M, K]`` times its ``scale`` (fp32 ``[M]``):
    one read and one write by a kernel on CUDA, else torch ops (the same bits)."""
    if group_fp8_kernels.eligible(x):
        return group_fp8_kernels.cast_rows(x, scale, fp8_dtype)
    return cast_to_fp8(x.to(_F32) * scale[:, None], fp8_dtype)


def _scale_inverse(scale: torch.Tensor, inf: torch.Tensor) -> torch.Tensor:
    inv = 1.0 / scale
    return torch.where(inf > 0, torch.full_like(inv, float("inf")), inv)


def _dequantized(codes: torch.Tensor, fp8_dtype: torch.dtype, scale_inv: torch.Tensor) -> Any:
    """fp32 values of ``codes`` (``[M, K]`` with ``scale_inv`` per row, or ``[G, N, K]``
    with one per GEMM)."""
    values = fp8_to_float(codes, fp8_dtype)
    shape = (-1,) + (1,) * (codes.dim() - 1)
    return values * scale_inv.reshape(shape)


def _dequantized_rows(
    codes: torch.Tensor, fp8_dtype: torch.dtype, scale_inv: torch.Tensor, work: torch.dtype
) -> torch.Tensor:
    """``work`` values of ``codes`` ``[M, K]``, each row times its ``scale_inv``: one
    read and one write by a kernel on CUDA (``kernels/group_fp8_kernels.py``), else
    torch ops through fp32 (the same values; a NaN's payload aside)."""
    if group_fp8_kernels.eligible(codes):
        return group_fp8_kernels.dequantize_rows(codes, fp8_dtype, scale_inv, work)
    v = _dequantized(codes, fp8_dtype, scale_inv)
    return v if v.dtype == work else v.to(work)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy of it where its data does not start on 16 bytes (the grouped
    GEMMs' TMA loads need that; a view into a larger tensor may start anywhere)."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _grouped(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return _private.grouped_mm()(_aligned(a), _aligned(b), offs=offsets)


def _scaled_grouped(
    a_codes: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    offsets: torch.Tensor,
    gemm: GemmConfig,
) -> torch.Tensor:
    """``torch._scaled_grouped_mm`` of E4M3 ``a_codes`` (row-major) and ``b`` (E4M3,
    column-major ``[G, K, N]``), bf16 out."""
    return _private.scaled_grouped_mm()(
        _aligned(a_codes).view(_E4M3),
        _aligned(b),
        scale_a.contiguous(),
        scale_b.contiguous(),
        offs=offsets,
        out_dtype=_BF16,
        use_fast_accum=not gemm.use_split_accumulator,
    )


# --- Forward -----------------------------------------------------------------------


def grouped_gemm_forward(args: GroupedGemmFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((out,), saved)``: ``saved`` is ``(input codes, input scale_inv, weight codes,
    weight scale_inv)`` under FP8, else four Nones."""
    g, n, k = _check(args)
    x = args.inp.reshape(-1, k).contiguous()
    rows, dtype = x.shape[0], args.activation_dtype
    offsets = _offsets(args.m_splits, rows)
    weight = args.weight
    saved: tuple[Any, ...] = (None, None, None, None)
    if rows == 0:
        out = x.new_zeros((0, n), dtype=dtype)
        return (out.view(*args.inp.shape[:-1], n),), saved
    quantized = args.input_quantizer is not None
    group = _groups(offsets, rows) if quantized or args.bias is not None else None
    if quantized:
        x_codes, x_inv = _quantize_groups(x, group, g, args.input_quantizer)
        w_codes, w_inv = _quantize_weights(weight, args.weight_quantizer)
        saved = (x_codes, x_inv, w_codes, w_inv)
        if x.device.type == "cuda":
            out = _scaled_grouped(
                x_codes,
                w_codes.view(_E4M3).transpose(1, 2),
                x_inv[group],
                w_inv[:, None].expand(g, n),
                offsets,
                args.fprop_gemm,
            )
        else:
            xd = _dequantized(x_codes, _E4M3, x_inv[group])
            out = _grouped(xd, _dequantized(w_codes, _E4M3, w_inv).transpose(1, 2), offsets)
    elif x.device.type == "cuda":
        out = _grouped(x.to(_BF16), weight.to(_BF16).transpose(1, 2), offsets)
    else:
        out = _grouped(x.to(_F32), weight.to(_F32).transpose(1, 2), offsets)
    if args.bias is not None:
        if out.dtype != _F32:
            out = out.to(_F32)
        out = out + args.bias.to(_F32)[group]
    return (out.to(dtype).view(*args.inp.shape[:-1], n),), saved


def grouped_gemm_forward_spec(args: GroupedGemmFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    g, n, k = _check(args)
    inp, device = args.inp, args.inp.device
    out = TensorSpec((*inp.shape[:-1], n), args.activation_dtype, device=device)
    rows = 1
    for d in inp.shape[:-1]:
        rows = rows * d
    if args.input_quantizer is None or rows == 0:
        return (out,), (None, None, None, None)
    return (out,), (
        TensorSpec((rows, k), torch.uint8, device=device),
        TensorSpec((g,), _F32, device=device),
        TensorSpec((g, n, k), torch.uint8, device=device),
        TensorSpec((g,), _F32, device=device),
    )


def grouped_gemm_setup_context(
    args: GroupedGemmFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    grad = args.is_grad_enabled
    x_codes, x_inv, w_codes, w_inv = saved
    return dict(
        input_codes=x_codes,
        input_scale_inv=x_inv,
        weight_codes=w_codes,
        weight_scale_inv=w_inv,
        requires_dgrad=grad and args.input_requires_grad,
        requires_wgrad=grad and args.weight_requires_grad,
        requires_bgrad=grad and args.bias is not None and args.bias_requires_grad,
        has_bias=args.bias is not None,
    )


# --- Backward ----------------------------------------------------------------------


def grouped_gemm_backward(args: GroupedGemmBwdArgs) -> tuple[Any, ...]:
    """``(dgrad, wgrad [G, N, K], bgrad [G, N])``, None where not required."""
    weight, dtype = args.weight, args.activation_dtype
    g, n, k = weight.shape
    x = args.inp.reshape(-1, k).contiguous()
    dy = args.grad_outputs[0].reshape(-1, n).contiguous()
    rows, device = x.shape[0], x.device
    dgrad = wgrad = bgrad = None
    if not (args.requires_dgrad or args.requires_wgrad or args.requires_bgrad):
        return dgrad, wgrad, bgrad
    if rows == 0:
        dgrad = x.new_zeros(x.shape, dtype=args.inp.dtype).view(args.inp.shape)
        wgrad = weight.new_zeros((g, n, k), dtype=dtype)
        bgrad = weight.new_zeros((g, n), dtype=dtype)
        return (
            dgrad if args.requires_dgrad else None,
            wgrad if args.requires_wgrad else None,
            bgrad if args.requires_bgrad else None,
        )
    offsets = torch.cumsum(args.m_splits, 0).to(torch.int32)
    cuda = device.type == "cuda"
    quantized = args.input_codes is not None
    group = _groups(offsets, rows) if quantized else None
    if quantized:
        gq = args.grad_output_quantizer
        dy_codes, dy_inv = _quantize_groups(dy, group, g, gq)
        # The dequantized operands, made where a GEMM reads them (bf16 on CUDA, fp32 on
        # the CPU: one rounding of each fp32 value).
        work = _BF16 if cuda else _F32
        made: dict[str, torch.Tensor] = {}

        def values(name: str) -> torch.Tensor:
            if name not in made:
                if name == "dy":
                    v = _dequantized_rows(dy_codes, gq.fp8_dtype, dy_inv[group], work)
                elif name == "x":
                    inv = args.input_scale_inv[group]
                    v = _dequantized_rows(args.input_codes, _E4M3, inv, work)
                else:
                    codes = args.weight_codes.reshape(g * n, k)
                    inv = args.weight_scale_inv.repeat_interleave(n)
                    v = _dequantized_rows(codes, _E4M3, inv, work).view(g, n, k)
                made[name] = v
            return made[name]

        if args.requires_dgrad:
            if cuda and gq.fp8_dtype == _E4M3:
                columns = args.weight_codes.transpose(1, 2).contiguous()  # [G, K, N]
                dgrad = _scaled_grouped(
                    dy_codes,
                    columns.view(_E4M3).transpose(1, 2),
                    dy_inv[group],
                    args.weight_scale_inv[:, None].expand(g, k),
                    offsets,
                    args.dgrad_gemm,
                )
            else:
                dgrad = _grouped(values("dy"), values("w"), offsets)
        if args.requires_wgrad:
            wgrad = _grouped(values("dy").t(), values("x"), offsets)
    else:
        work = _BF16 if cuda else _F32
        dyw = dy.to(work)
        if args.requires_dgrad:
            dgrad = _grouped(dyw, weight.to(work), offsets)
        if args.requires_wgrad:
            wgrad = _grouped(dyw.t(), x.to(work), offsets)
    if args.requires_bgrad:  # from the unquantized gradient, as the loop's
        bgrad = _bias_grads(dy, offsets, args.m_splits, dtype)
    if dgrad is not None:
        dgrad = dgrad.to(args.inp.dtype).view(args.inp.shape)
    if wgrad is not None:
        wgrad = wgrad.to(dtype)
    return dgrad, wgrad, bgrad


def _bias_grads(
    dy: torch.Tensor, offsets: torch.Tensor, splits: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``[G, N]``: each group's column sums of ``dy``, accumulated in fp32. On CUDA a
    grouped GEMM with a ones column (deterministic, no host read); on the CPU each
    group's ``sum`` (the row counts read on the host), the loop's own numbers."""
    if dy.device.type != "cuda":
        parts = dy.split([int(s) for s in splits.tolist()])
        return torch.stack([p.sum(0, dtype=_F32) for p in parts]).to(dtype)
    return _ones_column_sums(dy, offsets).to(dtype)


def _ones_column_sums(dy: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``[G, N]`` bf16: each group's column sums of ``dy``, as one grouped GEMM of
    ``dy^T`` with a column of ones (eight: 16-byte strides), fp32 accumulation inside."""
    ones = torch.ones((dy.shape[0], 8), dtype=_BF16, device=dy.device)
    return _grouped(dy.to(_BF16).t(), ones, offsets)[:, :, 0]


def grouped_gemm_backward_spec(args: GroupedGemmBwdArgs) -> tuple[Any, ...]:
    weight, dtype, device = args.weight, args.activation_dtype, args.inp.device
    g, n, k = weight.shape
    dgrad = TensorSpec(tuple(args.inp.shape), args.inp.dtype, device=device)
    wgrad = TensorSpec((g, n, k), dtype, device=device)
    bgrad = TensorSpec((g, n), dtype, device=device)
    return (
        dgrad if args.requires_dgrad else None,
        wgrad if args.requires_wgrad else None,
        bgrad if args.requires_bgrad else None,
    )


GROUPED_GEMM = OpDeclaration(
    name="grouped_gemm",
    forward=GroupedGemmFwdArgs,
    backward=GroupedGemmBwdArgs,
    grad_fields=("inp", "weight", "bias"),
    forward_impl=grouped_gemm_forward,
    backward_impl=grouped_gemm_backward,
    forward_spec=grouped_gemm_forward_spec,
    backward_spec=grouped_gemm_backward_spec,
    setup_context=grouped_gemm_setup_context,
)
