"""The generated ``rope`` ops: opcheck both ways, fake-vs-real layouts, the
backward against autograd of the same arithmetic, float64 gradcheck, refusals."""

from __future__ import annotations

import pytest
import torch
from family_op_cases import check_fake_layouts, check_opcheck

from tests.bundles import fields_by_name
from transformer_engine_ops.generated import rope as g
from transformer_engine_ops.ops.rope import RopeFwdArgs, rotate

NAME = "rope"
FLAT = (g.flatten_rope_fwd_args, g.flatten_rope_bwd_args)


def _angles(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return 3.0 * torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _bundle(
    t_shape=(6, 2, 4, 16),
    angle_shape=(6, 1, 1, 16),
    dtype=torch.bfloat16,
    interleaved=False,
    fused=True,
    requires_grad=True,
):
    t = torch.randn(t_shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    return RopeFwdArgs(
        t=t.requires_grad_(requires_grad),
        angles=_angles(angle_shape),
        t_requires_grad=requires_grad,
        interleaved=interleaved,
        fused=fused,
        is_grad_enabled=True,
    )


CASES = {
    "sbhd-fused": dict(),
    "sbhd-unfused": dict(fused=False),
    "interleaved": dict(interleaved=True),
    "partial": dict(angle_shape=(6, 1, 1, 8)),
    "partial-unfused-interleaved": dict(angle_shape=(6, 1, 1, 8), fused=False, interleaved=True),
    "per-sequence-offsets": dict(angle_shape=(6, 2, 1, 16)),
    "thd": dict(t_shape=(9, 4, 16), angle_shape=(9, 1, 16)),
    "fp32": dict(dtype=torch.float32),
    "empty-batch": dict(t_shape=(6, 0, 4, 16)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(case):
    check_opcheck(g, NAME, *FLAT, _bundle(**CASES[case]))


def test_opcheck_without_grad():
    fwd = _bundle(requires_grad=False)
    torch.library.opcheck(g.rope_fwd, FLAT[0](fwd))


@pytest.mark.parametrize("case", ["sbhd-fused", "partial", "thd"])
def test_fake_layout_matches_real(case):
    check_fake_layouts(g, NAME, *FLAT, _bundle(**CASES[case]))


@pytest.mark.parametrize("case", list(CASES))
def test_op_equals_autograd_of_the_same_arithmetic_bitwise(case):
    """The op's forward is ``rotate``; its hand-written backward (the transposed
    rotation) gives the gradient autograd derives from ``rotate``, to the bit."""
    fwd = _bundle(**CASES[case])
    t = fwd.t.detach().requires_grad_(True)
    ref = rotate(t, fwd.angles, fwd.interleaved, fwd.fused)
    cot = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5)).to(ref.dtype)
    ref.backward(cot)
    t2 = fwd.t.detach().requires_grad_(True)
    got = g.call_rope(**{**fields_by_name(fwd), "t": t2})[0]
    got.backward(cot)
    assert torch.equal(got, ref)
    assert torch.equal(t2.grad, t.grad)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("interleaved", [True, False])
def test_gradcheck_float64(fused, interleaved):
    angles = _angles((5, 1, 1, 8)).double()

    def f(t):
        return g.call_rope(
            t=t,
            angles=angles,
            t_requires_grad=True,
            interleaved=interleaved,
            fused=fused,
            is_grad_enabled=True,
        )[0]

    t = torch.randn(5, 2, 3, 12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (t,))


def test_rotation_preserves_the_norm_of_each_head():
    """With TE's table (each angle twice: ``cat(f, f)``) every pair turns rigidly."""
    fwd = _bundle(dtype=torch.float64)
    half = fwd.angles[..., :8]
    fwd.angles = torch.cat((half, half), dim=-1)
    out = g.call_rope(**fields_by_name(fwd))[0]
    torch.testing.assert_close(out.norm(dim=-1), fwd.t.detach().norm(dim=-1))


@pytest.mark.parametrize(
    "angle_shape, match",
    [
        ((6, 1, 1, 7), "must be even"),
        ((6, 1, 1, 18), "at most t's last dim"),
        ((5, 1, 1, 16), "do not broadcast"),
        ((6, 1, 16), "do not broadcast"),
    ],
)
def test_bad_angles_are_named(angle_shape, match):
    fwd = _bundle(angle_shape=angle_shape)
    with pytest.raises(ValueError, match=f"RopeFwdArgs: .*{match}"):
        g.rope_fwd(*FLAT[0](fwd))
