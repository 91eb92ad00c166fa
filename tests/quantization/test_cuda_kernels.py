"""Fused FP8 current-scaling kernels: bit for bit equal to the CPU reference quantizer.

Interpreter tests run the Triton kernels on CPU tensors under ``TRITON_INTERPRET=1``
(skipped when triton is not importable); ``gpu`` tests run the compiled kernels on CUDA
and through ``Float8CurrentScalingQuantizer.quantize`` (the hook) against the CPU path.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from tests.triton_interpreter import assert_interpreted
from transformer_engine_ops.kernels import cuda_kernels as ck
from transformer_engine_ops.quantization import Float8CurrentScalingQuantizer

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


def _tiny():
    """amax a subnormal: fmax / amax overflows, the scale becomes FP32_MAX."""
    x = torch.full((5, 9), 1e-40)
    x[1, 2] = -3e-41
    return x


INPUTS = {
    "wide_2d": lambda: _wide((70, 130), 0),
    "wide_3d_bf16": lambda: _wide((2, 3, 67), 1, torch.bfloat16),
    # Row counts that are multiples of 4 take the packed (int32-word) transpose store;
    # 100 and 20 rows end inside a tile, 130 and 67 columns too.
    "packed_ragged": lambda: _wide((100, 130), 6, torch.bfloat16),
    "packed_3d": lambda: _wide((4, 5, 67), 7),
    "wide_fp16": lambda: _wide((65, 64), 2, torch.float16),
    "every_bf16": _all_bf16,
    "zeros": lambda: torch.zeros(3, 5, dtype=torch.bfloat16),
    "only_nan_and_inf": lambda: torch.tensor([[float("nan"), float("inf")], [-float("inf"), 1]])[
        :, :1
    ].contiguous(),
    "subnormal_amax": _tiny,
    "batch_0": lambda: torch.zeros(0, 48, dtype=torch.bfloat16),
    "batch_1": lambda: _wide((1, 33), 3, torch.bfloat16),
    "one_dim": lambda: _wide((77,), 4),
    "non_contiguous": lambda: _wide((40, 66), 5).t(),
    "signed_nan": lambda: torch.tensor([[-float("nan"), float("nan"), 1.0, -2.0]]),
    # One -Inf among finite values (past the first tile): scale_inv must become +Inf.
    "one_inf": lambda: torch.randn(70, 130).index_put_(
        (torch.tensor([66]), torch.tensor([129])), torch.tensor(-float("inf"))
    ),
}

CONFIGS = {
    "e4m3": dict(fp8_dtype=E4M3),
    "e5m2": dict(fp8_dtype=E5M2),
    "e4m3_pow2": dict(fp8_dtype=E4M3, force_pow_2_scales=True),
    "e5m2_eps_pow2": dict(fp8_dtype=E5M2, amax_epsilon=1e-3, force_pow_2_scales=True),
    "e4m3_eps_large": dict(fp8_dtype=E4M3, amax_epsilon=1e6),
    "e4m3_eps_huge": dict(fp8_dtype=E4M3, amax_epsilon=3e38),
}
USAGES = {"both": (True, True), "rowwise": (True, False), "columnwise": (False, True)}
# Every input x config with both usages; one-usage runs on three inputs.
CASES = [(n, c, "both") for n in INPUTS for c in CONFIGS] + [
    (n, c, u)
    for n in ("wide_3d_bf16", "batch_1", "batch_0")
    for c in CONFIGS
    for u in ("rowwise", "columnwise")
]


def _quantizer(config, usage):
    row, col = USAGES[usage]
    return Float8CurrentScalingQuantizer(**CONFIGS[config], rowwise_usage=row, columnwise_usage=col)


def _fused(q, x):
    return ck.fp8_current_scaling_quantize(x, q.fp8_dtype, **q.fused_options())


def assert_bitwise(ref, got):
    """Same buffers present, same shapes, same bits (fp32 compared as int32)."""
    assert set(ref) == set(got)
    for name, r in ref.items():
        g = got[name]
        if r is None:
            assert g is None, name
            continue
        g = g.cpu()
        assert g.shape == r.shape and g.dtype == r.dtype, (name, g.shape, r.shape)
        if r.dtype == torch.float32:
            r, g = r.view(torch.int32), g.view(torch.int32)
        bad = (r != g).nonzero()
        assert bad.numel() == 0, f"{name}: {bad.shape[0]} differ, first at {bad[:3].tolist()}"


def _fused_bias_grad(q, x):
    return ck.fp8_current_scaling_quantize_bias_grad(x, q.fp8_dtype, **q.fused_options())


def _integers(shape, seed):
    """Small integers: every fp32 column sum is exact, in any order."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, shape, generator=g).to(torch.bfloat16)


