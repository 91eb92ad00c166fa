"""Fused activation kernels (``kernels/activation_kernels.py``): every LayerNormMLP
activation, forward and backward, against the float64 reference of its formula.

Interpreter tests run the Triton kernels on CPU tensors under ``TRITON_INTERPRET=1`` in
a fresh process (skipped when triton is not importable); ``gpu`` tests run the compiled
kernels on CUDA. The bound per element is one rounding of the output dtype plus 16 fp32
units of the formula's magnitude (``(1 + |a|)^2 (1 + |b|) (1 + |dy|)``; the kernels stay
within about one): a wrong term or a wrong half is off by the magnitude itself. NaN and
Inf land where the fp32 reference (what CUDA ran before the kernels) puts them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

from tests.triton_interpreter import assert_interpreted
from transformer_engine_ops.kernels import activation_kernels as ak
from transformer_engine_ops.ops.layernorm_mlp import (
    ACTIVATIONS,
    activation_backward,
    activation_forward,
)

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
# clamped_swiglu's (limit, alpha, offset), not TE's defaults, so each one is exercised.
PARAMS = (0.5, 1.5, 0.25)
# (input dtype, output dtype): fc1's output and the activation dtype, and mixed ones.
DTYPES = [(BF16, BF16), (F32, F32), (F16, F32), (F32, BF16)]
# (leading dims, output columns): two column blocks with a partial one, one column, no
# rows, no columns.
SHAPES = [((2, 3), ak.BLOCK + 6), ((5,), 1), ((0,), 7), ((4,), 0)]
SPECIALS = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e4, -1e4, 88.8, -88.8]
SPECIALS += [1e-40, -1e-40, 3e38, -3e38, 0.5, 7.0, -7.0]


def _inputs(name: str, lead: tuple[int, ...], cols: int, dtype: torch.dtype, seed: int):
    """(x, dy) for an activation with ``cols`` output columns, x ~ N(0, 4^2)."""
    gen = torch.Generator().manual_seed(seed)
    width = 2 * cols if ak.CODES[name][1] else cols
    x = (torch.randn(*lead, width, generator=gen) * 4).to(dtype)
    dy = torch.randn(*lead, cols, generator=gen).to(dtype)
    return x, dy


def _magnitude(name: str, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula's magnitude per output element and per input-gradient element."""
    xd, dyd = x.double().abs(), dy.double().abs()
    if ak.CODES[name][1]:
        a, b = xd.chunk(2, dim=-1)
        m = (1 + a) ** 2 * (1 + b)
        md = m * (1 + dyd)
        return m, torch.cat([md, md], dim=-1)
    m = (1 + xd) ** 2
    return m, m * (1 + dyd)


