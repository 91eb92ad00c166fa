"""Triton NVFP4 quantize kernels: bit for bit equal to the reference quantizer.

Interpreter tests run the kernels on CPU tensors under ``TRITON_INTERPRET=1`` in a
child process (skipped when triton is not importable); ``gpu`` tests run the compiled
kernels on CUDA, directly and through ``NVFP4Quantizer.quantize``, against the CPU
reference. Every configuration TE 2.20.2 ships: 1x16 and 16x16 blocks, the random
Hadamard transform (amax before or after it), stochastic rounding, row-scaled data,
4over6 (MAE and MSE, bound 448 and 256).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from tests.triton_interpreter import assert_interpreted
from transformer_engine_ops.kernels import nvfp4_kernels as nk
from transformer_engine_ops.quantization import NVFP4Quantizer

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _wide(shape, seed, dtype=torch.float32, binades=8):
    """Gaussian values spread over ``2 * binades`` binades."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-binades, binades, shape, generator=g).float())
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def _non_finite(shape, seed):
    """NaN, -NaN, +-Inf and -0 planted in a few blocks, the rest finite."""
    x = _wide(shape, seed)
    flat = x.view(-1)
    for i, v in enumerate((float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0)):
        flat[(i * 977) % flat.numel()] = v
    return x


def _all_bf16():
    """Every bf16 bit pattern once (NaNs, Infs, subnormals, both zeros)."""
    return (
        torch.arange(-(2**15), 2**15, dtype=torch.int32)
        .to(torch.int16)
        .view(torch.bfloat16)
        .reshape(256, 256)
    )


def _outlier(shape, seed):
    """One large element per row: the case 4over6 and the transform are made for."""
    x = _wide(shape, seed, binades=2)
    x[:, 5] *= 300.0
    return x


INPUTS = {
    # Neither dim a multiple of 16: partial blocks at both edges.
    "ragged_bf16": lambda: _wide((34, 70), 0, torch.bfloat16),
    "aligned_3d": lambda: _wide((2, 16, 48), 1),
    "fp16_wide": lambda: _wide((32, 144), 2, torch.float16, binades=12),
    "one_row": lambda: _wide((1, 48), 3, torch.bfloat16),
    "non_finite": lambda: _non_finite((32, 48), 4),
    "outliers": lambda: _outlier((48, 64), 5),
    "zeros": lambda: torch.zeros(16, 32, dtype=torch.bfloat16),
    # The amax a subnormal: 2688 / amax overflows, the global scale is FP32_MAX.
    "subnormal_amax": lambda: torch.full((16, 32), 1e-40),
    "every_bf16": _all_bf16,
}

CONFIGS = {
    "plain": dict(),
    "2d": dict(with_2d_quantization=True),
    "rht": dict(with_rht=True, with_post_rht_amax=True),
    "rht_amax_before": dict(with_rht=True),
    "stochastic": dict(stochastic_rounding=True),
    "stochastic_rht": dict(stochastic_rounding=True, with_rht=True, with_post_rht_amax=True),
    "row_scaled": dict(row_scaled_nvfp4=True),
    "4over6": dict(nvfp4_use_4over6=True),
    "4over6_mse_256": dict(nvfp4_use_4over6=True, nvfp4_4over6_err_mode="MSE", nvfp4_e4m3_max=256),
    "4over6_2d": dict(nvfp4_use_4over6=True, with_2d_quantization=True),
    "4over6_row_scaled": dict(nvfp4_use_4over6=True, row_scaled_nvfp4=True),
}
USAGES = {"both": (True, True), "rowwise": (True, False), "columnwise": (False, True)}
# The interpreter is slow: every bf16 pattern with four configs only.
_EVERY_BF16_CONFIGS = ("plain", "rht", "stochastic", "4over6_2d")


def _quantizer(config, usage):
    row, col = USAGES[usage]
    return NVFP4Quantizer(**CONFIGS[config], rowwise_usage=row, columnwise_usage=col)


def _accepts(config, usage, shape):
    try:
        _quantizer(config, usage).check_shape(shape)
    except ValueError:
        return False
    return True


def _cases():
    cases = []
    for name, make in INPUTS.items():
        shape = tuple(make().shape)
        configs = _EVERY_BF16_CONFIGS if name == "every_bf16" else CONFIGS
        for config in configs:
            for usage in USAGES:
                if usage != "both" and name not in ("ragged_bf16", "aligned_3d", "one_row"):
                    continue
                if _accepts(config, usage, shape):
                    cases.append((name, config, usage))
    return cases


CASES = _cases()


def _rng_state(q, seed=0):
    if not q.stochastic_rounding:
        return None
    return torch.tensor([0x1234_5678_9ABC + seed, 0x77 + seed], dtype=torch.int64)


