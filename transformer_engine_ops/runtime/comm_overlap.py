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
32-bit float type, the op present in this torch; anything else (gloo on the CPU, an
FP8 GEMM) runs the plain collective and GEMM, bit for bit the non-overlapped path.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist

_FLOAT_TYPES = (torch.bfloat16, torch.float16, torch.float32)
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
    """``torch.ops.symm_mem`` once torch's symmetric-memory module has defined its ops
    (importing it defines them), or None when this torch has none."""
    try:
        import torch.distributed._symmetric_memory  # noqa: F401  (defines the ops)
    except ImportError:
        return None
    ops = torch.ops.symm_mem
    if not (
        hasattr(ops, "fused_all_gather_matmul") and hasattr(ops, "fused_matmul_reduce_scatter")
    ):
        return None
    return ops


def fused_reason(group: dist.ProcessGroup, *tensors: Any) -> str | None:
    """Why a call on ``group`` reading ``tensors`` runs the plain collective and GEMM;
    None when it takes the fused symmetric-memory path."""
    if not enabled(group):
        return "overlap is not enabled for the group"
    backend = dist.get_backend(group)
    if backend != "nccl":
        return f"symmetric memory needs an NCCL group, not {backend}"
    for t in tensors:
        if type(t) not in _PLAIN_TENSORS:
            return f"a {type(t).__name__} operand (the fused ops take plain tensors)"
        if not t.is_cuda or t.dtype not in _FLOAT_TYPES:
            return f"a {t.dtype} operand on {t.device} (the fused ops take CUDA floats)"
    if _symm_mem_ops() is None:
        return f"torch {torch.__version__} has no torch.ops.symm_mem fused ops"
    return None


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
