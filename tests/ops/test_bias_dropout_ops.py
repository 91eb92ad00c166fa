"""The generated ``bias_dropout`` ops: opcheck both ways, fake-vs-real layouts, the
masks and scales, gradients (float64 gradcheck on a fixed generator state), dtype
promotion, refusals."""

from __future__ import annotations

import pytest
import torch
from family_op_cases import check_fake_layouts, check_opcheck

from tests.bundles import fields_by_name
from transformer_engine_ops.generated import bias_dropout as g
from transformer_engine_ops.ops.bias_dropout import BiasDropoutFwdArgs

NAME = "bias_dropout"
FLAT = (g.flatten_bias_dropout_fwd_args, g.flatten_bias_dropout_bwd_args)


def _bundle(
    shape=(8, 2, 16),
    bias_shape=(16,),
    dtype=torch.bfloat16,
    bias_dtype=None,
    dropout=0.0,
    drop_path=0.0,
    training=True,
):
    gen = torch.Generator().manual_seed(3)
    inp = torch.randn(shape, generator=gen).to(dtype).requires_grad_(True)
    bias = None
    if bias_shape is not None:
        bias = torch.randn(bias_shape, generator=gen).to(bias_dtype or dtype)
        bias.requires_grad_(True)
    return BiasDropoutFwdArgs(
        inp=inp,
        bias=bias,
        inp_requires_grad=True,
        bias_requires_grad=bias is not None,
        dropout=dropout,
        drop_path=drop_path,
        training=training,
        is_grad_enabled=True,
    )


def _call(fwd: BiasDropoutFwdArgs, **changes: object) -> torch.Tensor:
    return g.call_bias_dropout(**{**fields_by_name(fwd), **changes})[0]


# opcheck calls the op several times and compares the results: deterministic cases only.
CASES = {
    "vector-bias": dict(),
    "full-shape-bias": dict(bias_shape=(8, 2, 16)),
    "eval-with-dropout": dict(dropout=0.3, training=False),
    "fp32": dict(dtype=torch.float32),
    "promoted": dict(bias_dtype=torch.float32),
    "empty-batch": dict(shape=(8, 0, 16)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(case):
    check_opcheck(g, NAME, *FLAT, _bundle(**CASES[case]))


@pytest.mark.parametrize(
    "kwargs", [dict(dropout=0.25), dict(drop_path=0.5), dict(dropout=0.25, drop_path=0.5)]
)
def test_fake_layout_matches_real_when_drawing(kwargs):
    check_fake_layouts(g, NAME, *FLAT, _bundle(**kwargs))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_drop_path_of_one_drops_every_sample_to_zero(compiled):
    """TE's ``DropPath(1.0)`` divides by a keep probability of 0 (NaN); every sample
    dropped is a zero branch here, its gradients zero, eagerly and compiled."""
    fwd = _bundle(drop_path=1.0, dropout=0.25)

    def f(inp, bias):
        return _call(fwd, inp=inp, bias=bias)

    run = torch.compile(f, fullgraph=True) if compiled else f
    out = run(fwd.inp, fwd.bias)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.equal(fwd.inp.grad, torch.zeros_like(fwd.inp))
    assert torch.equal(fwd.bias.grad, torch.zeros_like(fwd.bias))


def test_bias_add_rounds_once_in_the_inputs_dtype():
    fwd = _bundle()
    assert torch.equal(_call(fwd), fwd.inp.detach() + fwd.bias.detach())


def test_promotion_follows_torch_and_gradients_keep_each_inputs_dtype():
    fwd = _bundle(bias_dtype=torch.float32)
    out = _call(fwd)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert fwd.inp.grad.dtype == torch.bfloat16 and fwd.bias.grad.dtype == torch.float32
    assert torch.equal(fwd.bias.grad, torch.full((16,), 16.0))


def test_same_generator_state_draws_the_same_masks():
    fwd = _bundle(dropout=0.3, drop_path=0.25, shape=(64, 4, 32), bias_shape=(32,))
    torch.manual_seed(7)
    a = _call(fwd)
    torch.manual_seed(7)
    b = _call(fwd)
    torch.manual_seed(8)
    c = _call(fwd)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_dropout_zeroes_about_p_and_scales_the_rest():
    fwd = _bundle(shape=(256, 4, 64), bias_shape=None, dtype=torch.float32, dropout=0.3)
    torch.manual_seed(0)
    out = _call(fwd)
    kept = out != 0
    assert abs(1 - kept.float().mean().item() - 0.3) < 0.01
    torch.testing.assert_close(out[kept], fwd.inp.detach()[kept] / 0.7)


def test_drop_path_drops_whole_samples():
    fwd = _bundle(shape=(512, 3, 8), bias_shape=None, dtype=torch.float32, drop_path=0.5)
    torch.manual_seed(0)
    out = _call(fwd)
    per_sample = (out != 0).flatten(1)
    assert bool((per_sample.all(1) | ~per_sample.any(1)).all())  # all or nothing
    assert 0.4 < per_sample.all(1).float().mean().item() < 0.6
    kept = per_sample.all(1)
    torch.testing.assert_close(out[kept], fwd.inp.detach()[kept] / 0.5)


@pytest.mark.parametrize(
    "kwargs",
    [dict(dropout=0.3), dict(drop_path=0.4), dict(dropout=0.2, drop_path=0.3), dict()],
)
def test_gradcheck_float64_on_a_fixed_generator_state(kwargs):
    fwd = _bundle(shape=(6, 2, 5), bias_shape=(5,), dtype=torch.float64, **kwargs)

    def f(inp, bias):
        torch.manual_seed(11)  # the same masks on every evaluation
        return _call(fwd, inp=inp, bias=bias)

    assert torch.autograd.gradcheck(f, (fwd.inp.detach().requires_grad_(), fwd.bias))


def test_without_randomness_or_bias_the_output_is_a_fresh_tensor():
    fwd = _bundle(bias_shape=None, training=False, dropout=0.5)
    out = _call(fwd)
    assert torch.equal(out, fwd.inp.detach()) and out.data_ptr() != fwd.inp.data_ptr()


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(dropout=1.5), r"BiasDropoutFwdArgs\.dropout: a probability"),
        (dict(drop_path=-0.1), r"BiasDropoutFwdArgs\.drop_path: a probability"),
        (dict(drop_path=1.5), r"BiasDropoutFwdArgs\.drop_path: a probability"),
        (dict(bias=torch.zeros(15)), r"BiasDropoutFwdArgs\.bias: shape \(15,\) does not"),
        (dict(bias=torch.zeros(2, 8, 2, 16)), r"BiasDropoutFwdArgs\.bias: .* would grow"),
    ],
)
def test_bad_fields_are_named(changes, match):
    fwd = _bundle()
    with pytest.raises(ValueError, match=match):
        g.bias_dropout_fwd(*FLAT[0](BiasDropoutFwdArgs(**{**fields_by_name(fwd), **changes})))
