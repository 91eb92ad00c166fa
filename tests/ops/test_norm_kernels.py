"""Fused norm kernels (``kernels/norm_kernels.py``): RMSNorm and LayerNorm, forward and
backward, against the float64 reference of the same formulas (``layernorm._norm_forward``
/ ``_norm_backward`` on float64 tensors).

Interpreter tests run the Triton kernels on CPU tensors under ``TRITON_INTERPRET=1`` in
a fresh process (skipped when triton is not importable; with 4 backward programs, so the
small shapes put several rows, and a ragged last group, in a program); ``gpu`` tests
run the compiled kernels on CUDA with the real program count. The backward's reference
takes the kernel's own fp32 ``mu``/``rsigma``, so each direction is bounded alone.

Bounds per element, with ``u = 2**-24`` (fp32's unit roundoff) and ``eps_out``,
``eps_in`` one rounding of the output and input dtype (0 for fp32): ``y`` within
``eps_out |y| + 64 u ((1 + |xhat|)(1 + |gamma|) + |beta|)``; ``mu`` within ``64 u`` of
the row's mean of ``|x|``; ``rsigma`` within ``64 u`` relative; ``dx`` (in the input's
dtype) within ``eps_in |dx| + 64 u rsigma (|g| + mean|g| + (1 + |xhat|) mean(|g| (1 +
|xhat|)))`` with ``g = dy gamma``; ``dgamma``/``dbeta`` within
``64 u`` of the column sums of ``|dy xhat|``/``|dy|``. Tree sums over up to 16384
columns stay within about ``log2(hidden)`` units; a wrong term is off by the magnitude
itself. NaN and Inf land where the fp32 reference (what CUDA ran before the kernels)
puts them.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

from tests.triton_interpreter import run_interpreted
from transformer_engine_ops.kernels import norm_kernels as nk
from transformer_engine_ops.ops import layernorm as ln

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

F32, BF16, F16, F64 = torch.float32, torch.bfloat16, torch.float16, torch.float64
U = 2.0**-24
# (layernorm, zero_centered_gamma, bias)
NORMS = [(True, False, True), (True, True, False), (False, False, False), (False, True, False)]
# (input dtype, weight and bias dtype, output dtype)
DTYPES = [(BF16, BF16, BF16), (F32, F32, F32), (F16, F32, F32), (F32, BF16, BF16)]
# (rows, hidden): no rows, one row, one column, odd sizes, more than one block of 4096
# and a block of 4096 with a partial one (5000), more rows than the interpreter's
# programs (ragged groups).
SHAPES = [(0, 7), (1, 5000), (5, 1), (7, 7), (3, 4096), (37, 130)]
EPS = 1e-5


def _inputs(rows: int, hidden: int, dtypes, seed: int) -> dict[str, torch.Tensor]:
    """x ~ N(0.5, 2^2), gamma ~ N(0 or 1, 0.5^2) stored in the weight dtype, beta, dy and
    an fp32 dy_extra."""
    in_dtype, w_dtype, _ = dtypes
    gen = torch.Generator().manual_seed(seed)
    return {
        "x": (torch.randn(rows, hidden, generator=gen) * 2 + 0.5).to(in_dtype),
        "weight": (torch.randn(hidden, generator=gen) * 0.5 + 1).to(w_dtype),
        "bias": torch.randn(hidden, generator=gen).to(w_dtype),
        "dy": torch.randn(rows, hidden, generator=gen).to(in_dtype),
        "dy_extra": torch.randn(rows, hidden, generator=gen),
    }


def _within(what: str, got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> Optional[str]:
    if got.shape != ref.shape:
        return f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    err = (got.double() - ref).abs()
    bound = bound.expand_as(err)
    if not (err <= bound).all():
        i = int((err - bound).argmax())
        return f"{what}: off by {err.reshape(-1)[i].item():.3g} > {bound.reshape(-1)[i].item():.3g} at {i}"
    return None


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a non-contiguous view (every other row of a taller tensor)."""
    tall = torch.zeros((t.shape[0] * 2, *t.shape[1:]), dtype=t.dtype, device=t.device)
    tall[::2] = t
    return tall[::2]


