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
child process (skipped when triton is not importable), alone and through the grouped
GEMM's backward; ``gpu`` tests run them compiled on CUDA.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math

import pytest
import torch

from tests.triton_interpreter import assert_interpreted
from transformer_engine_ops.kernels import grouped_fp8_gemm as gf
from transformer_engine_ops.ops import grouped_gemm as gg
from transformer_engine_ops.quantization import Float8CurrentScalingQuantizer
from transformer_engine_ops.runtime.values import GemmConfig

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
needs_fp8_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a CUDA GPU with FP8 tensor cores",
)
U = 2.0**-24  # fp32's unit roundoff
BF16_U = 2.0**-8
# Hopper's FP8 MMA without promotion (split_accumulator=False) keeps fewer bits of
# its running sum than fp32; the bound then assumes 13 (a unit roundoff of 2**-13).
FAST_U = 2.0**-13


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
    """``got`` within the derived bound of ``exact``: accumulation (``u_acc`` per add
    over ``r`` terms of ``magnitude = sum|a b|``), the scale multiply, the output rounding."""
    got = got.double().cpu()
    assert got.shape == exact.shape, (what, got.shape, exact.shape)
    gamma = r * u_acc / (1 - r * u_acc) if r else 0.0
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


def _backward_args(fp8_grad, split, seed=0):
    """A grouped-GEMM backward bundle of FP8 codes as the forward saves them, and the
    output gradient."""
    counts = [9, 0, 40, 3]
    g, n, k = len(counts), 48, 80
    m = sum(counts)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(g, n, k, generator=gen).to(torch.bfloat16)
    dy = torch.randn(m, n, generator=gen).to(torch.bfloat16)
    splits = torch.tensor(counts)
    group = gg._groups(torch.cumsum(splits, 0).to(torch.int32), m)
    q = Float8CurrentScalingQuantizer(E4M3)
    x_codes, x_inv = gg._quantize_groups(x, group, g, q)
    w_codes, w_inv = gg._quantize_weights(w, q)
    args = gg.GroupedGemmBwdArgs(
        grad_outputs=[dy],
        inp=x,
        weight=w,
        m_splits=splits,
        input_codes=x_codes,
        input_scale_inv=x_inv,
        weight_codes=w_codes,
        weight_scale_inv=w_inv,
        grad_output_quantizer=Float8CurrentScalingQuantizer(fp8_grad),
        activation_dtype=torch.bfloat16,
        dgrad_gemm=GemmConfig(use_split_accumulator=split),
        wgrad_gemm=GemmConfig(use_split_accumulator=split),
        requires_dgrad=True,
        requires_wgrad=True,
        requires_bgrad=False,
        has_bias=False,
    )
    return args, group


def check_backward(fp8_grad, split):
    """The grouped GEMM's backward with the kernels (dgrad and wgrad of the codes)
    against the exact sums of the same codes, and against its path without them."""
    args, group = _backward_args(fp8_grad, split)
    dy = args.grad_outputs[0]
    g = args.weight.shape[0]
    dy_codes, dy_inv = gg._quantize_groups(dy, group, g, args.grad_output_quantizer)
    real = gf.eligible
    gf.eligible = lambda x: x.numel() > 0
    try:
        dgrad, wgrad, _ = gg.grouped_gemm_backward(args)
    finally:
        gf.eligible = real
    dyv = _values(dy_codes, fp8_grad)
    xv = _values(args.input_codes, E4M3)
    wv = _values(args.weight_codes, E4M3)
    dy_s, x_s, w_s = (v.double() for v in (dy_inv, args.input_scale_inv, args.weight_scale_inv))
    n = dy.shape[1]
    exact_d = torch.einsum("mn,mnk->mk", dyv, wv[group]) * (dy_s * w_s)[group][:, None]
    mag_d = torch.einsum("mn,mnk->mk", dyv.abs(), wv[group].abs())
    s_d = (dy_s * w_s)[group][:, None]
    _check(dgrad, exact_d, mag_d, s_d, n, torch.bfloat16, U, f"backward dgrad {fp8_grad}")
    splits = args.m_splits.tolist()
    starts = [sum(splits[:i]) for i in range(g)]
    exact_w = torch.stack(
        [dyv[s : s + c].t() @ xv[s : s + c] for s, c in zip(starts, splits, strict=True)]
    )
    mag_w = torch.stack(
        [
            dyv[s : s + c].abs().t() @ xv[s : s + c].abs()
            for s, c in zip(starts, splits, strict=True)
        ]
    )
    s_w = (dy_s * x_s)[:, None, None]
    _check(wgrad, exact_w * s_w, mag_w, s_w, max(splits), torch.bfloat16, U, "backward wgrad")
    # Without the kernels (bf16 GEMMs of the dequantized codes on CUDA, fp32 here): the
    # same sums to within both paths' roundings.
    ref_d, ref_w, _ = gg.grouped_gemm_backward(args)
    assert (dgrad.double() - ref_d.double()).abs().max() <= 2 * BF16_U * exact_d.abs().max() + 1e-30
    assert (wgrad.double() - ref_w.double()).abs().max() <= 2 * BF16_U * exact_w.abs().max() + 1e-30


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
    u = FAST_U if fast else U
    runs = [(None, name, out) for name in SHAPES for out in (torch.bfloat16, torch.float32)]
    runs += [(SMALL_TILES, name, torch.bfloat16) for name in ("ragged", "empty_then_one")]
    for tiles, name, out in runs:
        with _tiles(tiles) if tiles else contextlib.nullcontext():
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


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("fp8_grad", ["E5M2", "E4M3"])
def test_interpreted_backward_takes_the_kernels(fp8_grad):
    assert_interpreted(
        __file__,
        f"failures = []\nt.check_backward(t.{fp8_grad}, True)\nt.check_backward(t.{fp8_grad}, False)",
    )


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


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("fp8_grad", [E5M2, E4M3], ids=["E5M2", "E4M3"])
def test_cuda_backward_takes_the_kernels(fp8_grad, monkeypatch):
    """On CUDA the grouped GEMM's backward runs the kernels on its own (E5M2: dgrad and
    wgrad; E4M3: the wgrad, the dgrad on torch's FP8 grouped GEMM)."""
    args, _ = _backward_args(fp8_grad, True)
    calls = []
    for name in ("row_grouped_mm", "group_reduced_mm"):
        real = getattr(gf, name)

        def spy(*a, _real=real, _name=name, **kw):
            calls.append(_name)
            return _real(*a, **kw)

        monkeypatch.setattr(gf, name, spy)
    moved = gg.GroupedGemmBwdArgs(
        **{
            name: value.cuda() if isinstance(value, torch.Tensor) else value
            for name, value in vars(args).items()
        }
    )
    moved.grad_outputs = [args.grad_outputs[0].cuda()]
    dgrad, wgrad, _ = gg.grouped_gemm_backward(moved)
    want = ["row_grouped_mm", "group_reduced_mm"] if fp8_grad == E5M2 else ["group_reduced_mm"]
    assert calls == want
    ref_d, ref_w, _ = gg.grouped_gemm_backward(args)  # the CPU: fp32 GEMMs of the codes
    for got, ref in ((dgrad, ref_d), (wgrad, ref_w)):
        scale = ref.double().abs().max()
        assert (got.cpu().double() - ref.double()).abs().max() <= 2 * BF16_U * scale


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
