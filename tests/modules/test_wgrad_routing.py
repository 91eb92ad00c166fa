"""TE's weight-gradient scheduling: ``fuse_wgrad_accumulation`` (the wgrad GEMM adds into
``weight.main_grad``) and ``delay_wgrad_compute`` (the GEMM waits for
``module.backward_dw()``), eagerly bitwise equal to the plain path under every recipe,
and run eagerly under torch.compile with a named reason."""

from __future__ import annotations

import warnings

import pytest
import torch
from module_cases import RECIPES, linear_call_bundle, recipe_context

import transformer_engine_ops as te
from transformer_engine_ops.runtime.fallback import EagerFallbackWarning, reset_warnings

FUSE_REASON = "fused wgrad accumulation into main_grad"
DELAY_REASON = "delayed wgrad compute"


KINDS = ["linear", "layernorm_linear", "layernorm_mlp", "grouped_linear"]
SPLITS = [32, 0, 32]  # GroupedLinear's rows per GEMM (one empty)


def _module(kind: str, dtype: torch.dtype, **kwargs: object) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "linear":
        return te.Linear(64, 32, params_dtype=dtype, **kwargs)
    if kind == "grouped_linear":
        return te.GroupedLinear(3, 64, 32, params_dtype=dtype, **kwargs)
    if kind == "layernorm_linear":
        module = te.LayerNormLinear(64, 32, params_dtype=dtype, **kwargs)
    else:
        module = te.LayerNormMLP(64, 128, params_dtype=dtype, **kwargs)
    with torch.no_grad():  # a norm that is not the identity
        module.layer_norm_weight.uniform_(0.5, 1.5)
        module.layer_norm_bias.uniform_(-0.5, 0.5)
    return module