# 2-D inputs of the fused bias-gradient pass: several row groups (700 rows: 44 groups
# of 16, read by the cast kernel 16 at a time) and column blocks, ragged edges.
BIAS_GRAD_INPUTS = {
    **{n: INPUTS[n] for n in ("wide_2d", "packed_ragged", "every_bf16", "zeros")},
    **{n: INPUTS[n] for n in ("batch_0", "batch_1", "only_nan_and_inf", "one_inf")},
    "integers_tall": lambda: _integers((700, 300), 10),
    "integers_wide_fp16": lambda: _integers((33, 1030), 11).half(),
}
BIAS_GRAD_CASES = [(n, c) for n in BIAS_GRAD_INPUTS for c in ("e4m3", "e5m2_eps_pow2")]


def assert_bias_grad(x, got):
    """The fp32 column sums of ``x``: exact where every partial sum is (integers), else
    within the reordering bound of an fp32 sum; NaN and +-Inf where the plain sum has them."""
    ref = x.float().sum(0)
    got = got.cpu()
    assert got.shape == ref.shape and got.dtype == torch.float32
    finite = ref.isfinite()
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(
        got[~finite].nan_to_num(), ref[~finite].nan_to_num()
    )
    bound = x.float().abs().sum(0)[finite] * (x.shape[0] * torch.finfo(torch.float32).eps)
    assert ((got[finite] - ref[finite]).abs() <= bound).all()


def run_interpreter_cases() -> list[str]:
    """Every case through the interpreted kernels; the failures (run in a child)."""
    failures = []
    for name, config, usage in CASES:
        q = _quantizer(config, usage)
        x = INPUTS[name]()
        try:
            assert_bitwise(q._quantize_impl(x), _fused(q, x))
        except AssertionError as exc:
            failures.append(f"{name}/{config}/{usage}: {exc}")
    for name, config in BIAS_GRAD_CASES:
        q = _quantizer(config, "both")
        x = BIAS_GRAD_INPUTS[name]()
        try:
            buffers, bias_grad = _fused_bias_grad(q, x)
            assert_bitwise(q._quantize_impl(x), buffers)
            assert_bias_grad(x, bias_grad)
            if name.startswith("integers"):
                assert torch.equal(bias_grad, x.float().sum(0))
        except AssertionError as exc:
            failures.append(f"bias grad {name}/{config}: {exc}")
    return failures


@needs_triton
@pytest.mark.slow
def test_interpreted_kernels_match_the_reference_bit_for_bit():
    """In a fresh interpreter: after torch.compile has run in this process (other
    tests), Triton 3.9's interpreter refuses the kernels' nested @jit helpers."""
    out = assert_interpreted(__file__, "failures = t.run_interpreter_cases()", "len(t.CASES)")
    assert out.endswith(f"{len(CASES)} cases\n")


def test_negative_nan_keeps_its_sign_in_the_reference():
    """The behaviour the kernels copy (the signed_nan case checks them against it)."""
    x = torch.tensor([[-float("nan"), float("nan"), 1.0, -2.0]])
    ref = _quantizer("e4m3", "both")._quantize_impl(x)["_data"]
    assert ref[0, :2].tolist() == [0xFF, 0x7F]


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        ck.fp8_current_scaling_quantize(torch.ones(2, 2), E4M3)


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="not an FP8 dtype"):
        ck.fp8_current_scaling_quantize(torch.ones(2, 2), torch.bfloat16)
    with pytest.raises(TypeError, match="cannot quantize dtype"):
        ck.fp8_current_scaling_quantize(torch.ones(2, 2, dtype=torch.int32), E4M3)
    with pytest.raises(ValueError, match="at least one dim"):
        ck.fp8_current_scaling_quantize(torch.tensor(1.0), E4M3)
    with pytest.raises(ValueError, match="needs a 2-D tensor"):
        ck.fp8_current_scaling_quantize_bias_grad(torch.ones(2, 2, 2), E4M3)


