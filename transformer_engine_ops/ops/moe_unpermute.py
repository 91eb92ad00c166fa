"""The MoE unpermute op: TE's ``moe_unpermute``, each token's expert outputs summed back
into its row, weighted by the merging probabilities when given.

``row_id_map`` is the permute's (``ops/_moe.py``). ``map_type="mask"``: token ``t``'s
row is the sum over its routed experts, in the map's order, of the expert's row (after
``pad_offsets`` when the permute padded) times ``merging_probs[t, e]``;
``map_type="index"``: over its ``K`` choices (rows the permute dropped skipped), times
``merging_probs[t, k]``; without probabilities the index map restores the ``T * K``
copies one per row. Products and the sum are fp32, rounded once (TE's kernel); the sum
is one Triton kernel on CUDA (``_moe.token_sum``), computed inside this op so that a
compiled call adds in eager's order.

The backward puts each token's gradient (times its probability, rounded to the data's
dtype) back at the rows it came from (zeros at rows no token reads), and the
probabilities' gradient is the fp32 dot product of each row read with its token's
gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from transformer_engine_ops.ops import _moe
from transformer_engine_ops.ops.moe_permute import MapType
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.tensor_spec import TensorSpec


@dataclass
class MoeUnpermuteFwdArgs:
    """Everything unpermuting the experts' rows needs."""

    # --- Differentiable inputs ---
    inp: torch.Tensor  # [N, H]: the permuted rows
    merging_probs: Optional[torch.Tensor]  # mask: [T, E]; index: [T, K] (fp32)

    # --- The permute's map ---
    row_id_map: torch.Tensor
    pad_offsets: Optional[torch.Tensor]  # mask map only: [E]
    map_type: MapType
    num_tokens: int  # rows of the output

    inp_requires_grad: bool
    probs_requires_grad: bool

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class MoeUnpermuteBwdArgs:
    """Everything the unpermute's backward needs."""

    grad_outputs: list[torch.Tensor]

    inp: Optional[torch.Tensor]  # the forward's rows (read for the probabilities' gradient)
    merging_probs: Optional[torch.Tensor]
    row_id_map: torch.Tensor
    pad_offsets: Optional[torch.Tensor]
    map_type: MapType
    num_rows: int  # N: the forward input's rows

    requires_dgrad: bool
    requires_probs_grad: bool


def _table(row_id_map: Any, pad_offsets: Any, map_type: str, probs: Any) -> tuple[Any, Any, Any]:
    """``(rows [T, J], experts [T, J] or None, counts [T] or None)`` of the map: the mask
    map's table, or the index map's ``[T, K]`` rows (``[T * K, 1]`` without
    probabilities)."""
    if map_type == "mask":
        return _moe.mask_table(row_id_map, pad_offsets)
    topk = probs.shape[1] if probs is not None else 1
    return _moe.index_table(row_id_map, topk), None, None


def _plan(args: MoeUnpermuteFwdArgs) -> None:
    where = "MoeUnpermuteFwdArgs"
    inp, rmap, probs = args.inp, args.row_id_map, args.merging_probs
    if len(inp.shape) != 2:
        raise ValueError(f"{where}.inp: [rows, hidden] expected, got {tuple(inp.shape)}")
    if args.map_type not in ("mask", "index"):
        raise ValueError(f"{where}.map_type: 'mask' or 'index', got {args.map_type!r}")
    t = args.num_tokens
    if args.map_type == "mask":
        if len(rmap.shape) != 2 or rmap.shape[1] % 2 != 1 or rmap.shape[0] != t:
            raise ValueError(
                f"{where}.row_id_map: a mask map [num_tokens={t}, 2 * experts + 1] expected, "
                f"got {tuple(rmap.shape)}"
            )
        width = _moe.mask_experts(rmap)
        if probs is not None and tuple(probs.shape) != (t, width):
            raise ValueError(
                f"{where}.merging_probs: shape {tuple(probs.shape)}, expected ({t}, {width}) "
                "(one per token and expert)"
            )
        pad = args.pad_offsets
        if pad is not None and tuple(pad.shape) != (width,):
            raise ValueError(f"{where}.pad_offsets: shape {tuple(pad.shape)}, expected ({width},)")
        return
    if args.pad_offsets is not None:
        raise ValueError(f"{where}.pad_offsets: the mask map's; map_type='index' takes none")
    topk = probs.shape[1] if probs is not None else 1
    if len(rmap.shape) != 1 or (probs is not None and len(probs.shape) != 2):
        raise ValueError(
            f"{where}: an index map [num_tokens * topK] and merging_probs [num_tokens, topK] "
            f"expected, got row_id_map {tuple(rmap.shape)}, merging_probs "
            f"{None if probs is None else tuple(probs.shape)}"
        )
    if rmap.shape[0] != t * topk:
        raise ValueError(
            f"{where}.row_id_map: {rmap.shape[0]} entries, expected num_tokens * topK = "
            f"{t} * {topk}"
        )


