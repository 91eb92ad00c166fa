"""``L2Normalization`` (TE's parameter-free query/key norm) through the generated
``l2normalization`` op: TE's formulas bit for bit, float64 gradients, the dtype rules,
no tokens, and compiled (Inductor) equal to eager."""

from __future__ import annotations

import pytest
import torch
from inductor_widths import SCALAR, inductor_width
from module_cases import graph_breaks

from transformer_engine_ops.modules.l2normalization import L2Normalization


def _te_forward(x: torch.Tensor, eps: float) -> torch.Tensor:
    """TE's ``l2normalization_fwd_fused_`` written out in torch ops."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(dim=-1, keepdim=True) + eps)).to(x.dtype)


def _te_backward(dy: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """TE's ``l2normalization_backward_fused_`` written out in torch ops."""
    xf, dyf = x.float(), dy.float()
    rsqrt_norm = torch.rsqrt(xf.pow(2).sum(dim=-1, keepdim=True) + eps)
    x_dy = (xf * dyf).sum(dim=-1, keepdim=True)
    norm_squared = xf.pow(2).sum(dim=-1, keepdim=True) + eps
    return (rsqrt_norm * (dyf - xf * x_dy / norm_squared)).to(x.dtype)


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_forward_and_backward_are_tes_formulas(dtype: torch.dtype, eps: float) -> None:
    torch.manual_seed(0)
    x = torch.randn(7, 3, 4, 64).to(dtype).requires_grad_()
    dy = torch.randn(7, 3, 4, 64).to(dtype)
    y = L2Normalization(eps=eps)(x)
    assert y.dtype == dtype
    assert torch.equal(y, _te_forward(x.detach(), eps))
    y.backward(dy)
    assert x.grad.dtype == dtype
    assert torch.equal(x.grad, _te_backward(dy, x.detach(), eps))


def test_float64_gradcheck_and_unit_norm() -> None:
    torch.manual_seed(0)
    norm = L2Normalization(eps=0.0)
    x = torch.randn(5, 2, 16, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(norm(x).norm(dim=-1), torch.ones(5, 2, dtype=torch.float64))
    assert torch.autograd.gradcheck(L2Normalization(eps=1e-3), (x,))


def test_torch_autocast_keeps_the_input_dtype() -> None:
    """TE runs the norm with autocast off: an fp32 input stays fp32, bit for bit."""
    x = torch.randn(4, 32)
    norm = L2Normalization()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
    assert y.dtype == torch.float32 and torch.equal(y, norm(x))


def test_no_tokens_and_no_grad() -> None:
    x = torch.randn(0, 2, 16, requires_grad=True)
    y = L2Normalization()(x)
    y.sum().backward()
    assert y.shape == (0, 2, 16) and x.grad.shape == (0, 2, 16)
    with torch.no_grad():
        assert torch.equal(L2Normalization()(x[:0]), x[:0].detach())


def test_tes_keywords_and_bad_input() -> None:
    norm = L2Normalization(eps=1e-5, seq_length=128, micro_batch_size=2)
    assert (norm.eps, norm.seq_length, norm.micro_batch_size) == (1e-5, 128, 2)
    assert list(norm.parameters()) == []
    with pytest.raises(TypeError):
        L2Normalization(1e-5)  # keyword-only, as TE's
    with pytest.raises(TypeError, match="L2Normalization: input of dtype torch.int64"):
        norm(torch.ones(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="L2NormalizationFwdArgs.inp: a 0-dim tensor"):
        norm(torch.tensor(1.0))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_inductor_equals_eager_bitwise(dtype: torch.dtype) -> None:
    """Default Inductor, scalar code against ATen's vectorized sums: the forward and
    backward sums stay inside the op, so the output and gradient are eager's bits."""
    torch.manual_seed(0)
    norm = L2Normalization()

    def step(fn: object, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = x.clone().requires_grad_()
        y = fn(x * 2.0)  # a producer for Inductor to fuse around the op
        (y * dy).sum().backward()
        return y.detach(), x.grad

    with inductor_width(SCALAR):
        compiled = torch.compile(norm, fullgraph=True)
        for rows in (8, 24):
            x = torch.randn(rows, 4, 96).to(dtype)
            dy = torch.randn(rows, 4, 96).to(dtype)
            eager, got = step(norm, x, dy), step(compiled, x, dy)
            assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    assert graph_breaks() == 0