def test_quantize_with_bias_grad_is_quantize_and_a_column_sum_on_the_cpu():
    """The reference path (every format, the CPU): the same quantized value as
    ``quantize`` and ``t.sum(0)`` in fp32; a non-2-D tensor is refused by name."""
    q = _quantizer("e4m3", "both").with_internal(True)
    x = _wide((70, 130), 12, torch.bfloat16)
    got, bias_grad = q.quantize_with_bias_grad(x)
    want = q.quantize(x)
    for n in ("_data", "_transpose", "_scale_inv"):
        assert torch.equal(getattr(got, n), getattr(want, n)), n
    want_grad = x.sum(0, dtype=torch.float32)
    assert torch.equal(bias_grad.view(torch.int32), want_grad.view(torch.int32))  # NaNs too
    with pytest.raises(ValueError, match=r"bias gradient is taken of a 2-D tensor.*\(2, 3, 4\)"):
        q.quantize_with_bias_grad(torch.ones(2, 3, 4))


def test_cpu_tensors_never_take_the_fused_path():
    assert not ck.eligible(torch.ones(2, 2))


def test_module_imports_and_reports_why_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "from transformer_engine_ops.kernels import cuda_kernels as c\n"
        "from transformer_engine_ops.quantization import Float8CurrentScalingQuantizer as Q\n"
        "assert not c.available(), 'available without triton'\n"
        "print(c.unavailable_reason())\n"
        "import torch; Q().quantize(torch.ones(4, 4))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "triton is not importable" in out.stdout


