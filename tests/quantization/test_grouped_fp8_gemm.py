"""The grouped FP8 GEMM kernels (the grouped GEMM's FP8 dgrad and wgrad) against the
exact sums, computed in float64.

A GEMM of FP8 codes is not bitwise equal to any torch op (its summation order is the
kernel's), so each result is held to a bound derived from how it is computed: each
product of two FP8 values is exact in fp32 (at most 4 x 4 significant bits); summing
R of them in fp32 errs by at most gamma_R * sum|a_r b_r| (gamma_R = R u / (1 - R u),
u = 2**-24); the scale is one fp32 multiply (u relative) and a bf16 result one more
rounding (2**-8 relative). A row in the wrong group, a wrong scale or a dropped tile
is off by far more than that.

Interpreter tests run the kernels on CPU tensors under ``TRITON_INTERPRET=1`` in a
child process (skipped when triton is not importable); ``gpu`` tests run them compiled
on CUDA.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math

import pytest
import torch

from tests.triton_interpreter import assert_interpreted
from transformer_engine_ops.kernels import grouped_fp8_gemm as gf

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
needs_fp8_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a CUDA GPU with FP8 tensor cores",
)
U = 2.0**-24  # fp32's unit roundoff
BF16_U = 2.0**-8
# Hopper's FP8 MMA keeps fewer bits of its running sum than fp32; the bound assumes 13
# (a unit roundoff of 2**-13). Without promotion (split_accumulator=False) that holds
# for the whole sum; with it, for each reduction tile's partial sum, which is then
# added to an fp32 accumulator (so the CUDA bound of a split accumulator is
# gamma_BR(2**-13) + gamma_(R/BR)(2**-24), BR the reduction tile).
FAST_U = 2.0**-13


def _gamma(r, acc):
    """The relative error bound of summing ``r`` products: ``acc`` is the unit roundoff
    of every add, or ``(u, chunk)``: partial sums of ``chunk`` products at ``u``, added
    in fp32."""

    def gamma(n, u):
        return n * u / (1 - n * u) if n else 0.0

    if isinstance(acc, tuple):
        u, chunk = acc
        return gamma(min(r, chunk), u) + gamma(-(-r // chunk), U)
    return gamma(r, acc)


def _codes(shape, fp8, seed, spread=4.0):
    """uint8 codes of random values of ``fp8`` (the extremes of the format among them)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * spread
    flat = x.view(-1)
    if flat.numel() > 4:
        top = torch.finfo(fp8).max
        flat[:4] = torch.tensor([top, -top, 2.0**-9, 0.0])
    return x.to(fp8).view(torch.uint8)


def _ends(counts):
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)


def _scale_invs(groups, seed):
    """One scale inverse per group, different enough that a row in the wrong group shows."""
    g = torch.Generator().manual_seed(seed)
    return (2.0 ** torch.randint(-6, 6, (groups,), generator=g)) * (
        1 + torch.rand(groups, generator=g)
    )


# name: (row counts of the groups, reduction R, columns C)
SHAPES = {
    "ragged": ([0, 37, 0, 100, 13], 200, 70),
    "one_group": ([5], 16, 3),
    "empty_then_one": ([0, 0, 0, 1], 129, 130),
    "tile_multiples": ([128, 256], 128, 128),
    "no_rows": ([0, 0, 0], 32, 8),
}
# Small tiles: groups spanning several row tiles and several column tiles.
SMALL_TILES = (32, 32, 64)


def _values(codes, fp8):
    return codes.view(fp8).double()


def _check(got, exact, magnitude, s, r, out_dtype, u_acc, what):
    """``got`` within the derived bound of ``exact``: the accumulation of ``r`` terms of
    ``magnitude = sum|a b|`` (``u_acc``: see :func:`_gamma`), the scale multiply, the
    output rounding."""
    got = got.double().cpu()
    assert got.shape == exact.shape, (what, got.shape, exact.shape)
    gamma = _gamma(r, u_acc)
    out_u = BF16_U if out_dtype == torch.bfloat16 else 0.0
    bound = gamma * magnitude * s + (U + out_u) * (1 + U) * (exact.abs() + gamma * magnitude * s)
    err = (got - exact).abs()
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, (
        f"{what}: {bad.shape[0]} beyond the bound, first at {bad[0].tolist()}: "
        f"{got[tuple(bad[0])].item()} vs {exact[tuple(bad[0])].item()} "
        f"(bound {bound[tuple(bad[0])].item():.3g})"
    )