def _check_rows(rows: torch.Tensor, num_rows: int) -> None:
    if rows.numel():
        _moe.device_check(
            (rows < num_rows).all(),
            lambda: f"moe_unpermute: the row_id_map reads row {int(rows.max())} of an input "
            f"of {num_rows} rows (a map of another permute?)",
            "moe_unpermute: row_id_map reads past the input's rows",
        )


def _slot_weights(probs: Optional[torch.Tensor], experts: Optional[torch.Tensor]) -> Any:
    """The merging probability of each slot of the table (index map: the probs as
    they are)."""
    if probs is None or experts is None:
        return probs
    return probs.gather(1, experts.clamp_min(0))


# --- Forward ---------------------------------------------------------------------


def moe_unpermute_forward(args: MoeUnpermuteFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((out,), ())``: ``out`` ``[num_tokens, H]`` of ``inp``'s dtype."""
    _plan(args)
    inp = args.inp
    rows, experts, counts = _table(
        args.row_id_map, args.pad_offsets, args.map_type, args.merging_probs
    )
    _check_rows(rows, inp.shape[0])
    weights = _slot_weights(args.merging_probs, experts)
    return (_moe.token_sum(inp, rows, counts, weights, inp.dtype),), ()


def moe_unpermute_forward_spec(
    args: MoeUnpermuteFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    _plan(args)
    inp = args.inp
    return (TensorSpec((args.num_tokens, inp.shape[1]), inp.dtype, device=inp.device),), ()


def moe_unpermute_setup_context(
    args: MoeUnpermuteFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    grad = args.is_grad_enabled
    probs_grad = grad and args.merging_probs is not None and args.probs_requires_grad
    return dict(
        inp=args.inp if probs_grad else None,
        num_rows=args.inp.shape[0],
        requires_dgrad=grad and args.inp_requires_grad,
        requires_probs_grad=probs_grad,
    )


# --- Backward --------------------------------------------------------------------


def moe_unpermute_backward(args: MoeUnpermuteBwdArgs) -> tuple[Optional[torch.Tensor], ...]:
    """Gradients of ``(inp, merging_probs)``."""
    g = args.grad_outputs[0]
    probs = args.merging_probs
    rows, experts, _ = _table(args.row_id_map, args.pad_offsets, args.map_type, probs)
    tokens, width = rows.shape
    sources = _moe.row_sources(rows, args.num_rows)
    routed = sources >= 0
    slots = max(width, 1)
    dgrad = dprobs = None
    if args.requires_dgrad:
        token = torch.where(routed, sources // slots, -1)
        dgrad = _moe.gather_rows(g, token)
        if probs is not None:
            weight = _moe.gather_rows(_slot_weights(probs, experts).reshape(-1, 1), sources)
            dgrad = (dgrad.to(torch.float32) * weight.to(torch.float32)).to(g.dtype)
    if args.requires_probs_grad:
        dots = _moe.slot_dot(args.inp, sources, g, slots)
        if experts is not None:
            # Each slot's dot product to its expert's column; free slots to spare ones.
            spare = width + torch.arange(width, device=rows.device).expand(tokens, width)
            column = torch.where(experts >= 0, experts, spare)
            full = torch.zeros((tokens, 2 * width), dtype=dots.dtype, device=dots.device)
            dots = full.scatter_(1, column, dots)[:, :width]
        dprobs = dots.to(probs.dtype).contiguous()
    return dgrad, dprobs


def moe_unpermute_backward_spec(args: MoeUnpermuteBwdArgs) -> tuple[Optional[TensorSpec], ...]:
    g = args.grad_outputs[0]
    device = g.device
    dgrad = dprobs = None
    if args.requires_dgrad:
        dgrad = TensorSpec((args.num_rows, g.shape[1]), g.dtype, device=device)
    if args.requires_probs_grad:
        probs = args.merging_probs
        dprobs = TensorSpec(tuple(probs.shape), probs.dtype, device=device)
    return dgrad, dprobs


MOE_UNPERMUTE = OpDeclaration(
    name="moe_unpermute",
    forward=MoeUnpermuteFwdArgs,
    backward=MoeUnpermuteBwdArgs,
    grad_fields=("inp", "merging_probs"),
    forward_impl=moe_unpermute_forward,
    backward_impl=moe_unpermute_backward,
    forward_spec=moe_unpermute_forward_spec,
    backward_spec=moe_unpermute_backward_spec,
    setup_context=moe_unpermute_setup_context,
)
