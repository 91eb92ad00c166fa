"""The fused FP8 block-scaling quantize kernel: bit for bit the reference quantizer.

Interpreter tests run the Triton kernel on CPU tensors under ``TRITON_INTERPRET=1`` in a
fresh process (skipped when triton is not importable); ``gpu`` tests run it compiled on
CUDA, through ``Float8BlockQuantizer.quantize`` and through compiled modules.
"""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys

import pytest
import torch

from tests.triton_interpreter import assert_interpreted
from transformer_engine_ops.kernels import block_kernels as bk
from transformer_engine_ops.quantization import Float8BlockQuantizer

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _wide(shape, seed, dtype=torch.float32):
    """Values spread over ~60 binades, with NaN, -NaN, +-Inf and -0 planted."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(
        torch.randint(-30, 30, shape, generator=g).float()
    )
    flat = x.view(-1)
    for i, v in enumerate((float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0)):
        if i < flat.numel():
            flat[(i * 7919) % flat.numel()] = v
    return x.to(dtype)


def _all_bf16():
    """Every bf16 bit pattern once (NaNs, Infs, subnormals, both zeros)."""
    return (
        torch.arange(-(2**15), 2**15, dtype=torch.int32)
        .to(torch.int16)
        .view(torch.bfloat16)
        .reshape(256, 256)
    )


def _zero_blocks():
    """Whole zero blocks (1-D and 2-D) among random ones, one row and column zero."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(260, 300, generator=g)
    x[:128, 128:256] = 0
    x[200] = 0
    x[:, 7] = 0
    return x.to(torch.bfloat16)


def _tiny():
    """amax a subnormal: fmax / amax overflows, the scale becomes FP32_MAX."""
    x = torch.full((5, 9), 1e-40)
    x[1, 2] = -3e-41
    return x


def _one_inf():
    """One -Inf among finite values, in a block past the first tile."""
    x = torch.randn(200, 300, generator=torch.Generator().manual_seed(4))
    x[166, 290] = -float("inf")
    return x


INPUTS = {
    "wide_2d": lambda: _wide((200, 300), 0),  # partial blocks along both dims
    "wide_3d_bf16": lambda: _wide((2, 65, 130), 1, torch.bfloat16),
    "wide_fp16": lambda: _wide((129, 64), 2, torch.float16),
    "every_bf16": _all_bf16,
    "zero_blocks": _zero_blocks,
    "zeros": lambda: torch.zeros(3, 5, dtype=torch.bfloat16),
    "subnormal_amax": _tiny,
    "one_inf": _one_inf,
    "m_1": lambda: _wide((1, 300), 5, torch.bfloat16),
    "k_1": lambda: _wide((300, 1), 6, torch.bfloat16),
    "m_4": lambda: _wide((4, 260), 7),  # one packed word per transposed row
    "one_dim": lambda: _wide((77,), 8),
    "non_contiguous": lambda: _wide((40, 260), 9).t(),
    "signed_nan": lambda: torch.tensor([[-float("nan"), float("nan"), 1.0, -2.0]]),
    "batch_0": lambda: torch.zeros(0, 48, dtype=torch.bfloat16),
    "k_0": lambda: torch.zeros(5, 0),
}

CONFIGS = {
    "e4m3_pow2": dict(fp8_dtype=E4M3),  # TE's Float8BlockScaling default
    "e5m2": dict(fp8_dtype=E5M2, force_pow_2_scales=False),
    "e4m3": dict(fp8_dtype=E4M3, force_pow_2_scales=False),
    "e5m2_eps_pow2": dict(fp8_dtype=E5M2, amax_epsilon=1e-3),
    "e4m3_eps_large": dict(fp8_dtype=E4M3, amax_epsilon=1e6, force_pow_2_scales=False),
}
USAGES = {"both": (True, True), "rowwise": (True, False), "columnwise": (False, True)}
# (input, config, block_scaling_dim, usage, block_len, launch override or None)
CASES = [
    (n, c, d, "both", 128, None) for n in INPUTS for c in ("e4m3_pow2", "e5m2") for d in (1, 2)
]
CASES += [
    (n, c, d, "both", 128, None)
    for n in ("wide_2d", "every_bf16", "one_inf")
    for c in ("e4m3", "e5m2_eps_pow2", "e4m3_eps_large")
    for d in (1, 2)
]
CASES += [
    (n, "e4m3_pow2", d, u, 128, None)
    for n in ("wide_3d_bf16", "m_1", "k_1", "batch_0")
    for d in (1, 2)
    for u in ("rowwise", "columnwise")
]
# Other block lengths, and tiles of several blocks (the reshaping path).
CASES += [
    (n, "e4m3_pow2", d, "both", b, None)
    for n in ("wide_2d", "every_bf16")
    for d in (1, 2)
    for b in (32, 4, 1)
]
CASES += [
    ("wide_2d", "e5m2", d, u, 128, launch)
    for d in (1, 2)
    for u, launch in (
        ("both", (256, 128, 8)),
        ("both", (128, 256, 8)),
        ("rowwise", (8, 256, 2)),
        ("columnwise", (256, 8, 2)),
    )
    if d == 1 or min(launch[:2]) >= 128
]
CASES += [("every_bf16", "e4m3", 1, "both", 32, (64, 128, 4))]