def check_row_grouped(name, fa, out_dtype, split, device="cpu", u_acc=U):
    counts, r, c = SHAPES[name]
    g, ends = len(counts), _ends(counts)
    m = int(sum(counts))
    a = _codes((m, r), fa, 1)
    b = _codes((g, r, c), E4M3, 2).transpose(1, 2)  # [G, C, R], R not contiguous
    a_inv, b_inv = _scale_invs(g, 3), _scale_invs(g, 4)
    got = gf.row_grouped_mm(
        (a.to(device), fa, a_inv.to(device)),
        (b.to(device), E4M3, b_inv.to(device)),
        ends.to(device),
        out_dtype,
        split_accumulator=split,
    )
    assert got.dtype == out_dtype and got.device.type == device
    group = torch.repeat_interleave(torch.arange(g), torch.tensor(counts))
    av, bv = _values(a, fa), _values(b.contiguous(), E4M3)
    exact = torch.einsum("mr,mcr->mc", av, bv[group])
    magnitude = torch.einsum("mr,mcr->mc", av.abs(), bv[group].abs())
    s = (a_inv.double() * b_inv.double())[group][:, None]
    _check(got, exact * s, magnitude, s, r, out_dtype, u_acc, f"row_grouped {name} {fa}")


def check_group_reduced(name, fa, out_dtype, split, device="cpu", u_acc=U):
    counts, p, c = SHAPES[name]
    g, ends = len(counts), _ends(counts)
    m = int(sum(counts))
    a = _codes((p, m), fa, 5).t()  # [M, P] with its rows contiguous: the layout the op passes
    b = _codes((m, c), E4M3, 6)  # [M, C] row-major
    a_inv, b_inv = _scale_invs(g, 7), _scale_invs(g, 8)
    got = gf.group_reduced_mm(
        (a.to(device), fa, a_inv.to(device)),
        (b.to(device), E4M3, b_inv.to(device)),
        ends.to(device),
        out_dtype,
        split_accumulator=split,
    )
    assert got.dtype == out_dtype and got.shape == (g, p, c)
    av, bv = _values(a.contiguous(), fa), _values(b, E4M3)
    exact, magnitude, s = [], [], []
    start = 0
    for i, n in enumerate(counts):
        ag, bg = av[start : start + n], bv[start : start + n]
        exact.append(ag.t() @ bg)
        magnitude.append(ag.abs().t() @ bg.abs())
        s.append(float(a_inv[i].double() * b_inv[i].double()))
        start += n
    s_t = torch.tensor(s, dtype=torch.float64)[:, None, None]
    r = max(counts)
    _check(
        got,
        torch.stack(exact) * s_t,
        torch.stack(magnitude),
        s_t,
        r,
        out_dtype,
        u_acc,
        f"group_reduced {name} {fa}",
    )


@contextlib.contextmanager
def _tiles(tiles):
    saved = gf.ROW_TILE, gf.REDUCED_TILE
    gf.ROW_TILE = gf.REDUCED_TILE = tiles
    try:
        yield
    finally:
        gf.ROW_TILE, gf.REDUCED_TILE = saved


def run_cases(device="cpu", fast=False) -> list[str]:
    """Every shape through both kernels, both formats of ``a``, bf16 and fp32 out, at
    the shipped tiles; the ragged shapes again at small tiles (bf16 out). The failures."""
    failures = []
    runs = [(None, name, out) for name in SHAPES for out in (torch.bfloat16, torch.float32)]
    runs += [(SMALL_TILES, name, torch.bfloat16) for name in ("ragged", "empty_then_one")]
    for tiles, name, out in runs:
        with _tiles(tiles) if tiles else contextlib.nullcontext():
            if device == "cpu":
                u = U  # the interpreter sums in fp32
            else:
                u = FAST_U if fast else (FAST_U, gf.ROW_TILE[2])
            for fa in (E5M2, E4M3):
                for check in (check_row_grouped, check_group_reduced):
                    try:
                        check(name, fa, out, not fast, device, u)
                    except AssertionError as exc:
                        failures.append(f"tiles={tiles}: {exc}")
    return failures