@needs_triton
def test_the_launch_key_tells_apart_every_argument_triton_specializes_differently():
    """Arguments with one key must get one kernel: the key of ``_triton_launch`` is at
    least as fine as Triton's own specialization (``native_specialize_impl``, what its
    binder calls; CPU tensors suffice, alignment is read from ``data_ptr``)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    from transformer_engine_ops.kernels._triton_launch import (
        specialization,
        specializations,
    )

    base = {d: torch.zeros(64, dtype=d) for d in (torch.bfloat16, torch.uint8, torch.int32)}
    samples: list = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 1, 2**31, 2**31 + 16, 2**40]
    samples += [2**63 - 1, 2**63 + 16, 0.0, 0.5, 3e38, True, False]
    samples += [t[off:] for t in base.values() for off in (0, 1, 2, 4, 8, 16)]
    triton_kinds: dict = {}
    for arg in samples:
        ours = specialization(arg)
        theirs = native_specialize_impl(BaseBackend, arg, False, True, True)
        triton_kinds.setdefault(ours, set()).add(theirs)
    clashes = {k: v for k, v in triton_kinds.items() if len(v) > 1}
    assert not clashes, f"one launch key, several Triton kernels: {clashes}"
    assert len(triton_kinds) >= 10  # the samples do exercise distinct specializations
    # The launcher's one-call form (inline common kinds) keys every argument alike.
    samples.append(torch.nn.Parameter(base[torch.bfloat16][2:]))
    assert specializations(samples) == tuple(specialization(a) for a in samples)


# --- on the GPU ---------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("name", "config", "usage"), CASES)
def test_cuda_kernels_match_the_cpu_reference_bit_for_bit(name, config, usage):
    q = _quantizer(config, usage)
    x = INPUTS[name]()
    assert_bitwise(q._quantize_impl(x), _fused(q, x.cuda()))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("name", "config"), BIAS_GRAD_CASES)
def test_cuda_bias_grad_pass_writes_the_reference_bits_and_the_column_sums(name, config):
    q = _quantizer(config, "both")
    x = BIAS_GRAD_INPUTS[name]()
    buffers, bias_grad = _fused_bias_grad(q, x.cuda())
    assert_bitwise(q._quantize_impl(x), buffers)
    assert_bias_grad(x, bias_grad)
    if name.startswith("integers"):
        assert torch.equal(bias_grad.cpu(), x.float().sum(0))
    # through the quantizer: the fused pass on CUDA, the same value as quantize
    got, via_quantizer = q.quantize_with_bias_grad(x.cuda())
    assert torch.equal(via_quantizer.view(torch.int32), bias_grad.view(torch.int32))
    on_cpu = {n: None if b is None else b.cpu() for n, b in buffers.items()}
    assert_bitwise(on_cpu, {n: getattr(got, n) for n in buffers})


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("config", ["e4m3", "e5m2_eps_pow2"])
def test_cuda_quantize_takes_the_fused_path_and_matches_the_cpu(config, monkeypatch):
    calls = []
    real = ck.fused_quantize
    monkeypatch.setattr(ck, "fused_quantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    q = _quantizer(config, "both")
    x = _wide((1031, 2053), 7, torch.bfloat16)  # several tiles, ragged edges
    got = q.quantize(x.cuda())
    assert calls, "the CUDA quantize did not use the fused kernels"
    ref = q.quantize(x)
    names = ("_data", "_transpose", "_scale_inv")
    assert_bitwise({n: getattr(ref, n) for n in names}, {n: getattr(got, n) for n in names})


@pytest.mark.gpu
@needs_cuda
def test_a_frozen_weight_parameter_takes_the_fused_path(monkeypatch):
    """A weight that needs no gradient reaches the quantizer as its Parameter (nothing
    detaches it): it must still take the fused kernels, not the reference ops."""
    calls = []
    real = ck.fused_quantize
    monkeypatch.setattr(ck, "fused_quantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    q = _quantizer("e4m3", "both")
    x = _wide((96, 130), 9, torch.bfloat16)
    frozen = torch.nn.Parameter(x.cuda(), requires_grad=False)
    got = q.quantize(frozen)
    assert calls, "a frozen Parameter took the reference ops"
    ref = q.quantize(x)
    names = ("_data", "_transpose", "_scale_inv")
    assert_bitwise({n: getattr(ref, n) for n in names}, {n: getattr(got, n) for n in names})


@pytest.mark.gpu
@needs_cuda
def test_repeated_launches_go_straight_to_the_compiled_kernel_with_the_same_bits():
    """After the first launch of a specialization, the kernels launch without Triton's
    per-call Python, and write the reference's bits; an input of the same shape but
    another alignment (a view at an odd offset) is a new specialization, not a reuse."""
    amax, _, cast = ck._kernels(False)
    if not amax.direct:
        pytest.skip(f"direct launch not verified for this Triton ({amax.direct})")
    q = _quantizer("e4m3", "both")
    base = _wide((1, 96 * 130 + 1), 8, torch.bfloat16).cuda().view(-1)
    aligned = base[: 96 * 130].view(96, 130)
    shifted = base[1:].view(96, 130)  # 2-byte offset: not 16-byte aligned
    for x in (aligned, aligned, shifted, shifted, aligned):
        before = (amax.direct_launches, cast.direct_launches)
        got = _fused(q, x)
        assert_bitwise(q._quantize_impl(x.cpu()), got)
    assert (amax.direct_launches, cast.direct_launches) > before
    assert cast.direct_launches >= 3  # 2nd aligned, 2nd shifted, 3rd aligned


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_tensor_on_another_gpu_is_quantized_on_its_own_device():
    q = _quantizer("e4m3", "both")
    x = _wide((70, 130), 9, torch.bfloat16)
    with torch.cuda.device(0):
        got = _fused(q, x.to("cuda:1"))
    assert all(t.device == torch.device("cuda:1") for t in got.values() if t is not None)
    assert_bitwise(q._quantize_impl(x), got)


class _FakeCompiled:
    """What ``kernel[grid](...)`` returns: a compiled kernel with a launcher."""

    function, packed_metadata = "fn", "meta"

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list = []
        self.refuse = refuse

    def run(self, *call):
        if self.refuse:
            raise TypeError("function takes exactly 17 arguments (16 given)")
        self.calls.append(call)


class _FakeJit:
    """A JIT kernel of signature (x, n, BLOCK): records launches through Triton."""

    arg_names = ("x", "n", "BLOCK")
    pre_run_hooks: list = []

    def __init__(self, compiled: _FakeCompiled) -> None:
        self.compiled = compiled
        self.triton_launches: list = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.triton_launches.append((grid, args, kwargs))
            return self.compiled

        return launch


@needs_triton
def test_the_cached_launcher_goes_direct_after_the_first_launch_of_each_key(monkeypatch):
    """First launch of a key through Triton (which compiles), then the compiled
    kernel's launcher with every argument in signature order; a new specialization
    (another alignment) through Triton again; a launch hook, or a launcher refusing the
    call, sends every launch through Triton."""
    import triton

    from transformer_engine_ops.kernels import _triton_launch as tl_

    # The launcher's own bindings (a CPU-only torch binds them to a refusal at import).
    monkeypatch.setattr(tl_, "_current_device", lambda: 0)
    monkeypatch.setattr(tl_, "_current_raw_stream", lambda d: 1234)
    compiled = _FakeCompiled()
    jit = _FakeJit(compiled)
    launcher = tl_.CachedLauncher(jit)
    launcher.direct = True
    buf = torch.zeros(64, dtype=torch.bfloat16)
    launcher((4, 1, 1), (buf, 64), {"BLOCK": 128}, num_warps=8)
    launcher((4, 1, 1), (buf, 64), {"BLOCK": 128}, num_warps=8)
    assert len(jit.triton_launches) == 1 and launcher.direct_launches == 1
    grid_and_stream, tail = compiled.calls[0][:4], compiled.calls[0][9:]
    assert grid_and_stream == (4, 1, 1, 1234) and tail == (buf, 64, 128)
    # Constexprs as built once per configuration, (name, value) pairs: the same key.
    launcher((4, 1, 1), (buf, 64), (("BLOCK", 128),), num_warps=8)
    assert len(jit.triton_launches) == 1 and launcher.direct_launches == 2
    assert compiled.calls[1][9:] == (buf, 64, 128)
    launcher((4, 1, 1), (buf[1:], 63), {"BLOCK": 128}, num_warps=8)  # misaligned: new key
    assert len(jit.triton_launches) == 2
    hook = triton.knobs.runtime.launch_enter_hook
    if hasattr(hook, "add"):  # a profiler's hook: Triton must see every launch
        probe = lambda *a: None  # noqa: E731
        hook.add(probe)
        try:
            launcher((4, 1, 1), (buf, 64), {"BLOCK": 128}, num_warps=8)
            assert len(jit.triton_launches) == 3
        finally:
            hook.remove(probe)
    refusing = tl_.CachedLauncher(_FakeJit(_FakeCompiled(refuse=True)))
    refusing.direct = True
    for _ in range(3):
        refusing((1, 1, 1), (buf, 64), {"BLOCK": 128}, num_warps=4)
    assert not refusing.direct and len(refusing._kernel.triton_launches) == 3


@pytest.mark.gpu
@needs_cuda
def test_the_launch_sweep_runs_its_variants_and_each_writes_the_launch_bits():
    """``benchmarks.fp8_tiles`` launches the kernels itself with other tiles and amax
    chunks: it must keep up with their arguments, and every variant it times must write
    what the configured launch writes (its own check), on a ragged shape."""
    from benchmarks import fp8_tiles

    tiles = [((16, 128), 2, False), ((64, 64), 4, True)]
    out = fp8_tiles.sweep(96, 200, tiles, [(1024, 8, 4)])
    assert out["wrong"] == []
    timed = {name: us for name, us in out["us"].items() if isinstance(us, float)}
    assert len(timed) == len(out["us"]) >= 5, out["us"]  # no variant failed to launch
