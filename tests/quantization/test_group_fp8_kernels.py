"""FP8 current scaling per group of rows (the grouped GEMM's quantize): the Triton
kernels bit for bit equal to the torch ops they replace.

Interpreter tests run the kernels on CPU tensors under ``TRITON_INTERPRET=1`` in a
child process (skipped when triton is not importable), both alone and through the
grouped GEMM's quantize helpers; ``gpu`` tests run the compiled kernels on CUDA against
the CPU's torch ops.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from test_cuda_kernels import _all_bf16, _wide

from tests.triton_interpreter import assert_interpreted
from transformer_engine_ops.kernels import group_fp8_kernels as gk
from transformer_engine_ops.ops import grouped_gemm as gg
from transformer_engine_ops.quantization import Float8CurrentScalingQuantizer
from transformer_engine_ops.quantization.encoding import cast_to_fp8, finite_abs

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _subnormal_rows():
    """Rows whose amax is subnormal (the scale saturates to FP32_MAX) beside normal ones."""
    x = torch.randn(9, 40)
    x[2:5] = 1e-40
    x[3, 7] = -3e-41
    return x


INPUTS = {
    # Rows and columns off the tiles (8 x 256 amax, 32 x 128 cast), NaN/Inf planted.
    "wide_bf16": lambda: _wide((70, 300), 0, torch.bfloat16),
    "wide_fp32": lambda: _wide((33, 130), 1),
    "wide_fp16": lambda: _wide((65, 64), 2, torch.float16),
    "every_bf16": _all_bf16,
    "one_row": lambda: _wide((1, 513), 3, torch.bfloat16),
    "one_column": lambda: _wide((37, 1), 4, torch.bfloat16),
    "zeros": lambda: torch.zeros(5, 17, dtype=torch.bfloat16),
    "no_rows": lambda: torch.zeros(0, 17, dtype=torch.bfloat16),
    "nan_and_inf_rows": lambda: torch.tensor(
        [[float("nan"), 1.0, -2.0], [float("inf"), 0.5, 0.0], [-float("inf"), float("nan"), 3.0]]
    ),
    "subnormal_rows": _subnormal_rows,
}
# Groups of rows: the row counts of each input's groups (empty groups included).
GROUPS = (1, 3, 7)


def _reference_row_stats(x):
    x32 = x.float()
    return finite_abs(x32).amax(dim=1), torch.isinf(x32).any(dim=1)


def _row_scales(x, fp8_dtype):
    """One scale per row: a quantizer's scale of each row's amax, with saturating
    (FP32_MAX), unit and power-of-two scales among them."""
    q = Float8CurrentScalingQuantizer(fp8_dtype)
    scale = q._scale_of_amax(_reference_row_stats(x)[0])
    scale[::5] = 1.0
    scale[1::7] = 2.0**-20
    return scale.contiguous()


def _group_of_rows(rows, groups, seed):
    counts = torch.zeros(groups, dtype=torch.int64)
    if rows:
        cuts = torch.randint(
            0, rows + 1, (groups - 1,), generator=torch.Generator().manual_seed(seed)
        )
        edges = torch.cat([torch.tensor([0]), cuts.sort().values, torch.tensor([rows])])
        counts = edges.diff()
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    return gg._groups(offsets, rows)


def _same_bits(ref, got, what):
    got = got.cpu()
    assert got.shape == ref.shape and got.dtype == ref.dtype, (what, got.shape, ref.shape)
    if ref.dtype == torch.float32:
        ref, got = ref.view(torch.int32), got.view(torch.int32)
    bad = (ref != got).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} differ, first at {bad[:3].tolist()}"


def check_input(name, x, fused):
    """Every check of one input: the kernels alone, then the grouped GEMM's helpers
    with (``fused``) against without the kernels."""
    amax, inf = gk.row_amax(x)
    ref_amax, ref_inf = _reference_row_stats(x)
    _same_bits(ref_amax, amax, f"{name} amax")
    _same_bits(ref_inf, inf, f"{name} has_inf")
    for fp8 in (E4M3, E5M2):
        scale = _row_scales(x, fp8)
        ref = cast_to_fp8(x.float() * scale[:, None], fp8)
        _same_bits(ref, gk.cast_rows(x, scale, fp8), f"{name} codes {fp8}")
        q = Float8CurrentScalingQuantizer(fp8)
        for groups in GROUPS:
            group = _group_of_rows(x.shape[0], groups, groups)
            with fused(False):
                ref_codes, ref_inv = gg._quantize_groups(x, group, groups, q)
            with fused(True):
                codes, inv = gg._quantize_groups(x, group, groups, q)
            _same_bits(ref_codes, codes, f"{name} groups={groups} {fp8} codes")
            _same_bits(ref_inv, inv, f"{name} groups={groups} {fp8} scale_inv")
        if x.shape[0] and x.shape[0] % 3 == 0:  # as a stack of 3 weights
            w = x.reshape(3, x.shape[0] // 3, x.shape[1])
            with fused(False):
                ref_codes, ref_inv = gg._quantize_weights(w, q)
            with fused(True):
                codes, inv = gg._quantize_weights(w, q)
            _same_bits(ref_codes, codes, f"{name} weights {fp8} codes")
            _same_bits(ref_inv, inv, f"{name} weights {fp8} scale_inv")


# Scale inverses of the dequantize checks: unit, powers of two, values whose products
# round in bf16, overflow it (to Inf) or fall into its subnormals.
INVERSES = (1.0, 2.0**-20, 3.0, 1.0 / 3.0, 1e-3, 2.0**100, 1e36, 2.0**-130, 7e-45)


def _same_values(ref, got, what):
    """Same dtype and shape, the same bits except NaNs: NaN where the reference has NaN
    (a NaN's sign and payload are not compared: the CPU's bf16 conversion makes every
    NaN 0xFFFF, CUDA's 0x7FFF)."""
    got = got.cpu()
    assert got.shape == ref.shape and got.dtype == ref.dtype, (what, got.shape, ref.shape)
    nan = ref.isnan()
    assert torch.equal(got.isnan(), nan), f"{what}: NaN positions differ"
    bits = torch.int16 if ref.dtype == torch.bfloat16 else torch.int32
    r, g = ref.view(bits)[~nan], got.view(bits)[~nan]
    bad = (r != g).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} differ, first at {bad[:3].tolist()}"


