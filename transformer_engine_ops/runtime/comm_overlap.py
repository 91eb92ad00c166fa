"""Comm-GEMM overlap of the sequence-parallel collectives, with PyTorch's symmetric memory.

Sequence parallelism puts a collective right beside a GEMM at four places of a Linear:
the column-parallel forward all-gathers its input before the GEMM, the row-parallel
forward reduce-scatters the GEMM's output, and their backwards do the reverse (the
row-parallel dgrad GEMM reads the all-gathered output gradient, the column-parallel
dgrad is reduce-scattered). ``torch.ops.symm_mem.fused_all_gather_matmul`` and
``fused_matmul_reduce_scatter`` run such a pair micro-pipelined: the GEMM of one
rank's chunk overlaps the transfer of the next. They are called from the op's real
kernels, which eager and compiled calls share, so a compiled step keeps eager's bits.

Overlap is opted into per tensor-parallel group (:func:`enable`), as TE's userbuffers
are set up once per job: the flag is keyed by the group's c10d name, so two groups
cannot collide and no call changes another's state. A call takes the fused path only
where it can (:func:`fused_reason`): an NCCL group, plain CUDA tensors of a 16- or
32-bit float type, the op present in this torch; anything else (gloo on the CPU, a
block-scaled GEMM) runs the plain collective and GEMM, bit for bit the non-overlapped
path. An FP8 (tensorwise) GEMM before a reduce-scatter runs fused too
(:func:`scaled_matmul_reduce_scatter`); one after an all-gather cannot, while the
input is quantized after the gather with the gathered tensor's scale.

One more collective needs no fused op: column parallelism's backward re-gathers its
input for the weight gradient, a transfer no GEMM before it waits on; with overlap on
it is started before the dgrad GEMM and awaited at wgrad (:func:`start_all_gather_rows`,
TE's bulk overlap), on every backend.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist

from transformer_engine_ops.runtime import _torch_private as _private

_FLOAT_TYPES = (
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float8_e4m3fn,  # the FP8 GEMM's operands (scaled_matmul_reduce_scatter)
    torch.float8_e5m2,
)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)

# c10d group names that opted in; written by enable/disable (set-up), read by kernels.
_ENABLED: set[str] = set()
_LOCK = threading.Lock()


def enable(group: dist.ProcessGroup) -> None:
    """Overlap the sequence-parallel collectives of every op on ``group`` with their
    GEMMs from now on (where :func:`fused_reason` allows; elsewhere nothing changes)."""
    name = _group_name(group)
    with _LOCK:
        _ENABLED.add(name)


def disable(group: dist.ProcessGroup) -> None:
    """Undo :func:`enable` for ``group`` (a no-op when it was not enabled)."""
    name = _group_name(group)
    with _LOCK:
        _ENABLED.discard(name)


def enabled(group: dist.ProcessGroup) -> bool:
    """Whether :func:`enable` was called for ``group`` (and not undone)."""
    return _group_name(group) in _ENABLED


def _group_name(group: Any) -> str:
    name = getattr(group, "group_name", None)
    if not isinstance(group, dist.ProcessGroup) or not isinstance(name, str):
        raise TypeError(
            f"comm_overlap: expected a torch.distributed.ProcessGroup, got {type(group).__name__}"
        )
    return name


def _symm_mem_ops() -> Any:
    """``torch.ops.symm_mem`` with the fused ops used here defined, or None when this
    torch lacks one."""
    ops = _private.symm_mem_ops()
    if ops is None:
        return None
    names = (
        "fused_all_gather_matmul",
        "fused_matmul_reduce_scatter",
        "fused_scaled_matmul_reduce_scatter",
    )
    if not all(hasattr(ops, name) for name in names):
        return None
    return ops


def fused_reason(group: dist.ProcessGroup, *tensors: Any) -> str | None:
    """Why a call on ``group`` reading ``tensors`` runs the plain collective and GEMM;
    None when it takes the fused symmetric-memory path."""
    if not enabled(group):
        return "overlap is not enabled for the group"
    backend = dist.get_backend(group)  # "nccl", or per device: "cpu:gloo,cuda:nccl"
    if "nccl" not in backend.replace(":", ",").split(","):
        return f"symmetric memory needs an NCCL group, not {backend}"
    for t in tensors:
        if type(t) not in _PLAIN_TENSORS:
            return f"a {type(t).__name__} operand (the fused ops take plain tensors)"
        if not t.is_cuda or t.dtype not in _FLOAT_TYPES:
            return f"a {t.dtype} operand on {t.device} (the fused ops take CUDA floats or FP8)"
    if _symm_mem_ops() is None:
        return f"torch {torch.__version__} has no torch.ops.symm_mem fused ops"
    return None


class PendingGather:
    """An all-gather in flight (:func:`start_all_gather_rows`); :meth:`wait` returns its
    output once it has landed."""

    def __init__(self, out: torch.Tensor, work: Any) -> None:
        self._out, self._work = out, work

    def wait(self) -> torch.Tensor:
        self._work.wait()
        return self._out


_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def start_all_gather_rows(x: torch.Tensor, group: dist.ProcessGroup) -> PendingGather:
    """Start gathering ``x`` (rows, k) of every rank in rank order along dim 0, without
    waiting: the GEMMs issued before :meth:`PendingGather.wait` overlap the transfer (any
    backend; the same collective, so the same bits, as a blocking gather)."""
    x = x.contiguous()
    out = x.new_empty((x.shape[0] * group.size(), *x.shape[1:]))
    return PendingGather(out, _all_gather_tensor(out, x, group=group, async_op=True))


def all_gather_matmul(
    a_shard: torch.Tensor, b: torch.Tensor, group: dist.ProcessGroup, *, return_gathered: bool
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(gathered, gathered @ b)``: ``a_shard`` (rows, k) of every rank concatenated in
    rank order along dim 0 (None unless ``return_gathered``), times ``b`` (k, n), the
    all-gather overlapped with the GEMM. Only where :func:`fused_reason` is None."""
    gathered, (out,) = _symm_mem_ops().fused_all_gather_matmul(
        a_shard.contiguous(), [b], 0, group.group_name, return_A=return_gathered
    )
    return gathered, out


def matmul_reduce_scatter(
    a: torch.Tensor, b: torch.Tensor, group: dist.ProcessGroup
) -> torch.Tensor:
    """The sum over ranks of ``a @ b`` ((rows, k) @ (k, n)), keeping this rank's block of
    rows, the GEMM overlapped with the reduce-scatter. Only where :func:`fused_reason`
    is None."""
    return _symm_mem_ops().fused_matmul_reduce_scatter(
        a.contiguous(), b, "sum", 0, group.group_name
    )


def scaled_matmul_reduce_scatter(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    out_dtype: torch.dtype,
    use_fast_accum: bool,
) -> torch.Tensor:
    """:func:`matmul_reduce_scatter` of an FP8 GEMM: ``torch._scaled_mm(a, b, scale_a,
    scale_b)`` ((rows, k) row-major FP8 @ (k, n) column-major FP8, tensorwise scales) in
    ``out_dtype``, summed over ranks, this rank's rows kept. The GEMM runs per rank's
    block of rows, so ``rows / group.size()`` must suit ``_scaled_mm`` (a multiple of 16).
    Only where :func:`fused_reason` is None."""
    return _symm_mem_ops().fused_scaled_matmul_reduce_scatter(
        a,
        b,
        scale_a,
        scale_b,
        "sum",
        0,
        0,
        group.group_name,
        [a.shape[0], b.shape[1]],
        None,
        None,
        out_dtype,
        use_fast_accum,
    )