def _quantizer(config, dim=1, usage="both", block_len=128):
    row, col = USAGES[usage]
    return Float8BlockQuantizer(
        **CONFIGS[config],
        block_len=block_len,
        block_scaling_dim=dim,
        rowwise_usage=row,
        columnwise_usage=col,
    )


def _fused(q, x, launch=None):
    return bk.fused_quantize(
        x,
        q.fp8_dtype,
        q.block_len,
        q.block_scaling_dim,
        q.force_pow_2_scales,
        q.amax_epsilon,
        q.rowwise_usage,
        q.columnwise_usage,
        launch=launch,
    )


def assert_bitwise(ref, got):
    """Same buffers present, same shapes, same bits (fp32 compared as int32)."""
    assert set(ref) == set(got), (sorted(ref), sorted(got))
    for name, r in ref.items():
        g = got[name].cpu()
        assert g.shape == r.shape and g.dtype == r.dtype, (name, g.shape, r.shape)
        assert g.is_contiguous(), name
        if r.dtype == torch.float32:
            r, g = r.view(torch.int32), g.view(torch.int32)
        bad = (r != g).nonzero()
        assert bad.numel() == 0, f"{name}: {bad.shape[0]} differ, first at {bad[:3].tolist()}"


def run_interpreter_cases() -> list[str]:
    """Every case through the interpreted kernel; the failures (run in a child)."""
    failures = []
    for name, config, dim, usage, block_len, launch in CASES:
        q = _quantizer(config, dim, usage, block_len)
        x = INPUTS[name]()
        if x.dtype == torch.bfloat16 and ((x != 0) & (x.abs() < 2.0**-126)).any():
            # Triton's interpreter converts bf16 subnormals to fp32 wrongly (the GPU's
            # conversion is exact): it reads the same values as fp32. Only a block of
            # subnormals (a scale ~2**127) tells; the gpu tests keep bf16.
            x = x.float()
        try:
            assert_bitwise(q._quantize_reference(x), _fused(q, x, launch))
        except AssertionError as exc:
            failures.append(f"{name}/{config}/dim {dim}/{usage}/b {block_len}/{launch}: {exc}")
    return failures


@needs_triton
@pytest.mark.slow
def test_interpreted_kernel_matches_the_reference_bit_for_bit():
    """In a fresh interpreter (Triton's interpreter refuses nested @jit helpers once
    torch.compile has run in the process)."""
    out = assert_interpreted(__file__, "failures = t.run_interpreter_cases()", "len(t.CASES)")
    assert out.endswith(f"{len(CASES)} cases\n")


def _launched_configurations():
    """Every (constexprs, warps) a quantize or the benchmark's sweep launches, for a bf16
    input: each usage set and block dim, block lengths 128, 32, 4 and 1, packed and
    byte transposes, the tiles of the bitwise cases and every tile the benchmark sweeps."""
    from benchmarks.block_quantize import MODES, SWEEP

    configs = set()
    for (two_d, rowwise, columnwise), b, pack_t, pow2 in itertools.product(
        bk.TILES, (128, 32, 4, 1), (False, True), (False, True)
    ):
        if (pack_t and not columnwise) or (pow2 and b != 128):
            continue
        bm, bkk, warps = bk.tile(b, two_d, rowwise, columnwise)
        key = (E4M3, pow2, b, two_d, rowwise, columnwise, pack_t, bm, bkk)
        configs.add((bk._constexprs(*key), warps))
    for _, config, dim, usage, b, launch in CASES:
        if launch is not None:  # the tiles the bitwise cases pick
            rowwise, columnwise = USAGES[usage]
            c = CONFIGS[config]
            pow2 = c.get("force_pow_2_scales", True)
            key = (c["fp8_dtype"], pow2, b, dim == 2, rowwise, columnwise, columnwise, *launch[:2])
            configs.add((bk._constexprs(*key), launch[2]))
    for mode, launches in SWEEP.items():
        dim, rowwise, columnwise = MODES[mode]
        for bm, bkk, warps in launches:
            key = (E5M2, True, 128, dim == 2, rowwise, columnwise, columnwise, bm, bkk)
            configs.add((bk._constexprs(*key), warps))
    return sorted(configs, key=repr)