def _within(got: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor) -> Optional[str]:
    if got.shape != ref.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    eps = torch.finfo(got.dtype).eps if got.dtype != F32 else 0.0
    err = (got.double() - ref).abs()
    bound = eps * ref.abs() + 16 * 2.0**-24 * magnitude
    if not (err <= bound).all():
        i = int((err - bound).argmax())
        return f"off by {err.view(-1)[i].item():.3g} > {bound.view(-1)[i].item():.3g} at {i}"
    return None


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a non-contiguous view (every other row of a taller tensor)."""
    tall = torch.zeros((t.shape[0] * 2, *t.shape[1:]), dtype=t.dtype, device=t.device)
    tall[::2] = t
    return tall[::2]


def check_against_float64(
    name: str, in_dtype, out_dtype, lead, cols, device, strided: bool = False
) -> Optional[str]:
    """The kernels' forward and backward of random inputs (non-contiguous ones with
    ``strided``) against the float64 reference (None, or what is wrong)."""
    x, dy = _inputs(name, lead, cols, in_dtype, seed=len(name) + cols)
    xk, dyk = x.to(device), dy.to(device)
    if strided:
        xk, dyk = _strided(xk), _strided(dyk)
        assert not xk.is_contiguous() and not dyk.is_contiguous()
    y = ak.fused_activation_forward(name, xk, out_dtype, *PARAMS).cpu()
    dx = ak.fused_activation_backward(name, dyk, xk, out_dtype, *PARAMS).cpu()
    if y.dtype != out_dtype or dx.dtype != out_dtype:
        return f"dtypes {y.dtype}, {dx.dtype}; expected {out_dtype}"
    ref_y = activation_forward(name, x.double(), torch.float64, *PARAMS)
    ref_dx = activation_backward(name, dy.double(), x.double(), torch.float64, *PARAMS)
    m_y, m_dx = _magnitude(name, x, dy)
    wrong = _within(y, ref_y, m_y)
    if wrong:
        return f"forward {wrong}"
    wrong = _within(dx, ref_dx, m_dx)
    return f"backward {wrong}" if wrong else None


def check_special_values(name: str, device) -> Optional[str]:
    """NaN, +-Inf, zeros, overflowing and subnormal inputs (every pair, gated): NaN and
    Inf where the fp32 reference has them, the same Infs."""
    s = torch.tensor(SPECIALS)
    x = torch.cartesian_prod(s, s) if ak.CODES[name][1] else s[:, None]
    dy = torch.full((x.shape[0], 1), 1.5)
    got = (
        ak.fused_activation_forward(name, x.to(device), F32, *PARAMS).cpu(),
        ak.fused_activation_backward(name, dy.to(device), x.to(device), F32, *PARAMS).cpu(),
    )
    ref = (
        activation_forward(name, x, F32, *PARAMS),
        activation_backward(name, dy, x, F32, *PARAMS),
    )
    for what, g, r in zip(("forward", "backward"), got, ref, strict=True):
        differs = (g.isnan() != r.isnan()) | (g.isinf() != r.isinf()) | (g.isinf() & (g != r))
        if differs.any():
            row = int(differs.any(-1).nonzero()[0])
            return f"{what} at x={x[row].tolist()}: {g[row].tolist()}, fp32 ref {r[row].tolist()}"
    return None


def run_cases(device: str) -> tuple[int, list[str]]:
    """Every activation x dtype pair x shape, non-contiguous inputs and the special
    values: (cases, failures)."""
    cases, failures = 0, []
    for name in ak.CODES:
        for in_dtype, out_dtype in DTYPES:
            for lead, cols in SHAPES:
                cases += 1
                wrong = check_against_float64(name, in_dtype, out_dtype, lead, cols, device)
                if wrong:
                    failures.append(f"{name} {in_dtype}->{out_dtype} {lead}x{cols}: {wrong}")
        cases += 1
        wrong = check_against_float64(name, BF16, BF16, (3, 5), 33, device, strided=True)
        if wrong:
            failures.append(f"{name} non-contiguous: {wrong}")
        cases += 1
        wrong = check_special_values(name, device)
        if wrong:
            failures.append(f"{name} special values: {wrong}")
    return cases, failures


def test_every_activation_has_a_kernel():
    assert sorted(ak.CODES) == sorted(ACTIVATIONS)


@needs_triton
@pytest.mark.slow
def test_interpreted_kernels_match_the_float64_reference():
    """In a fresh interpreter (Triton 3.9's interpreter refuses nested @jit helpers
    once torch.compile has run in the process)."""
    out = assert_interpreted(__file__, "cases, failures = t.run_cases('cpu')", "cases")
    n = len(ak.CODES) * (len(DTYPES) * len(SHAPES) + 2)
    assert out.endswith(f"{n} cases\n")


def test_cpu_tensors_take_the_reference_ops():
    x = torch.randn(4, 8)
    assert not ak.eligible(F32, x)
    assert not ak.eligible(F32, x.to(torch.float64))


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        ak.fused_activation_forward("swiglu", torch.ones(2, 4), BF16)


def test_bad_arguments_are_named():
    x = torch.ones(2, 4)
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        ak.fused_activation_forward("swish", x, BF16)
    with pytest.raises(TypeError, match="out_dtype torch.float64"):
        ak.fused_activation_forward("gelu", x, torch.float64)
    with pytest.raises(TypeError, match="cannot take a torch.int32 tensor"):
        ak.fused_activation_forward("gelu", x.int(), F32)
    with pytest.raises(ValueError, match=r"x \(2, 5\) has an odd last dim"):
        ak.fused_activation_forward("swiglu", torch.ones(2, 5), F32)
    with pytest.raises(ValueError, match=r"dy \(2, 4\) does not fit x \(2, 4\) for swiglu"):
        ak.fused_activation_backward("swiglu", x, x, F32)
    with pytest.raises(ValueError, match=r"config=\(1000, 4\); expected \(columns per program"):
        ak.fused_activation_forward("gelu", x, F32, config=(1000, 4))


@needs_cuda
@pytest.mark.gpu
def test_cuda_kernels_match_the_float64_reference():
    cases, failures = run_cases("cuda")
    assert not failures, "\n".join(failures)
    assert cases == len(ak.CODES) * (len(DTYPES) * len(SHAPES) + 2)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["swiglu", "gelu"])
def test_cuda_kernels_at_the_llama_layer_shape(name):
    """fc1's output of the Llama-8B-sized layer (4096 tokens x 2 x 14336), bf16; rows
    past 65535 on the grid's first axis too."""
    for lead in ((4096,), (70000,)):
        cols = 14336 if lead == (4096,) else 72
        wrong = check_against_float64(name, BF16, BF16, lead, cols, "cuda")
        assert wrong is None, wrong


