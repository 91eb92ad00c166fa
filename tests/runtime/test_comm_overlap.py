"""``runtime/comm_overlap.py`` on a one-rank group: the per-group switch, the reasons a
call falls back to the plain collective and GEMM, and (``gpu``) the fused
symmetric-memory ops on a one-rank NCCL group against a plain (or FP8) GEMM. The two-rank
behaviour inside the ops is ``tests/distributed/test_overlap_distributed.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from transformer_engine_ops.runtime import comm_overlap


@pytest.fixture
def group(request: pytest.FixtureRequest) -> Iterator[dist.ProcessGroup]:
    """A one-rank default group of ``request.param``'s backend (gloo unless given)."""
    backend = getattr(request, "param", "gloo")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        comm_overlap.disable(dist.group.WORLD)
        dist.destroy_process_group()


def test_enable_is_per_group_and_undone_by_disable(group: dist.ProcessGroup) -> None:
    other = dist.new_group([0])
    assert not comm_overlap.enabled(group)
    comm_overlap.enable(group)
    assert comm_overlap.enabled(group) and not comm_overlap.enabled(other)
    comm_overlap.disable(group)
    comm_overlap.disable(group)  # twice is fine
    assert not comm_overlap.enabled(group)


def test_fallback_reasons(group: dist.ProcessGroup) -> None:
    x = torch.ones(4, 4)
    assert comm_overlap.fused_reason(group, x) == "overlap is not enabled for the group"
    comm_overlap.enable(group)
    assert comm_overlap.fused_reason(group, x) == ("symmetric memory needs an NCCL group, not gloo")


@pytest.mark.parametrize("group", ["cpu:gloo"], indirect=True)
def test_a_per_device_backend_without_nccl_falls_back(group: dist.ProcessGroup) -> None:
    comm_overlap.enable(group)
    reason = comm_overlap.fused_reason(group, torch.ones(2, 2))
    assert reason is not None and reason.startswith("symmetric memory needs an NCCL group")


def test_a_non_group_is_refused() -> None:
    with pytest.raises(TypeError, match="expected a torch.distributed.ProcessGroup, got str"):
        comm_overlap.enable("tp")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("group", ["nccl"], indirect=True)
def test_fused_ops_on_one_rank_equal_the_plain_gemm(group: dist.ProcessGroup) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(256, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    b = torch.randn(128, 64, device="cuda", generator=gen, dtype=torch.bfloat16)
    comm_overlap.enable(group)
    assert comm_overlap.fused_reason(group, a, b) is None
    assert "CUDA floats" in comm_overlap.fused_reason(group, a.cpu(), b)
    want = a @ b
    gathered, out = comm_overlap.all_gather_matmul(a, b, group, return_gathered=True)
    assert torch.equal(gathered, a)
    torch.testing.assert_close(out, want)
    _, out = comm_overlap.all_gather_matmul(a, b, group, return_gathered=False)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(comm_overlap.matmul_reduce_scatter(a, b, group), want)
    # FP8: row-major A, column-major B, tensorwise scales, as the FP8 GEMM passes them.
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
    scale_a = torch.full((1,), 0.5, device="cuda")
    scale_b = torch.full((1,), 2.0, device="cuda")
    want8 = torch._scaled_mm(a8, b8, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    got8 = comm_overlap.scaled_matmul_reduce_scatter(
        a8, b8, scale_a, scale_b, group, out_dtype=torch.bfloat16, use_fast_accum=False
    )
    torch.testing.assert_close(got8, want8)