def check_against_float64(
    norm,
    dtypes,
    rows: int,
    hidden: int,
    device,
    *,
    dy_extra: bool,
    need_dgrad: bool = True,
    strided: bool = False,
) -> Optional[str]:
    """The kernels' forward and backward of random inputs against the float64
    reference (None, or what is wrong)."""
    layernorm, zero_centered, has_bias = norm
    out_dtype = dtypes[2]
    t = _inputs(rows, hidden, dtypes, seed=rows * 31 + hidden)
    k = {name: v.to(device) for name, v in t.items()}
    if strided:
        k["x"], k["dy"] = _strided(k["x"]), _strided(k["dy"])
        assert not k["x"].is_contiguous()
    bias = k["bias"] if has_bias else None
    y, mu, rsigma = nk.fused_norm_forward(
        k["x"], k["weight"], bias, layernorm, EPS, zero_centered, out_dtype
    )
    if (y.dtype, mu.dtype, rsigma.dtype) != (out_dtype, F32, F32):
        return f"forward dtypes {y.dtype}, {mu.dtype}, {rsigma.dtype}"
    if mu.shape != ((rows,) if layernorm else (0,)):
        return f"mu shape {tuple(mu.shape)}"
    mu_k = mu if layernorm else None
    dx, dgamma, dbeta = nk.fused_norm_backward(
        k["dy"],
        k["dy_extra"] if dy_extra else None,
        k["x"],
        k["weight"],
        mu_k,
        rsigma,
        zero_centered,
        need_dgrad,
    )
    if (dx.dtype, dgamma.dtype, dbeta.dtype) != (dtypes[0], F32, F32):
        return f"backward dtypes {dx.dtype}, {dgamma.dtype}, {dbeta.dtype}"

    x, w = t["x"].double(), t["weight"].double()
    b = t["bias"].double() if has_bias else None
    ref_y, ref_mu, ref_rsigma = ln._norm_forward(x, w, b, layernorm, EPS, zero_centered, F64)
    gamma = (w + 1 if zero_centered else w).abs()
    xhat = ((x - ref_mu[:, None]) if layernorm else x) * ref_rsigma[:, None]
    beta = b.abs() if has_bias else 0.0
    out_eps, in_eps = (0.0 if d == F32 else torch.finfo(d).eps for d in (out_dtype, dtypes[0]))
    m_y = (1 + xhat.abs()) * (1 + gamma) + beta
    checks = [("y", y, ref_y, out_eps * ref_y.abs() + 64 * U * m_y)]
    checks.append(("rsigma", rsigma, ref_rsigma, 64 * U * ref_rsigma.abs()))
    if layernorm:
        checks.append(("mu", mu, ref_mu, 64 * U * x.abs().mean(-1)))

    # The backward from the kernel's own statistics.
    mu_d = mu.cpu().double() if layernorm else None
    rsigma_d = rsigma.cpu().double()
    dyd = t["dy"].double() + (t["dy_extra"].double() if dy_extra else 0.0)
    ref_dx, ref_dgamma, ref_dbeta = ln._norm_backward(
        dyd, None, x, w, mu_d, rsigma_d, zero_centered, need_dgrad
    )
    xhat = ((x - mu_d[:, None]) if layernorm else x) * rsigma_d[:, None]
    checks.append(("dgamma", dgamma, ref_dgamma, 64 * U * (dyd * xhat).abs().sum(0)))
    checks.append(("dbeta", dbeta, ref_dbeta, 64 * U * dyd.abs().sum(0)))
    if need_dgrad:
        g = (dyd * gamma).abs()
        g1 = g * (1 + xhat.abs())
        m_dx = g + g.mean(-1, keepdim=True) + (1 + xhat.abs()) * g1.mean(-1, keepdim=True)
        dx_bound = in_eps * ref_dx.abs() + 64 * U * rsigma_d[:, None] * m_dx
        checks.append(("dx", dx, ref_dx, dx_bound))
    elif dx.numel():
        return f"dx has {dx.numel()} elements without need_dgrad"
    for what, got, ref, bound in checks:
        wrong = _within(what, got.cpu(), ref, bound)
        if wrong:
            return wrong
    return None