def assert_bitwise(ref, got):
    """Same buffers, shapes, dtypes and bits (fp32 compared as int32, NaNs included)."""
    assert set(ref) == set(got), (set(ref), set(got))
    for name, r in ref.items():
        g = got[name].cpu()
        assert g.shape == r.shape and g.dtype == r.dtype, (name, g.shape, r.shape)
        if r.dtype == torch.float32:
            r, g = r.view(torch.int32), g.view(torch.int32)
        bad = (r != g).nonzero()
        assert bad.numel() == 0, f"{name}: {bad.shape[0]} differ, first at {bad[:3].tolist()}"


def run_interpreter_cases() -> list[str]:
    """Every case through the interpreted kernels; the failures (run in a child)."""
    failures = []
    for name, config, usage in CASES:
        q = _quantizer(config, usage)
        x = INPUTS[name]()
        rng = _rng_state(q)
        try:
            assert_bitwise(q._quantize_reference(x, rng), nk.quantize(q, x, rng))
        except AssertionError as exc:
            failures.append(f"{name}/{config}/{usage}: {exc}")
    return failures


# Given amaxes (a sharded tensor's reduced ones, ``quantize_with_stats``): larger than
# the shard's own, as the whole tensor's are; every per-tensor configuration.
STATS_CONFIGS = ("plain", "2d", "rht", "rht_amax_before", "4over6", "4over6_mse_256")
STATS_CASES = [
    (name, config, usage)
    for name in ("aligned_3d", "non_finite", "outliers", "zeros")
    for config in STATS_CONFIGS
    for usage in USAGES
    if _accepts(config, usage, tuple(INPUTS[name]().shape))
]


def _given_amaxes(q, x):
    stats = q.amax_stats(x) * torch.tensor([3.0, 5.0]) + 1.0  # never the shard's own
    return stats[0:1].clone(), stats[1:2].clone()


def run_interpreter_stats_cases() -> list[str]:
    """Every given-amax case through the interpreted kernels; the failures."""
    failures = []
    for name, config, usage in STATS_CASES:
        q = _quantizer(config, usage)
        x = INPUTS[name]()
        amaxes = _given_amaxes(q, x)
        try:
            assert_bitwise(q._quantize_reference(x, None, amaxes), nk.quantize(q, x, None, amaxes))
            assert_bitwise({"stats": q.amax_stats(x)}, {"stats": nk.amax_stats(q, x)})
        except AssertionError as exc:
            failures.append(f"{name}/{config}/{usage} (given amaxes): {exc}")
    return failures


def test_the_cases_cover_every_configuration_and_usage():
    assert {c for _, c, _ in CASES} == set(CONFIGS)
    assert {u for _, _, u in CASES} == set(USAGES)
    assert len(CASES) > 100
    assert {c for _, c, _ in STATS_CASES} == set(STATS_CONFIGS)
    assert {u for _, _, u in STATS_CASES} == set(USAGES)


@needs_triton
@pytest.mark.slow
def test_interpreted_kernels_match_the_reference_bit_for_bit():
    """In a fresh interpreter (Triton's interpreter and an earlier torch.compile in
    this process do not mix; see test_cuda_kernels)."""
    checks = "failures = t.run_interpreter_cases() + t.run_interpreter_stats_cases()"
    out = assert_interpreted(__file__, checks, "len(t.CASES)")
    assert out.endswith(f"{len(CASES)} cases\n")


