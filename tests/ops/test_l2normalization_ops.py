"""The generated ``l2normalization`` ops: opcheck both ways, fake-vs-real layouts, what
the forward saves, and the backward against float64 autograd."""

from __future__ import annotations

import pytest
import torch
from family_op_cases import check_fake_layouts, check_opcheck

from tests.bundles import fields_by_name
from transformer_engine_ops.generated import l2normalization as g
from transformer_engine_ops.ops.l2normalization import (
    L2NormalizationFwdArgs,
    l2normalization_forward,
)

NAME = "l2normalization"
FLAT = (g.flatten_l2_normalization_fwd_args, g.flatten_l2_normalization_bwd_args)


def _bundle(shape=(6, 2, 4, 32), dtype=torch.bfloat16, requires_grad=True, eps=1e-6):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    return L2NormalizationFwdArgs(
        inp=x.requires_grad_(requires_grad),
        input_requires_grad=requires_grad,
        eps=eps,
        is_grad_enabled=True,
    )


CASES = {
    "bf16": dict(),
    "fp32": dict(dtype=torch.float32),
    "fp16-eps": dict(dtype=torch.float16, eps=1e-2),
    "thd": dict(shape=(9, 4, 32)),
    "no-tokens": dict(shape=(0, 2, 4, 32)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(case):
    check_opcheck(g, NAME, *FLAT, _bundle(**CASES[case]))


def test_opcheck_without_grad():
    torch.library.opcheck(g.l2normalization_fwd, FLAT[0](_bundle(requires_grad=False)))


@pytest.mark.parametrize("case", ["bf16", "thd", "no-tokens"])
def test_fake_layout_matches_real(case):
    check_fake_layouts(g, NAME, *FLAT, _bundle(**CASES[case]))


def test_forward_saves_one_fp32_rsqrt_per_row_only_for_a_backward():
    (out,), (rsqrt_norm,) = l2normalization_forward(_bundle())
    assert out.dtype == torch.bfloat16
    assert rsqrt_norm.shape == (6 * 2 * 4,) and rsqrt_norm.dtype == torch.float32
    assert l2normalization_forward(_bundle(requires_grad=False))[1] == (None,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_gradient_equals_float64_autograd(dtype):
    fwd = _bundle(dtype=dtype, eps=1e-3)
    x = fwd.inp.detach().double().requires_grad_(True)
    ref = x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-3)
    cot = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ref.backward(cot)
    got = g.call_l2normalization(**fields_by_name(fwd))[0]
    got.backward(cot.to(dtype))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got.double(), ref.detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(fwd.inp.grad.double(), x.grad, rtol=tol, atol=tol)