def check_special_values(layernorm: bool, device) -> Optional[str]:
    """Rows holding one NaN, +-Inf, an fp32 overflow or subnormals (and a row of zeros)
    in the input, and output gradients holding NaN or Inf: NaN and Inf where the fp32
    reference has them, the same Infs."""
    specials = [float("nan"), float("inf"), -float("inf"), 3e38, 1e-40]
    x = torch.randn(len(specials) + 1, 9, generator=torch.Generator().manual_seed(3))
    for i, s in enumerate(specials):
        x[i, i] = s
    x[-1] = 0.0
    w = torch.linspace(0.5, 1.5, 9)
    dy = torch.ones_like(x)
    dy[0, 3], dy[1, 4], dy[4, 5] = float("nan"), float("inf"), -float("inf")
    ref = ln._norm_forward(x, w, None, layernorm, EPS, False, F32)
    xk, wk, dyk = x.to(device), w.to(device), dy.to(device)
    got = nk.fused_norm_forward(xk, wk, None, layernorm, EPS, False, F32)
    got_mu, ref_mu = (got[1], ref[1]) if layernorm else (None, None)
    got = [*got, *nk.fused_norm_backward(dyk, None, xk, wk, got_mu, got[2], False, True)]
    ref = [*ref, *ln._norm_backward(dy, None, x, w, ref_mu, ref[2], False, True)]
    names = ("y", "mu", "rsigma", "dx", "dgamma", "dbeta")
    for what, g, r in zip(names, got, ref, strict=True):
        g = g.cpu()
        differs = (g.isnan() != r.isnan()) | (g.isinf() != r.isinf()) | (g.isinf() & (g != r))
        if differs.any():
            i = int(differs.reshape(-1).nonzero()[0])
            return f"{what} at {i}: {g.reshape(-1)[i].item()}, fp32 ref {r.reshape(-1)[i].item()}"
    return None


def run_cases(device: str) -> tuple[int, list[str]]:
    """Every norm x dtype triple x shape (dy_extra on every other shape), without dgrad,
    non-contiguous inputs and the special values: (cases, failures)."""
    cases, failures = 0, []

    def check(label: str, wrong: Optional[str]) -> None:
        nonlocal cases
        cases += 1
        if wrong:
            failures.append(f"{label}: {wrong}")

    for norm in NORMS:
        for dtypes in DTYPES:
            for i, (rows, hidden) in enumerate(SHAPES):
                wrong = check_against_float64(
                    norm, dtypes, rows, hidden, device, dy_extra=i % 2 == 1
                )
                check(f"{norm} {dtypes} {rows}x{hidden}", wrong)
        wrong = check_against_float64(
            norm, (BF16, F32, BF16), 9, 33, device, dy_extra=True, need_dgrad=False
        )
        check(f"{norm} without dgrad", wrong)
        wrong = check_against_float64(
            norm, (BF16, BF16, BF16), 6, 40, device, dy_extra=False, strided=True
        )
        check(f"{norm} non-contiguous", wrong)
    for layernorm in (True, False):
        check(f"layernorm={layernorm} special values", check_special_values(layernorm, device))
    return cases, failures


N_CASES = len(NORMS) * (len(DTYPES) * len(SHAPES) + 2) + 2


def _run_in_a_fresh_interpreter(code: str) -> subprocess.CompletedProcess:
    return run_interpreted(code, __file__)