@needs_triton
@pytest.mark.slow
def test_interpreted_kernels_are_within_the_derived_bound():
    out = assert_interpreted(__file__, "failures = t.run_cases()")
    assert out.strip() == ""


def test_the_bound_catches_a_row_in_the_wrong_group():
    """The bound is tight enough to fail a kernel that scales a row with its
    neighbour group's scale (checked on the float64 reference itself)."""
    counts, r, c = SHAPES["ragged"]
    g = len(counts)
    m = sum(counts)
    a, b = _codes((m, r), E5M2, 1), _codes((g, c, r), E4M3, 2)
    a_inv, b_inv = _scale_invs(g, 3), _scale_invs(g, 4)
    group = torch.repeat_interleave(torch.arange(g), torch.tensor(counts))
    av, bv = _values(a, E5M2), _values(b, E4M3)
    exact = torch.einsum("mr,mcr->mc", av, bv[group])
    magnitude = torch.einsum("mr,mcr->mc", av.abs(), bv[group].abs())
    s = (a_inv.double() * b_inv.double())[group][:, None]
    wrong = s.clone()
    wrong[10] = s[90]  # a row of group 1 scaled as group 3
    with pytest.raises(AssertionError, match="beyond the bound"):
        _check(exact * wrong, exact * s, magnitude, s, r, torch.float32, U, "mutant")
    _check((exact * s).float(), exact * s, magnitude, s, r, torch.float32, U, "itself")


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    codes = torch.zeros(2, 2, dtype=torch.uint8)
    inv = torch.ones(1)
    ends = torch.tensor([2], dtype=torch.int32)
    with pytest.raises(ValueError, match="row_grouped_mm: runs on CUDA tensors"):
        gf.row_grouped_mm(
            (codes, E4M3, inv),
            (codes[None], E4M3, inv),
            ends,
            torch.float32,
            split_accumulator=True,
        )
    assert not gf.eligible(codes)


@needs_triton
def test_bad_arguments_are_named(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    codes = torch.zeros(4, 8, dtype=torch.uint8)
    inv = torch.ones(2)
    ends = torch.tensor([1, 4], dtype=torch.int32)
    ok = (codes, E4M3, inv)
    with pytest.raises(ValueError, match=r"group row ends must be 1-D int32"):
        gf.group_reduced_mm(ok, ok, ends.long(), torch.float32, split_accumulator=True)
    with pytest.raises(ValueError, match=r"b's scale_inv must be fp32 of shape \(2,\)"):
        gf.group_reduced_mm(
            ok, (codes, E4M3, torch.ones(3)), ends, torch.float32, split_accumulator=True
        )
    with pytest.raises(TypeError, match=r"a: not an FP8 dtype"):
        gf.group_reduced_mm(
            (codes, torch.bfloat16, inv), ok, ends, torch.float32, split_accumulator=True
        )
    with pytest.raises(ValueError, match=r"b must be \[2, C, 8\]"):
        gf.row_grouped_mm(ok, (codes[None], E4M3, inv), ends, torch.float32, split_accumulator=True)
    with pytest.raises(TypeError, match="writes bf16 or fp32"):
        gf.group_reduced_mm(ok, ok, ends, torch.float16, split_accumulator=True)


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("fast", [False, True], ids=["split_accumulator", "fast_accumulation"])
def test_cuda_kernels_are_within_the_derived_bound(fast):
    failures = run_cases("cuda", fast=fast)
    assert not failures, "\n".join(failures[:10])


def test_sizes_of_the_grid_cover_every_tile():
    """The row-grouped grid (M / BM + G row tiles) covers every group's tiles, however
    the rows fall: sum ceil(m_g / BM) <= M / BM + G."""
    bm = gf.ROW_TILE[0]
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        g = int(torch.randint(1, 40, (1,), generator=gen))
        counts = torch.randint(0, 3 * bm, (g,), generator=gen)
        m = int(counts.sum())
        tiles = int(((counts + bm - 1) // bm).sum())
        assert tiles <= math.ceil(m / bm) + g