def _every_code():
    """``(codes, scale_inv)``: a row of every FP8 code for each scale inverse."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(1, 256)
    return codes.expand(len(INVERSES), 256).contiguous(), torch.tensor(INVERSES)


def check_dequantize(fused):
    """Every FP8 code of both formats times each scale inverse, to bf16 and fp32: the
    kernel alone and through the grouped GEMM's helper, against the torch ops."""
    codes, inv = _every_code()
    for fp8 in (E4M3, E5M2):
        ref32 = gg._dequantized(codes, fp8, inv)
        for work in (torch.bfloat16, torch.float32):
            ref = ref32.to(work)
            _same_values(ref, gk.dequantize_rows(codes, fp8, inv, work), f"{fp8} -> {work}")
            with fused(True):
                got = gg._dequantized_rows(codes, fp8, inv, work)
            _same_values(ref, got, f"grouped GEMM helper {fp8} -> {work}")


def run_interpreter_cases() -> list[str]:
    """Every input through the interpreted kernels; the failures (run in a child)."""
    import contextlib

    @contextlib.contextmanager
    def fused(on):
        eligible = gg.group_fp8_kernels.eligible
        gg.group_fp8_kernels.eligible = lambda x: on and x.numel() > 0
        try:
            yield
        finally:
            gg.group_fp8_kernels.eligible = eligible

    failures = []
    for name, make in INPUTS.items():
        try:
            check_input(name, make(), fused)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    try:
        check_dequantize(fused)
    except AssertionError as exc:
        failures.append(f"dequantize: {exc}")
    return failures


@needs_triton
@pytest.mark.slow
def test_interpreted_kernels_match_the_torch_ops_bit_for_bit():
    out = assert_interpreted(__file__, "failures = t.run_interpreter_cases()", "len(t.INPUTS)")
    assert out.endswith(f"{len(INPUTS)} cases\n")


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="row_amax: runs on CUDA tensors"):
        gk.row_amax(torch.ones(2, 2))
    with pytest.raises(ValueError, match="cast_rows: runs on CUDA tensors"):
        gk.cast_rows(torch.ones(2, 2), torch.ones(2), E4M3)


def test_the_grouped_gemm_keeps_the_torch_ops_off_cuda():
    """CPU and meta tensors never take the kernels."""
    assert not gk.eligible(torch.ones(4, 4))
    assert not gk.eligible(torch.ones(4, 4, device="meta"))


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_bad_arguments_are_named(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match=r"row_amax: needs a 2-D \[rows, K\] tensor, got \(4,\)"):
        gk.row_amax(torch.ones(4))
    with pytest.raises(TypeError, match="cannot quantize dtype torch.int32"):
        gk.row_amax(torch.ones(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"scale must be fp32 of shape \(2,\)"):
        gk.cast_rows(torch.ones(2, 2), torch.ones(3), E4M3)
    with pytest.raises(TypeError, match="not an FP8 dtype"):
        gk.cast_rows(torch.ones(2, 2), torch.ones(2), torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", sorted(INPUTS))
def test_cuda_kernels_match_the_cpu_torch_ops(name):
    """The compiled kernels on CUDA, alone and through the grouped GEMM's helpers,
    against the same torch ops on the CPU."""
    import contextlib

    x = INPUTS[name]()

    @contextlib.contextmanager
    def fused(on):
        # the reference: the torch ops on the CPU; the kernels: the same input on CUDA
        yield

    amax, inf = gk.row_amax(x.cuda())
    ref_amax, ref_inf = _reference_row_stats(x)
    _same_bits(ref_amax, amax, "amax")
    _same_bits(ref_inf, inf, "has_inf")
    for fp8 in (E4M3, E5M2):
        scale = _row_scales(x, fp8)
        ref = cast_to_fp8(x.float() * scale[:, None], fp8)
        _same_bits(ref, gk.cast_rows(x.cuda(), scale.cuda(), fp8), f"codes {fp8}")
        q = Float8CurrentScalingQuantizer(fp8)
        group = _group_of_rows(x.shape[0], 3, 3)
        ref_codes, ref_inv = gg._quantize_groups(x, group, 3, q)
        codes, inv = gg._quantize_groups(x.cuda(), group.cuda(), 3, q)
        _same_bits(ref_codes, codes, "grouped codes")
        _same_bits(ref_inv, inv, "grouped scale_inv")


@pytest.mark.gpu
@needs_cuda
def test_cuda_dequantize_matches_the_cpu_torch_ops():
    """Every FP8 code of both formats times each scale inverse, on CUDA, against the
    torch ops on the CPU (NaN positions, every other value's bits)."""
    codes, inv = _every_code()
    for fp8 in (E4M3, E5M2):
        ref32 = gg._dequantized(codes, fp8, inv)
        for work in (torch.bfloat16, torch.float32):
            got = gk.dequantize_rows(codes.cuda(), fp8, inv.cuda(), work)
            _same_values(ref32.to(work), got, f"{fp8} -> {work}")
