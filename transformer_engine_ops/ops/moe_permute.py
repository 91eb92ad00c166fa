"""The MoE permute op: TE's ``moe_permute`` / ``moe_permute_with_probs`` /
``moe_permute_and_pad_with_probs``, tokens grouped by the experts they are routed to.

``map_type="mask"``: ``routing_map`` ``[T, E]`` marks the experts of each token; output
row block ``e`` holds expert ``e``'s tokens in token order, experts in order (after
``pad_offsets[e]`` zero rows when padding, TE's fused padding). With ``probs``
``[T, E]`` the routed probabilities are permuted alongside, and, as TE's kernel does, a
routed row whose probability is 0 is written as zeros. ``map_type="index"``:
``routing_map`` ``[T, K]`` holds each token's ``K`` expert ids; the ``T * K`` copies
are sorted by expert, stably, and the first ``num_out_tokens`` kept (0: all). The
second output is TE's ``row_id_map`` for the inverse (``ops/_moe.py``).

The output has ``num_out_tokens`` rows whatever the routing (0 rows for 0 tokens, as
TE): rows past the routed copies are zeros, and routing more copies than that is
refused (a ValueError on the CPU, a device-side assertion on CUDA, where nothing is
read on the host). The backward sums each token's rows in fp32 (``_moe.token_sum``:
one Triton kernel on CUDA), and gathers the permuted probabilities' gradient back.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch

from transformer_engine_ops.ops import _moe
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.tensor_spec import TensorSpec

MapType = Literal["mask", "index"]


@dataclass
class MoePermuteFwdArgs:
    """Everything permuting tokens to their experts needs."""

    # --- Differentiable inputs ---
    inp: torch.Tensor  # [T, H]
    probs: Optional[torch.Tensor]  # mask map only: [T, E], permuted alongside

    # --- Routing ---
    routing_map: torch.Tensor  # mask: [T, E] (nonzero: routed); index: [T, K] expert ids
    pad_offsets: Optional[torch.Tensor]  # mask map only: [E] zero rows before expert e
    map_type: MapType
    num_out_tokens: int  # rows of the output (index map: 0 means T * K)

    inp_requires_grad: bool
    probs_requires_grad: bool

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class MoePermuteBwdArgs:
    """Everything the permute's backward needs."""

    grad_outputs: list[torch.Tensor]  # (output, row_id_map, permuted probs)

    row_id_map: torch.Tensor
    pad_offsets: Optional[torch.Tensor]
    map_type: MapType
    topk: int  # index map: K (the mask map's E is in its row_id_map)

    requires_dgrad: bool
    requires_probs_grad: bool


# --- The plan: what the real and fake kernels share ----------------------------------


def _plan(args: MoePermuteFwdArgs) -> tuple[Any, Any]:
    """Checks the bundle; ``(rows of the output, row_id_map's shape)``."""
    where = "MoePermuteFwdArgs"
    inp, rmap = args.inp, args.routing_map
    if len(inp.shape) != 2 or len(rmap.shape) != 2 or rmap.shape[0] != inp.shape[0]:
        raise ValueError(
            f"{where}: inp [num_tokens, hidden] and routing_map [num_tokens, ...] expected, "
            f"got inp {tuple(inp.shape)}, routing_map {tuple(rmap.shape)}"
        )
    if args.map_type not in ("mask", "index"):
        raise ValueError(f"{where}.map_type: 'mask' or 'index', got {args.map_type!r}")
    tokens, width = inp.shape[0], rmap.shape[1]
    n = args.num_out_tokens
    if args.map_type == "index":
        for name in ("probs", "pad_offsets"):
            if getattr(args, name) is not None:
                raise ValueError(f"{where}.{name}: the mask map's; map_type='index' takes none")
        if rmap.dtype.is_floating_point or rmap.dtype.is_complex or rmap.dtype == torch.bool:
            raise TypeError(
                f"{where}.routing_map: expert ids of an integer dtype, got {rmap.dtype}"
            )
        if type(n) is int and n < 0:
            raise ValueError(f"moe_permute (index map) requires num_out_tokens >= 0, got {n}.")
        rows = 0 if tokens == 0 else (n if type(n) is not int or n > 0 else tokens * width)
        return rows, (width * tokens,)
    if args.probs is not None and tuple(args.probs.shape) != tuple(rmap.shape):
        raise ValueError(
            f"{where}.probs: shape {tuple(args.probs.shape)}, expected the routing map's "
            f"{tuple(rmap.shape)}"
        )
    pad = args.pad_offsets
    if pad is not None and tuple(pad.shape) != (width,):
        raise ValueError(
            f"{where}.pad_offsets: shape {tuple(pad.shape)}, expected ({width},) (one per expert)"
        )
    if tokens != 0 and type(n) is int and n <= 0:
        raise ValueError(
            f"moe_permute (mask map) requires num_out_tokens > 0, got {n}. "
            "Use int(routing_map.sum()) or num_tokens * top_k."
        )
    return (0 if tokens == 0 else n), (tokens, 2 * width + 1)


def _check_fits(rows: torch.Tensor, num_rows: int, map_type: str) -> None:
    """Every routed copy lands within the output's rows."""
    _moe.device_check(
        (rows < num_rows).all(),
        lambda: f"moe_permute ({map_type} map): the routing places {int((rows >= 0).sum())} "
        f"copies up to row {int(rows.max())}, past num_out_tokens={num_rows} rows; pass "
        "num_out_tokens of at least the routed count (plus padding)",
        "moe_permute: routed rows past num_out_tokens",
    )


# --- Forward ---------------------------------------------------------------------