@needs_triton
@pytest.mark.slow
def test_every_launched_configuration_compiles_for_the_h200_with_exact_arithmetic():
    """What the interpreter cannot check: every configuration compiles for sm_90 (no
    GPU needed), with no fused multiply-add, no approximate division and no flushing of
    subnormals (the reference keeps them)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from transformer_engine_ops.kernels import _fp8_block_triton

    kernel = triton.jit(_fp8_block_triton._block_quantize)
    signature = {"x_ptr": "*bf16", "data_ptr": "*u8", "row_si_ptr": "*fp32", "t_ptr": "*i32"}
    signature |= {"col_si_ptr": "*fp32", "M": "i32", "K": "i32", "fmax": "fp32"}
    signature |= {"epsilon": "fp32"}
    configs = _launched_configurations()
    assert len(configs) > 60
    for constexprs, warps in configs:
        named = dict(constexprs)
        source = ASTSource(
            fn=kernel,
            signature={**signature, **{name: "constexpr" for name in named}},
            constexprs=named,
        )
        compiled = triton.compile(
            source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
        )
        ptx = compiled.asm["ptx"]
        assert "fma.rn.f32" not in ptx, named
        assert "div.approx" not in ptx and "div.full" not in ptx, named
        assert ".ftz" not in ptx, named


# --- eligibility and arguments (CPU) --------------------------------------------------


def test_cpu_tensors_take_the_reference(monkeypatch):
    monkeypatch.setattr(bk, "fused_quantize", lambda *a, **k: pytest.fail("kernel path taken"))
    q = _quantizer("e4m3_pow2")
    x = _wide((4, 130), 1, torch.bfloat16)
    assert not bk.eligible(x, 128)
    got = q._quantize_impl(x)
    assert_bitwise(q._quantize_reference(x), got)


@pytest.mark.parametrize("block_len", [128, 64, 32, 16, 4, 2, 1])
def test_powers_of_two_up_to_128_are_supported(block_len):
    assert bk.supports(block_len)


@pytest.mark.parametrize("block_len", [3, 96, 100, 256, 1024])
def test_other_block_lengths_are_not_eligible(block_len):
    """Not a power of two, or longer than a tile: the reference, whatever the tensor
    (on CUDA too: ``test_an_unsupported_block_length_on_cuda_takes_the_reference``)."""
    assert not bk.supports(block_len)
    assert not bk.eligible(torch.randn(4, 8), block_len)


def test_unsupported_input_dtypes_take_the_reference():
    assert not bk.eligible(torch.ones(4, 8, dtype=torch.float64), 128)
    assert not bk.eligible(torch.ones(4, 8, dtype=torch.int32), 128)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        bk.fused_quantize(torch.ones(2, 2), E4M3, 128, 1, True, 0.0, True, True)


def test_bad_arguments_are_named():
    def call(x=None, dtype=E4M3, b=128, dim=1, row=True, col=True, **kw):
        x = torch.ones(2, 2) if x is None else x
        return bk.fused_quantize(x, dtype, b, dim, True, 0.0, row, col, **kw)

    with pytest.raises(TypeError, match="not an FP8 dtype"):
        call(dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="cannot quantize dtype"):
        call(torch.ones(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="at least one dim"):
        call(torch.tensor(1.0))
    with pytest.raises(ValueError, match="block_len must be a power of two <= 128, got 96"):
        call(b=96)
    with pytest.raises(ValueError, match="block_scaling_dim must be 1 or 2, got 3"):
        call(dim=3)
    with pytest.raises(ValueError, match="asks for no usage"):
        call(row=False, col=False)


def test_tiles_fit_their_blocks():
    """Every configured tile, for every supported block length: powers of two holding
    whole blocks along the dims blocks run, edges of at least 4."""
    for two_d, rowwise, columnwise in bk.TILES:
        for b in (1, 2, 4, 8, 16, 32, 64, 128):
            bm, bkk, warps = bk.tile(b, two_d, rowwise, columnwise)
            assert bm & (bm - 1) == 0 and bkk & (bkk - 1) == 0 and bm >= 4 and bkk >= 4
            if two_d or columnwise:
                assert bm % b == 0
            if two_d or rowwise:
                assert bkk % b == 0
            assert warps in (1, 2, 4, 8, 16)


def test_scale_inv_shapes_are_the_quantizers():
    from transformer_engine_ops.quantization.float8_block import _scale_inv_shape

    for m, k, b, dim in [(1, 1, 128, 1), (200, 300, 128, 2), (0, 48, 32, 1), (300, 1, 4, 2)]:
        assert bk.scale_inv_shape(m, k, b, dim) == _scale_inv_shape(m, k, b, dim)


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("usage", ["both", "rowwise", "columnwise"])
def test_the_recorded_op_fakes_the_reference_buffers(dim, usage):
    """What a lowered graph would record: the op's fake outputs have the reference's
    shapes and dtypes, a usage left out as 0-element tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = bk._quantize_op()
    for shape, b in [((200, 300), 128), ((2, 65, 130), 32), ((1, 7), 4), ((77,), 128)]:
        q = _quantizer("e4m3_pow2", dim, usage, b)
        ref = q._quantize_reference(torch.randn(shape))
        with FakeTensorMode():
            x = torch.empty(shape)
            fake = op(x, E4M3, b, dim, True, 0.0, q.rowwise_usage, q.columnwise_usage)
        for name, t in zip(bk._KEYS, fake, strict=True):
            want = ref.get(name)
            if want is None:
                assert t.numel() == 0, name
            else:
                assert (t.shape, t.dtype) == (want.shape, want.dtype), (name, shape, b)