@needs_cuda
@pytest.mark.gpu
def test_cuda_tensors_take_the_kernels():
    x = torch.randn(4, 8, device="cuda", dtype=BF16)
    assert ak.eligible(BF16, x, x)
    assert not ak.eligible(torch.float64, x)
    assert not ak.eligible(BF16, x.double())


def _eligible_on_the_interpreter(out_dtype: torch.dtype, *tensors: torch.Tensor) -> bool:
    """``activation_kernels.eligible`` with CPU tensors allowed (under the interpreter)."""
    from transformer_engine_ops.runtime import _torch_private

    return (
        out_dtype in ak.DTYPES
        and all(type(t) is torch.Tensor and t.dtype in ak.DTYPES for t in tensors)
        and not torch.compiler.is_compiling()
        and _torch_private.current_dispatch_mode() is None
    )


def run_module_cases(backends: list[str], activations: list[str]) -> list[str]:
    """LayerNormMLP on the CPU with the interpreted kernels in place of the reference:
    compiled equals eager bit for bit, and the kernels ran in both (the failures)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "modules"))
    from family_cases import make, make_input
    from module_cases import cloned, step

    ak.eligible = _eligible_on_the_interpreter
    calls = []
    forward = ak.fused_activation_forward
    ak.fused_activation_forward = lambda *a: calls.append(a[0]) or forward(*a)
    failures = []
    for backend in backends:
        for activation in activations:
            module, x = make("layernorm_mlp", activation=activation), make_input()
            del calls[:]
            eager = cloned(step(module, x, "bf16"))
            compiled = torch.compile(module, fullgraph=True, backend=backend)
            got = cloned(step(compiled, x, "bf16"))
            if calls != [activation, activation]:
                failures.append(f"{backend} {activation}: kernel calls {calls}")
            for what, a, b in zip(("output", "input grad"), got, eager, strict=False):
                if not torch.equal(a, b):
                    failures.append(f"{backend} {activation}: {what} differs")
            for i, (a, b) in enumerate(zip(got[2], eager[2], strict=True)):
                if not torch.equal(a, b):
                    failures.append(f"{backend} {activation}: grad {i} differs")
    return failures


@needs_triton
@pytest.mark.slow
def test_compiled_module_runs_the_interpreted_kernels_bitwise():
    """The integration the gpu tests check on CUDA, on the CPU: the kernels made eligible
    for CPU tensors under the interpreter, a compiled LayerNormMLP (an op node with
    aot_eager, its exact pieces in a lowered Inductor graph) runs them as eager does."""
    checks = "failures = t.run_module_cases(['aot_eager', 'inductor'], ['swiglu', 'gelu'])"
    assert_interpreted(__file__, checks)