def _ptx_for_h200(kernel, signature, constexprs):
    """The kernel compiled as a launch would compile it, for sm_90 (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = dict(constexprs)
    options = {"num_warps": nk.WARPS, "enable_fp_fusion": constexprs.pop("enable_fp_fusion")}
    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


@needs_triton
@pytest.mark.slow
def test_every_launched_configuration_compiles_for_the_h200_with_exact_arithmetic():
    """What the interpreter cannot check: each kernel configuration a quantize launches
    compiles for sm_90, with no fused multiply-add (the transform's products and sums
    round separately, as in the reference), no approximate division and no flushing
    of subnormals."""
    from transformer_engine_ops.kernels import _nvfp4_triton as kernels

    quantize_sig = {
        "x_ptr": "*bf16",
        "amax_ptr": "*fp32",
        "data_ptr": "*u8",
        "scale_ptr": "*u8",
        **{n: "i32" for n in ("R", "C", "stride_r", "stride_c", "amax_stride", "scale_cols")},
        "global_fmax": "fp32",
        "err_denominator": "fp32",
    }
    launched = set()
    for config in CONFIGS:
        q = _quantizer(config, "both")
        for stream in (0, 1):
            launched.add(
                (
                    stream,
                    stream == 1 and q.with_rht,
                    q.stochastic_rounding,
                    q.with_2d_quantization,
                    q.nvfp4_use_4over6,
                    q.nvfp4_4over6_err_mode == "MSE",
                    q.with_random_sign_mask,
                )
            )
    ptxs = []
    for key in sorted(launched):
        seed = {"seed_ptr": "*i64" if key[2] else "*fp32"}
        signature = (
            dict(list(quantize_sig.items())[:2]) | seed | dict(list(quantize_sig.items())[2:])
        )
        ptxs.append(_ptx_for_h200(kernels._quantize, signature, nk._quantize_constexprs(*key)))
    amax_sig = {"x_ptr": "*bf16", "amax_ptr": "*fp32"}
    amax_sig |= {n: "i32" for n in ("R", "C", "stride_r", "stride_c")}
    for rht, signs in ((False, False), (True, False), (True, True)):
        constexprs = nk._amax_constexprs(rht, signs)
        ptxs.append(_ptx_for_h200(kernels._row_amax, amax_sig, constexprs))
    for ptx in ptxs:
        assert "fma.rn.f32" not in ptx
        assert "div.approx" not in ptx and "div.full" not in ptx
        assert ".ftz" not in ptx  # subnormals kept, as the reference keeps them


def test_the_reference_divides_by_tensors_so_cuda_rounds_as_the_cpu():
    """``block_amax / 6`` must be correctly rounded on every device (CUDA multiplies by
    the reciprocal for a Python-scalar divisor): values where the two differ quantize
    to the scale code of the correctly rounded quotient."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(4096, generator=g) * 6 + 1
    reciprocal = a * (1 / 6.0)
    differ = reciprocal != a / torch.full_like(a, 6.0)
    assert differ.any()  # the two roundings really differ on these values
    from transformer_engine_ops.quantization.nvfp4 import _over_e2m1_max

    assert torch.equal(_over_e2m1_max(a), a / torch.full_like(a, 6.0))


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        nk.quantize(NVFP4Quantizer(), torch.ones(2, 16), None)


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match=r"NVFP4Quantizer \(Triton\): cannot quantize dtype"):
        nk.quantize(NVFP4Quantizer(), torch.ones(2, 16, dtype=torch.float64), None)
    with pytest.raises(ValueError, match=r"nothing to quantize in shape \(0, 16\)"):
        nk.quantize(NVFP4Quantizer(), torch.ones(0, 16), None)
    with pytest.raises(ValueError, match="rng_state must be given exactly when"):
        nk.quantize(NVFP4Quantizer(stochastic_rounding=True), torch.ones(2, 16), None)
    with pytest.raises(ValueError, match="amaxes are per tensor"):
        amaxes = (torch.ones(1), torch.ones(1))
        nk.quantize(NVFP4Quantizer(row_scaled_nvfp4=True), torch.ones(2, 16), None, amaxes)
    with pytest.raises(TypeError, match=r"amax_stats \(Triton\): cannot quantize dtype"):
        nk.amax_stats(NVFP4Quantizer(), torch.ones(2, 16, dtype=torch.float64))


def test_cpu_and_empty_and_traced_tensors_never_take_the_kernels():
    assert not nk.eligible(torch.ones(2, 16))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not nk.eligible(torch.empty(2, 16, device="cuda"))


def test_module_imports_and_reports_why_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "from transformer_engine_ops.kernels import nvfp4_kernels as k\n"
        "from transformer_engine_ops.quantization import NVFP4Quantizer as Q\n"
        "assert not k.available(), 'available without triton'\n"
        "print(k.unavailable_reason())\n"
        "import torch; Q().quantize(torch.ones(4, 16))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "triton is not importable" in out.stdout


# --- on the GPU ---------------------------------------------------------------------

