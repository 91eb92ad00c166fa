"""The fused RoPE kernel (``kernels/rope_kernels.py``): forward and transposed rotation
against the float64 reference of the ``rope`` op's arithmetic, both precisions, halves
and interleaved pairs, partial rotary, per-token and shared angles, strided inputs.

Interpreter tests run the Triton kernel on CPU tensors under ``TRITON_INTERPRET=1`` in a
fresh process (skipped when triton is not importable); ``gpu`` tests run it compiled on
CUDA, and check that a compiled ``TransformerLayer`` with rotary embeddings runs it and
equals eager bit for bit. The bound per element is two roundings of the data's dtype
plus a few fp32 units of the row's magnitude: a wrong partner, sign or angle is off by
the magnitude itself.
"""

from __future__ import annotations

import importlib.util
import subprocess
from typing import Optional

import pytest
import torch

from tests.triton_interpreter import run_interpreted
from transformer_engine_ops.kernels import rope_kernels as rk
from transformer_engine_ops.ops.rope import _rotate_half_transposed, rotate

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
# (t's shape, the angles' shape): sbhd with shared angles, partial rotary, thd, bshd,
# per-sequence offsets ([s, b, 1, d']), an odd head dim, an empty batch.
SHAPES = [
    ((5, 2, 3, 16), (5, 1, 1, 16)),
    ((5, 2, 3, 16), (5, 1, 1, 8)),
    ((7, 4, 12), (7, 1, 12)),
    ((3, 5, 2, 10), (1, 5, 1, 10)),
    ((4, 3, 2, 6), (4, 3, 1, 6)),
    ((4, 2, 3, 9), (4, 1, 1, 4)),
    ((4, 0, 3, 8), (4, 1, 1, 8)),
]


def _reference(
    t: torch.Tensor, angles: torch.Tensor, interleaved: bool, transpose: bool
) -> torch.Tensor:
    """The rotation (or its transpose) in float64."""
    if not transpose:
        return rotate(t.double(), angles.double(), interleaved, True)
    rot = angles.shape[-1]
    part, a = t[..., :rot].double(), angles.double()
    d = part * torch.cos(a) + _rotate_half_transposed(part * torch.sin(a), interleaved)
    return torch.cat((d, t[..., rot:].double()), dim=-1)


def check_case(
    tshape: tuple[int, ...],
    ashape: tuple[int, ...],
    dtype: torch.dtype,
    interleaved: bool,
    fused: bool,
    device: str,
    strided: bool = False,
) -> Optional[str]:
    gen = torch.Generator().manual_seed(sum(tshape) + len(ashape))
    full = torch.randn(*tshape[:-1], tshape[-1] + (3 if strided else 0), generator=gen)
    t = full[..., : tshape[-1]].to(dtype).to(device)  # strided: rows longer than d
    angles = (4 * torch.randn(ashape, generator=gen)).to(device)
    eps = torch.finfo(dtype).eps
    for transpose in (False, True):
        got = rk.fused_rope(t, angles, interleaved, fused, transpose)
        if got.shape != t.shape or got.dtype != dtype:
            return f"got {tuple(got.shape)} {got.dtype}"
        ref = _reference(t.cpu(), angles.cpu(), interleaved, transpose)
        scale = t.double().abs().amax(-1, keepdim=True).cpu() + 1
        err = (got.cpu().double() - ref).abs()
        bound = 2 * eps * ref.abs() + 8 * 2.0**-24 * scale + (0 if fused else 4 * eps * scale)
        if not (err <= bound).all():
            i = int((err - bound).argmax())
            return (
                f"{'backward' if transpose else 'forward'} {tshape} {ashape} {dtype} "
                f"interleaved={interleaved} fused={fused}: off by {err.view(-1)[i]:.3g} > "
                f"{bound.view(-1)[i]:.3g}"
            )
    return None


def run_cases(device: str) -> tuple[int, list[str]]:
    cases, failures = 0, []
    for dtype in (BF16, F32, F16):
        for interleaved in (False, True):
            for fused in (True, False):
                for tshape, ashape in SHAPES:
                    cases += 1
                    wrong = check_case(tshape, ashape, dtype, interleaved, fused, device)
                    if wrong:
                        failures.append(wrong)
        cases += 1
        wrong = check_case((6, 2, 4, 16), (6, 1, 1, 16), dtype, False, True, device, True)
        if wrong:
            failures.append(f"strided: {wrong}")
    return cases, failures


def _run_fresh(code: str) -> subprocess.CompletedProcess:
    return run_interpreted(code, __file__)


@needs_triton
@pytest.mark.slow
def test_interpreted_kernel_matches_the_float64_reference():
    out = _run_fresh(
        "cases, failures = t.run_cases('cpu')\n"
        "print(cases, 'cases'); print('\\n'.join(failures))\n"
        "sys.exit(1 if failures else 0)\n"
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{3 * (4 * len(SHAPES) + 1)} cases" in out.stdout


def test_cpu_tensors_take_the_torch_ops():
    t, angles = torch.randn(4, 2, 3, 8), torch.randn(4, 1, 1, 8)
    assert not rk.eligible(t, angles)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        rk.fused_rope(torch.ones(2, 3, 8), torch.ones(2, 1, 8), False, True, False)


@needs_cuda
@pytest.mark.gpu
def test_cuda_kernel_matches_the_float64_reference():
    cases, failures = run_cases("cuda")
    assert not failures, "\n".join(failures)
    assert cases == 3 * (4 * len(SHAPES) + 1)


@needs_cuda
@pytest.mark.gpu
def test_cuda_tensors_take_the_kernel():
    t = torch.randn(4, 2, 3, 8, device="cuda", dtype=BF16)
    angles = torch.randn(4, 1, 1, 8, device="cuda")
    assert rk.eligible(t, angles)
    assert not rk.eligible(t.double(), angles)
    assert not rk.eligible(t, torch.randn(4, 1, 3, 8, device="cuda"))  # per-head angles


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_layer_runs_the_kernel_bitwise(backend):
    """A TransformerLayer with rotary embeddings on CUDA: the kernel runs for queries and
    keys both ways, compiled equals eager bit for bit."""
    import transformer_engine_ops as te

    calls: list[bool] = []
    fused = rk.fused_rope
    rk.fused_rope = lambda *a: calls.append(a[-1]) or fused(*a)
    try:
        torch.manual_seed(0)
        layer = te.TransformerLayer(
            64,
            128,
            4,
            num_gqa_groups=2,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            params_dtype=BF16,
            device="cuda",
        )
        freqs = te.RotaryPositionEmbedding(16)(16).cuda()
        x = torch.randn(16, 2, 64, device="cuda", dtype=BF16)

        def step(model):
            xi = x.clone().requires_grad_(True)
            y = model(xi, rotary_pos_emb=freqs)
            y.float().pow(2).sum().backward()
            grads = [p.grad.clone() for p in layer.parameters()]
            layer.zero_grad(set_to_none=True)
            return [y.detach(), xi.grad, *grads]

        eager = step(layer)
        assert calls == [False, False, True, True]
        compiled = step(torch.compile(layer, fullgraph=True, backend=backend))
        for a, b in zip(compiled, eager, strict=True):
            assert torch.equal(a, b)
    finally:
        rk.fused_rope = fused