@needs_triton
@pytest.mark.slow
def test_interpreted_kernels_match_the_float64_reference():
    out = _run_in_a_fresh_interpreter(
        "t.nk.BACKWARD_PROGRAMS = 4\n"
        "cases, failures = t.run_cases('cpu')\n"
        "print(cases, 'cases'); print('\\n'.join(failures))\n"
        "sys.exit(1 if failures else 0)\n"
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{N_CASES} cases" in out.stdout


def test_cpu_tensors_take_the_reference_ops():
    x, w = torch.randn(4, 8), torch.ones(8)
    assert not nk.eligible(x, w, None)
    assert not nk.eligible(x.double(), w.double())


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        nk.fused_norm_forward(torch.ones(2, 4), torch.ones(4), None, False, EPS, False, BF16)


def test_bad_arguments_are_named():
    x, w = torch.ones(2, 4), torch.ones(4)
    rsigma = torch.ones(2)
    with pytest.raises(ValueError, match=r"x must be a 2-D tensor \(rows, hidden\), got \(8,\)"):
        nk.fused_norm_forward(torch.ones(8), w, None, False, EPS, False, F32)
    with pytest.raises(ValueError, match="hidden size 16385 is outside 1..16384"):
        nk.fused_norm_forward(torch.ones(1, 16385), w, None, False, EPS, False, F32)
    with pytest.raises(TypeError, match="out_dtype torch.float64"):
        nk.fused_norm_forward(x, w, None, False, EPS, False, F64)
    with pytest.raises(TypeError, match="weight is torch.float64"):
        nk.fused_norm_forward(x, w.double(), None, False, EPS, False, F32)
    with pytest.raises(ValueError, match=r"bias has shape \(3,\), expected \(4,\)"):
        nk.fused_norm_forward(x, w, torch.ones(3), True, EPS, False, F32)
    with pytest.raises(ValueError, match=r"dy has shape \(2, 3\), expected \(2, 4\)"):
        nk.fused_norm_backward(torch.ones(2, 3), None, x, w, None, rsigma, False, True)
    with pytest.raises(ValueError, match=r"rsigma has shape \(3,\), expected \(2,\)"):
        nk.fused_norm_backward(x, None, x, w, None, torch.ones(3), False, True)
    with pytest.raises(TypeError, match="dy_extra is torch.int32"):
        nk.fused_norm_backward(x, x.int(), x, w, None, rsigma, False, True)


def test_longer_rows_than_the_kernels_take_the_reference_ops():
    x = torch.ones(2, nk.MAX_HIDDEN + 1)
    assert not nk.eligible(x, torch.ones(nk.MAX_HIDDEN + 1))


@needs_cuda
@pytest.mark.gpu
def test_cuda_kernels_match_the_float64_reference():
    cases, failures = run_cases("cuda")
    assert not failures, "\n".join(failures)
    assert cases == N_CASES


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("rows", "hidden"), [(4096, 4096), (1100, 16384), (70000, 64)])
def test_cuda_kernels_at_large_shapes(norm, rows, hidden):
    """The Llama-8B layer's norm (4096 tokens x 4096), the longest row the kernels take,
    and many rows a program (the real program count: 528)."""
    wrong = check_against_float64(norm, (BF16, BF16, BF16), rows, hidden, "cuda", dy_extra=True)
    assert wrong is None, wrong


@needs_cuda
@pytest.mark.gpu
def test_cuda_tensors_take_the_kernels():
    x = torch.randn(4, 8, device="cuda", dtype=BF16)
    w = torch.ones(8, device="cuda")
    assert nk.eligible(x, w, None, out_dtype=BF16)
    assert nk.eligible(x, torch.nn.Parameter(w), out_dtype=BF16)  # a module's norm weight
    assert not nk.eligible(x, w, out_dtype=F64)
    assert not nk.eligible(x.double(), w)
    assert not nk.eligible(x[None], w)
    assert not nk.eligible(torch.ones(2, nk.MAX_HIDDEN + 1, device="cuda"), w)


@needs_cuda
@pytest.mark.gpu
def test_cuda_backward_is_deterministic():
    """Partial sums, no atomics: the same inputs give the same dgamma/dbeta bits."""
    t = {k: v.cuda() for k, v in _inputs(8192, 4096, (BF16, BF16, BF16), seed=0).items()}
    _, mu, rsigma = nk.fused_norm_forward(t["x"], t["weight"], None, True, EPS, False, BF16)
    args = (t["dy"], None, t["x"], t["weight"], mu, rsigma, False, True)
    first = nk.fused_norm_backward(*args)
    for _ in range(3):
        for a, b in zip(nk.fused_norm_backward(*args), first, strict=True):
            assert torch.equal(a, b)