def _weights(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The GEMM weights (their gradients are routed), then the biases (never routed)."""
    if isinstance(module, te.GroupedLinear):
        return module._weights()
    names = ("fc1_weight", "fc2_weight") if hasattr(module, "fc1_weight") else ("weight",)
    return [getattr(module, name) for name in names]


def _biases(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    if isinstance(module, te.GroupedLinear):
        return module._biases()
    names = ("fc1_bias", "fc2_bias") if hasattr(module, "fc1_bias") else ("bias",)
    return [getattr(module, name) for name in names]


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> None:
    assert (a is None) == (b is None)
    if a is not None:
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def _linear(dtype: torch.dtype, **kwargs: object) -> te.Linear:
    return _module("linear", dtype, **kwargs)


def _input(dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 32, 64, generator=gen).to(dtype).requires_grad_()


def _call(module: torch.nn.Module, x: torch.Tensor, **kwargs: object) -> torch.Tensor:
    if isinstance(module, te.GroupedLinear):
        return module(x, SPLITS, **kwargs)
    return module(x, **kwargs)


def _backward(
    module: torch.nn.Module, recipe: str, x: torch.Tensor, **kwargs: object
) -> torch.Tensor:
    with recipe_context(recipe):
        out = _call(module, x, **kwargs)
    out.float().pow(2).sum().backward()
    return out


def _with_main_grad(module: torch.nn.Module) -> torch.nn.Module:
    for weight in _weights(module):
        weight.main_grad = torch.zeros(weight.shape, dtype=torch.float32)
    return module


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("kind", KINDS)
def test_fused_main_grad_accumulates_the_plain_gradient(kind: str, recipe: str) -> None:
    """fp32: two microbatches' gradients land in main_grad, bitwise the plain path's
    accumulated ``weight.grad``; ``weight.grad`` stays None; input and bias gradients
    are the plain path's."""
    dtype = torch.float32
    plain = _module(kind, dtype)
    fused = _with_main_grad(_module(kind, dtype, fuse_wgrad_accumulation=True))
    for seed in (1, 2):
        xp, xf = _input(dtype, seed), _input(dtype, seed)
        torch.testing.assert_close(
            _backward(fused, recipe, xf), _backward(plain, recipe, xp), atol=0, rtol=0
        )
        torch.testing.assert_close(xf.grad, xp.grad, atol=0, rtol=0)
    for f, p in zip(_weights(fused), _weights(plain), strict=True):
        assert f.grad is None
        _same(f.main_grad, p.grad)
    for f, p in zip(_biases(fused), _biases(plain), strict=True):
        _same(f.grad, p.grad)


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("kind", KINDS)
def test_fused_bf16_gradient_is_the_unrounded_gemm(kind: str, recipe: str) -> None:
    """bf16 activations: the wgrad GEMM writes main_grad's fp32 (as TE's GEMM does), which
    rounds to the plain path's bf16 gradient."""
    dtype = torch.bfloat16
    plain = _module(kind, dtype)
    fused = _with_main_grad(_module(kind, dtype, fuse_wgrad_accumulation=True))
    _backward(plain, recipe, _input(dtype, 1))
    _backward(fused, recipe, _input(dtype, 1))
    for f, p in zip(_weights(fused), _weights(plain), strict=True):
        assert f.main_grad.dtype == torch.float32
        _same(f.main_grad.to(dtype), p.grad)


def test_grad_added_to_main_grad_gets_a_dummy_gradient() -> None:
    """Megatron's flag: set by the backward, and ``weight.grad`` is a zero dummy (TE
    returns an uninitialized one)."""
    fused = _with_main_grad(_linear(torch.float32, fuse_wgrad_accumulation=True))
    fused.weight.grad_added_to_main_grad = False
    _backward(fused, "bf16", _input(torch.float32, 1))
    assert fused.weight.grad_added_to_main_grad is True
    assert torch.equal(fused.weight.grad, torch.zeros_like(fused.weight))
    assert fused.weight.main_grad.abs().sum() > 0


@pytest.mark.parametrize("first, overwrite", [(True, False), (None, True)])
def test_first_microbatch_or_overwrite_main_grad_replaces_it(first, overwrite) -> None:
    """``is_first_microbatch=True`` or ``weight.overwrite_main_grad`` overwrite main_grad
    instead of adding to it, as TE's GEMM does (accumulate=False)."""
    dtype = torch.float32
    plain = _linear(dtype)
    fused = _linear(dtype, fuse_wgrad_accumulation=True)
    fused.weight.main_grad = torch.full((32, 64), 7.0)
    if overwrite:
        fused.weight.overwrite_main_grad = True
    _backward(plain, "bf16", _input(dtype, 1))
    _backward(fused, "bf16", _input(dtype, 1), is_first_microbatch=first)
    torch.testing.assert_close(fused.weight.main_grad, plain.weight.grad, atol=0, rtol=0)


def test_missing_main_grad_is_named() -> None:
    fused = _linear(torch.float32, fuse_wgrad_accumulation=True)
    with pytest.raises(RuntimeError, match="has no main_grad tensor"):
        _backward(fused, "bf16", _input(torch.float32, 1))


@pytest.mark.parametrize("fuse", [False, True], ids=["delay", "delay_fused"])
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("kind", KINDS)
def test_delayed_wgrad_runs_in_backward_dw(kind: str, recipe: str, fuse: bool) -> None:
    """The backward computes dgrad (and the bias gradient) only; each ``backward_dw()``
    runs one deferred GEMM, oldest first: two microbatches end bitwise on the plain
    path's gradients."""
    dtype = torch.float32
    plain = _module(kind, dtype)
    delayed = _module(kind, dtype, delay_wgrad_compute=True, fuse_wgrad_accumulation=fuse)
    if fuse:
        _with_main_grad(delayed)
    for seed in (1, 2):
        xp, xd = _input(dtype, seed), _input(dtype, seed)
        _backward(plain, recipe, xp)
        _backward(delayed, recipe, xd)
        torch.testing.assert_close(xd.grad, xp.grad, atol=0, rtol=0)
    for weight in _weights(delayed):
        assert weight.grad is None
        if fuse:
            assert not weight.main_grad.any()
    for d, p in zip(_biases(delayed), _biases(plain), strict=True):
        _same(d.grad, p.grad)
    delayed.backward_dw()
    delayed.backward_dw()
    delayed.backward_dw()  # nothing left: nothing runs
    for d, p in zip(_weights(delayed), _weights(plain), strict=True):
        _same(d.main_grad if fuse else d.grad, p.grad)


def test_backward_dw_without_delay_does_nothing() -> None:
    module = _linear(torch.float32)
    module.backward_dw()
    assert module.weight.grad is None


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"fuse_wgrad_accumulation": True}, FUSE_REASON),
        ({"delay_wgrad_compute": True}, DELAY_REASON),
    ],
    ids=["fuse", "delay"],
)
@pytest.mark.parametrize("kind", KINDS)
def test_compiled_call_runs_eagerly_with_the_reason(kind: str, kwargs, reason) -> None:
    """Under torch.compile the call runs eagerly (one warning naming the reason, eager's
    numbers); ``fullgraph=True`` raises naming it; under ``no_grad`` it compiles."""
    dtype = torch.float32
    eager = _with_main_grad(_module(kind, dtype, **kwargs))
    compiled_module = _with_main_grad(_module(kind, dtype, **kwargs))

    fp8_recipe = te.recipe.Float8CurrentScaling()

    def fn(module, x):
        with te.autocast(recipe=fp8_recipe):
            return _call(module, x)

    expected = fn(eager, _input(dtype, 1))
    expected.sum().backward()
    eager.backward_dw()
    torch._dynamo.reset()
    reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(fn, backend="aot_eager")(compiled_module, _input(dtype, 1))
    assert any(
        reason in str(w.message) for w in caught if issubclass(w.category, EagerFallbackWarning)
    )
    got.sum().backward()
    compiled_module.backward_dw()
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    for a, b in zip(compiled_module.parameters(), eager.parameters(), strict=True):
        _same(a.grad, b.grad)
    for a, b in zip(_weights(compiled_module), _weights(eager), strict=True):
        _same(a.main_grad, b.main_grad)

    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=reason):
        torch.compile(fn, backend="aot_eager", fullgraph=True)(compiled_module, _input(dtype, 1))

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(fn, backend="aot_eager", fullgraph=True)(
            compiled_module, _input(dtype, 1)
        )
        torch.testing.assert_close(out, fn(eager, _input(dtype, 1)), atol=0, rtol=0)


@pytest.mark.parametrize("flag", ["fuse_wgrad_accumulation", "delay_wgrad_compute"])
def test_the_ops_fake_refuses_a_wgrad_side_effect(flag: str) -> None:
    """The fake kernel (what a trace runs) refuses the flags, so a traced op call can
    never drop the main_grad write or the deferred GEMM."""
    from transformer_engine_ops.generated.linear import (
        flatten_linear_fwd_args,
        spec_linear_fwd_args,
    )
    from transformer_engine_ops.ops.linear import linear_forward_spec

    module = _linear(torch.float32, **{flag: True})
    args = linear_call_bundle(module, _input(torch.float32, 1))
    assert getattr(args, flag)
    spec_args = spec_linear_fwd_args(*flatten_linear_fwd_args(args))
    with pytest.raises(ValueError, match=f"LinearFwdArgs.{flag}: .* cannot be traced"):
        linear_forward_spec(spec_args)