def moe_permute_forward(args: MoePermuteFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((output, row_id_map, permuted_probs), ())``; ``permuted_probs`` empty
    (``_moe.absent``) without ``probs``."""
    num_rows, _ = _plan(args)
    inp, rmap = args.inp, args.routing_map
    if args.map_type == "index":
        if rmap.dtype != torch.int32:
            warnings.warn(
                f"The data type of the input `index` of Permute is {rmap.dtype}! "
                "The recommended type is torch.int32.",
                stacklevel=2,
            )
        k = rmap.shape[1]
        order = _moe.index_order(rmap)
        kept = min(num_rows, order.numel())
        token = torch.full((num_rows,), -1, dtype=torch.int64, device=inp.device)
        token[:kept] = order[:kept] // k
        row_id_map = _moe.index_row_id_map(rmap, num_rows)
        return (_moe.gather_rows(inp, token), row_id_map, _moe.absent(inp.device)), ()
    row_id_map = _moe.mask_row_id_map(rmap)
    rows, experts, _ = _moe.mask_table(row_id_map, args.pad_offsets)
    if rows.numel():
        _check_fits(rows, num_rows, "mask")
    width = rows.shape[1]
    sources = _moe.row_sources(rows, num_rows)
    routed = sources >= 0
    token = torch.where(routed, sources // max(width, 1), -1)
    out = _moe.gather_rows(inp, token)
    permuted_probs = _moe.absent(inp.device)
    if args.probs is not None:
        expert = torch.where(routed, experts.reshape(-1)[sources.clamp_min(0)], -1)
        flat = torch.where(routed, token * width + expert, -1)
        permuted_probs = _moe.gather_rows(args.probs.reshape(-1, 1), flat).view(-1)
        # TE's kernel: a routed copy of probability 0 is padding of the routing map.
        out.masked_fill_((routed & (permuted_probs == 0))[:, None], 0)
    return (out, row_id_map, permuted_probs), ()


def moe_permute_forward_spec(args: MoePermuteFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    num_rows, map_shape = _plan(args)
    inp, device = args.inp, args.inp.device
    out = TensorSpec((num_rows, inp.shape[1]), inp.dtype, device=device)
    row_id_map = TensorSpec(map_shape, _moe.ROW_ID_DTYPE, device=device)
    probs = args.probs
    if probs is None:
        permuted = TensorSpec(_moe.ABSENT_SHAPE, _moe.ABSENT_DTYPE, device=device)
    else:
        permuted = TensorSpec((num_rows,), probs.dtype, device=device)
    return (out, row_id_map, permuted), ()


def moe_permute_setup_context(
    args: MoePermuteFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    grad = args.is_grad_enabled
    return dict(
        row_id_map=outputs[1],
        topk=args.routing_map.shape[1] if args.map_type == "index" else 0,
        requires_dgrad=grad and args.inp_requires_grad,
        requires_probs_grad=grad and args.probs is not None and args.probs_requires_grad,
    )


# --- Backward --------------------------------------------------------------------


def moe_permute_backward(args: MoePermuteBwdArgs) -> tuple[Optional[torch.Tensor], ...]:
    """Gradients of ``(inp, probs)``: each token's rows summed (fp32, in the row map's
    order), and each routed probability's permuted gradient put back (zeros elsewhere)."""
    g = args.grad_outputs[0]
    dgrad = dprobs = None
    if args.map_type == "index":
        if args.requires_dgrad:
            rows = _moe.index_table(args.row_id_map, args.topk)
            dgrad = _moe.token_sum(g, rows, None, None, g.dtype)
        return dgrad, None
    rows, experts, counts = _moe.mask_table(args.row_id_map, args.pad_offsets)
    if args.requires_dgrad:
        dgrad = _moe.token_sum(g, rows, counts, None, g.dtype)
    if args.requires_probs_grad:
        dprobs = _probs_grad(args.grad_outputs[2], rows, experts)
    return dgrad, dprobs


def _probs_grad(g: torch.Tensor, rows: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """``[T, E]``: the gradient of each routed probability (at its row of ``g``), 0 for
    the others."""
    tokens, width = rows.shape
    values = _moe.gather_rows(g.view(-1, 1), rows.reshape(-1)).view(tokens, width)
    # A free slot writes a spare column of its own: no two writes meet.
    spare = width + torch.arange(width, device=rows.device).expand(tokens, width)
    column = torch.where(experts >= 0, experts, spare)
    out = torch.zeros((tokens, 2 * width), dtype=g.dtype, device=g.device)
    return out.scatter_(1, column, values)[:, :width].contiguous()


def moe_permute_backward_spec(args: MoePermuteBwdArgs) -> tuple[Optional[TensorSpec], ...]:
    g = args.grad_outputs[0]
    rmap, device = args.row_id_map, g.device
    tokens = rmap.shape[0] // args.topk if args.map_type == "index" else rmap.shape[0]
    dgrad = (
        TensorSpec((tokens, g.shape[1]), g.dtype, device=device) if args.requires_dgrad else None
    )
    dprobs = None
    if args.requires_probs_grad:
        width = _moe.mask_experts(rmap)
        dprobs = TensorSpec((tokens, width), args.grad_outputs[2].dtype, device=device)
    return dgrad, dprobs


MOE_PERMUTE = OpDeclaration(
    name="moe_permute",
    forward=MoePermuteFwdArgs,
    backward=MoePermuteBwdArgs,
    grad_fields=("inp", "probs"),
    forward_impl=moe_permute_forward,
    backward_impl=moe_permute_backward,
    forward_spec=moe_permute_forward_spec,
    backward_spec=moe_permute_backward_spec,
    setup_context=moe_permute_setup_context,
)