# Shapes for the CUDA comparison: not multiples of 16, one row, large, 3-D.
# Large ones with both usages only (the CPU reference of each takes seconds).
SMALL_SHAPES = [(34, 70), (1, 48), (2, 16, 48), (18, 34)]
LARGE_SHAPES = [(2048, 4096), (1030, 2054), (16, 8192)]
GPU_CASES = [
    (shape, config, usage)
    for shape in SMALL_SHAPES + LARGE_SHAPES
    for config in CONFIGS
    for usage in (USAGES if shape in SMALL_SHAPES else ("both",))
    if _accepts(config, usage, shape)
]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("name", "config", "usage"), CASES)
def test_cuda_kernels_match_the_cpu_reference_on_every_case(name, config, usage):
    q = _quantizer(config, usage)
    x = INPUTS[name]()
    rng = _rng_state(q)
    got = nk.quantize(q, x.cuda(), None if rng is None else rng.cuda())
    assert_bitwise(q._quantize_reference(x, rng), got)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("shape", "config", "usage"), GPU_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_quantize_takes_the_kernels_and_matches_the_cpu(
    shape, config, usage, dtype, monkeypatch
):
    """Through ``NVFP4Quantizer.quantize`` on CUDA (the hook), every shape."""
    calls = []
    real = nk.quantize
    monkeypatch.setattr(nk, "quantize", lambda *a: calls.append(1) or real(*a))
    q = _quantizer(config, usage)
    x = _outlier(shape, 11).to(dtype) if len(shape) == 2 else _wide(shape, 11, dtype)
    rng = _rng_state(q, seed=len(shape))
    if rng is None:
        got, ref = q.quantize(x.cuda()), q.quantize(x)
    else:
        got, ref = q.quantize_stochastic(x.cuda(), rng.cuda()), q.quantize_stochastic(x, rng)
    assert calls, "the CUDA quantize did not use the Triton kernels"
    names = [n for n in type(ref).INNER_NAMES if getattr(ref, n) is not None]
    assert_bitwise({n: getattr(ref, n) for n in names}, {n: getattr(got, n) for n in names})
    # and the reference ops on CUDA give the same bits (their divisions are by tensors)
    on_cuda = q._quantize_reference(x.cuda(), None if rng is None else rng.cuda())
    assert_bitwise({n: getattr(ref, n) for n in names}, on_cuda)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("config", ["plain", "rht", "row_scaled"])
def test_cuda_zero_rows_take_the_reference_and_match_the_cpu(config):
    q = _quantizer(config, "rowwise")
    x = torch.zeros(0, 64, dtype=torch.bfloat16)
    assert not nk.eligible(x.cuda())
    ref, got = q.quantize(x), q.quantize(x.cuda())
    for name in ("_rowwise_data", "_rowwise_scale_inv", "_amax_rowwise"):
        assert torch.equal(getattr(ref, name), getattr(got, name).cpu()), name


@pytest.mark.gpu
@needs_cuda
def test_cuda_stochastic_rounding_reads_the_pair_on_the_device():
    """The (seed, offset) pair is read by the kernel (no host copy): another pair gives
    other bits, the same pair the same bits."""
    q = _quantizer("stochastic", "both")
    x = _wide((64, 128), 12, torch.bfloat16).cuda()
    a = q.quantize_stochastic(x, torch.tensor([5, 9], device="cuda"))
    b = q.quantize_stochastic(x, torch.tensor([5, 9], device="cuda"))
    c = q.quantize_stochastic(x, torch.tensor([5, 10], device="cuda"))
    assert torch.equal(a._rowwise_data, b._rowwise_data)
    assert not torch.equal(a._rowwise_data, c._rowwise_data)
    assert not torch.equal(a._columnwise_data, c._columnwise_data)


@pytest.mark.gpu
@needs_cuda
def test_cuda_quantize_is_captured_and_replayed_in_a_cuda_graph():
    """No host copy and no synchronization: the quantize can be captured (what
    ``mode="reduce-overhead"`` does) and a replay writes the same bits."""
    q = _quantizer("stochastic_rht", "both")
    x = _wide((64, 128), 13, torch.bfloat16).cuda()
    rng = torch.tensor([3, 4], device="cuda")
    eager = q.quantize_stochastic(x, rng)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        q.quantize_stochastic(x, rng)  # warm-up: kernels compiled outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = q.quantize_stochastic(x, rng)
    graph.replay()
    torch.cuda.synchronize()
    for name in ("_rowwise_data", "_columnwise_data", "_columnwise_scale_inv"):
        assert torch.equal(getattr(eager, name), getattr(captured, name)), name


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("name", "config", "usage"), STATS_CASES)
def test_cuda_kernels_with_given_amaxes_match_the_cpu_reference(name, config, usage):
    """A shard quantized with the TP group's reduced amaxes (``quantize_with_stats``)."""
    q = _quantizer(config, usage)
    x = INPUTS[name]()
    amaxes = _given_amaxes(q, x)
    got = nk.quantize(q, x.cuda(), None, tuple(a.cuda() for a in amaxes))
    assert_bitwise(q._quantize_reference(x, None, amaxes), got)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("config", ["plain", "rht", "rht_amax_before"])
def test_cuda_amax_stats_take_the_kernels_and_match_the_cpu(config, monkeypatch):
    calls = []
    real = nk.amax_stats
    monkeypatch.setattr(nk, "amax_stats", lambda *a: calls.append(1) or real(*a))
    q = _quantizer(config, "both")
    x = _outlier((48, 64), 14).to(torch.bfloat16)
    got = q.amax_stats(x.cuda())
    assert calls, "the CUDA amax_stats did not use the Triton kernels"
    assert_bitwise({"stats": q.amax_stats(x)}, {"stats": got})