@needs_cuda
@pytest.mark.gpu
def test_cuda_unaligned_inputs_give_the_same_bits():
    """A view at an odd offset (a compiled graph's buffer may be one) runs the kernel an
    aligned copy runs: the same row sums, the same bits."""
    t = {k: v.cuda() for k, v in _inputs(64, 4096, (BF16, BF16, BF16), seed=1).items()}

    def unaligned(v: torch.Tensor) -> torch.Tensor:
        flat = torch.empty(v.numel() + 1, dtype=v.dtype, device=v.device)
        view = flat[1:].view(v.shape)
        view.copy_(v)
        assert view.data_ptr() % 16 != 0
        return view

    def outputs(k: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        y, mu, rsigma = nk.fused_norm_forward(k["x"], k["weight"], k["bias"], True, EPS, True, BF16)
        grads = nk.fused_norm_backward(
            k["dy"], k["dy_extra"], k["x"], k["weight"], mu, rsigma, True, True
        )
        return (y, mu, rsigma, *grads)

    moved = outputs({k: unaligned(v) for k, v in t.items()})
    for got, want in zip(moved, outputs(t), strict=True):
        assert torch.equal(got, want)


def _eligible_on_the_interpreter(x, *tensors, out_dtype=F32) -> bool:
    """``norm_kernels.eligible`` with CPU tensors allowed (under the interpreter)."""
    from transformer_engine_ops.runtime import _torch_private

    return (
        out_dtype in nk.DTYPES
        and all(
            type(t) in nk._PLAIN_TENSORS and t.dtype in nk.DTYPES
            for t in (x, *tensors)
            if t is not None
        )
        and x.dim() == 2
        and 1 <= x.shape[1] <= nk.MAX_HIDDEN
        and not torch.compiler.is_compiling()
        and _torch_private.current_dispatch_mode() is None
    )


# (family_cases kind, its keyword arguments)
MODULES = [
    ("layernorm", {}),
    ("rmsnorm", {"zero_centered_gamma": True}),
    ("layernorm_linear", {"normalization": "RMSNorm"}),
    ("layernorm_mlp", {"normalization": "RMSNorm", "activation": "swiglu"}),
]


def run_module_cases(backends: list[str], modules=MODULES) -> list[str]:
    """The norm modules on the CPU with the interpreted kernels in place of the
    reference: compiled equals eager bit for bit, and the kernels ran in both, once
    each way per step (the failures)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "modules"))
    from family_cases import make, make_input
    from module_cases import cloned, step

    nk.eligible = _eligible_on_the_interpreter
    calls = []
    forward, backward = nk.fused_norm_forward, nk.fused_norm_backward
    nk.fused_norm_forward = lambda *a: calls.append("forward") or forward(*a)
    nk.fused_norm_backward = lambda *a: calls.append("backward") or backward(*a)
    failures = []
    for backend in backends:
        for kind, kwargs in modules:
            module, x = make(kind, **kwargs), make_input()
            del calls[:]
            eager = cloned(step(module, x, "bf16"))
            compiled = torch.compile(module, fullgraph=True, backend=backend)
            got = cloned(step(compiled, x, "bf16"))
            if calls != ["forward", "backward"] * 2:
                failures.append(f"{backend} {kind}: kernel calls {calls}")
            for what, a, b in zip(("output", "input grad"), got, eager, strict=False):
                if not torch.equal(a, b):
                    failures.append(f"{backend} {kind}: {what} differs")
            for i, (a, b) in enumerate(zip(got[2], eager[2], strict=True)):
                if not torch.equal(a, b):
                    failures.append(f"{backend} {kind}: grad {i} differs")
    return failures


@needs_triton
@pytest.mark.slow
def test_compiled_modules_run_the_interpreted_kernels_bitwise():
    """The integration the gpu tests check on CUDA, on the CPU: the kernels made
    eligible for CPU tensors under the interpreter, compiled norm modules (an op node
    with aot_eager, the norm pieces in a lowered Inductor graph) run them as eager
    does."""
    out = _run_in_a_fresh_interpreter(
        "failures = t.run_module_cases(['aot_eager', 'inductor'])\n"
        "print('\\n'.join(failures)); sys.exit(1 if failures else 0)\n"
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