def test_module_imports_without_triton_and_the_quantizer_keeps_working():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "from transformer_engine_ops.kernels import block_kernels as b\n"
        "from transformer_engine_ops.quantization import Float8BlockQuantizer as Q\n"
        "assert not b.available(), 'available without triton'\n"
        "print(b.unavailable_reason())\n"
        "import torch; Q().quantize(torch.ones(4, 4))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "triton is not importable" in out.stdout


# --- on the GPU ---------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("name", "config", "dim", "usage", "block_len", "launch"), CASES)
def test_cuda_kernel_matches_the_cpu_reference_bit_for_bit(
    name, config, dim, usage, block_len, launch
):
    q = _quantizer(config, dim, usage, block_len)
    x = INPUTS[name]()
    assert_bitwise(q._quantize_reference(x), _fused(q, x.cuda(), launch))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("usage", ["both", "rowwise", "columnwise"])
def test_cuda_quantize_takes_the_kernel_and_matches_the_cpu(dim, usage, monkeypatch):
    calls = []
    real = bk.fused_quantize
    monkeypatch.setattr(bk, "fused_quantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    q = _quantizer("e4m3_pow2", dim, usage)
    x = _wide((1031, 2053), 7, torch.bfloat16)  # several tiles, ragged edges
    got = q.quantize(x.cuda())
    assert calls, "the CUDA quantize did not take the kernel"
    ref = q.quantize(x)
    names = [n for n in bk._KEYS if getattr(ref, n, None) is not None]
    assert names
    assert_bitwise({n: getattr(ref, n) for n in names}, {n: getattr(got, n) for n in names})


@pytest.mark.gpu
@needs_cuda
def test_an_unsupported_block_length_on_cuda_takes_the_reference(monkeypatch):
    monkeypatch.setattr(bk, "fused_quantize", lambda *a, **k: pytest.fail("kernel path taken"))
    q = Float8BlockQuantizer(block_len=96, block_scaling_dim=1)
    # No NaN: the reference on CUDA drops a NaN's sign in its multiply (the CPU keeps it).
    x = _one_inf().to(torch.bfloat16)
    got = q.quantize(x.cuda())
    ref = q.quantize(x)
    names = [n for n in bk._KEYS if getattr(ref, n, None) is not None]
    assert_bitwise({n: getattr(ref, n) for n in names}, {n: getattr(got, n) for n in names})


@pytest.mark.gpu
@needs_cuda
def test_the_recorded_block_quantize_op_passes_opcheck():
    op = bk._quantize_op()
    for shape, b, dim, rowwise, columnwise in [
        ((256, 384), 128, 1, True, True),
        ((3, 5, 130), 128, 2, True, False),
        ((130, 64), 32, 1, False, True),
    ]:
        x = torch.randn(shape, device="cuda").to(torch.bfloat16)
        torch.library.opcheck(op, (x, E4M3, b, dim, True, 0.0, rowwise, columnwise))


@pytest.mark.gpu
@needs_cuda
def test_the_benchmark_sweep_compiles_every_variant_with_the_configured_bits():
    """``benchmarks.block_quantize`` times launches of its own tiles: each must compile
    and write what the configured launch writes, which writes the reference's bits."""
    from benchmarks import block_quantize

    for mode in block_quantize.MODES:
        out = block_quantize.run(300, 520, mode, sweep=True)
        assert out["bitwise_reference"], mode
        assert out["wrong"] == [], (mode, out["wrong"])
        assert all(isinstance(us, float) for us in out["us"].values()), (mode, out["us"])
