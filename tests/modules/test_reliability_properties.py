"""Property test of ``Linear`` over shapes x recipe x compile mode x grad mode.

For every drawn case (leading dims including 0, 1 and non-multiples of the block sizes;
in/out features including 1 and non-multiples of 16/32/128), either

- eager succeeds, the compiled module (``aot_eager``, ``fullgraph=True``, static and
  ``dynamic=True``) gives the same output and gradients bit for bit, and the eager
  result lies within the format's documented error bound of the fp32 reference
  (``docs/quantization.md``: elementwise round-trip bounds, combined through the GEMM
  bound ``Ea |B| + |A| Eb + Ea Eb``, plus bf16 rounding of the result), or
- eager raises, and each compiled mode raises the same exception type with the same
  message (dynamo may wrap it; the original is found on the exception chain).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from module_cases import RECIPES

from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.modules.linear import Linear

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the tests namespace package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.quantization.quant_cases import error_bound  # noqa: E402

AOT = "aot_eager"
MODES = ("compiled", "compiled_dynamic")
BF16_HALF_ULP = 2.0**-8  # relative rounding of a bf16 result
FP32_ACCUMULATION = 2.0**-20  # relative to sum |a||b| (K <= a few hundred terms)

# Sizes around the block sizes: 16 (NVFP4), 32 (MXFP8), 128 (FP8 block). Half the cases
# are block-aligned (M and the features multiples of 32), so every format also takes some.
LEADING = st.sampled_from([0, 1, 2, 3, 7, 16, 32, 33])
FEATURES = st.sampled_from([1, 2, 3, 16, 17, 32, 33, 64, 130])
ALIGNED_LEADING = st.sampled_from([(32,), (1, 32), (2, 16), (0,), (64,), (0, 3)])
ALIGNED_FEATURES = st.sampled_from([32, 64, 96])
LEADING_SLOW = st.sampled_from([0, 1, 2, 3, 5, 7, 15, 16, 17, 31, 32, 33, 64, 96, 129])
FEATURES_SLOW = st.sampled_from([1, 2, 3, 5, 15, 16, 17, 31, 32, 33, 48, 64, 96, 128, 129, 160])
ALIGNED_FEATURES_SLOW = st.sampled_from([32, 64, 96, 128, 160, 256])


def _cases(
    leading: st.SearchStrategy[int],
    features: st.SearchStrategy[int],
    aligned_features: st.SearchStrategy[int],
) -> Any:
    def case(aligned: bool) -> Any:
        return st.fixed_dictionaries(
            {
                "leading": ALIGNED_LEADING
                if aligned
                else st.lists(leading, min_size=0, max_size=2).map(tuple),
                "in_features": aligned_features if aligned else features,
                "out_features": aligned_features if aligned else features,
                "bias": st.booleans(),
                "grad": st.booleans(),
                "seed": st.integers(0, 2**16),
            }
        )

    return st.booleans().flatmap(case)


def _quantizers(recipe: str) -> dict[str, Any] | None:
    factory = RECIPES[recipe]
    if factory is None:
        return None
    made = factory()
    return {role: made.make_quantizer(role) for role in ("input", "weight", "grad_output")}


def _run(module: Any, recipe: str, x: torch.Tensor, dy: torch.Tensor, grad: bool) -> Any:
    """(output, input grad, weight grad, bias grad) of one call; grads None without grad."""
    for p in module.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(grad)
    factory = RECIPES[recipe]
    with torch.set_grad_enabled(grad):
        if factory is None:
            y = module(x)
        else:
            with autocast(recipe=factory()):
                y = module(x)
    if not grad:
        assert not y.requires_grad
        return y.detach(), None, None, None
    y.backward(dy)  # outside autocast, as usual
    inner = getattr(module, "_orig_mod", module)
    bias_grad = inner.bias.grad if inner.bias is not None else None
    return y.detach(), x.grad, inner.weight.grad, bias_grad


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the property compares whatever is raised
        return "raised", exc


def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        chain.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "inner_exception", None)]
    return chain


def _assert_same_error(eager: BaseException, compiled: Any, mode: str) -> None:
    assert isinstance(compiled, BaseException), (
        f"{mode}: eager raised {type(eager).__name__}: {eager}, but {mode} succeeded"
    )
    for e in _exception_chain(compiled):
        if type(e) is type(eager) and str(e) == str(eager):
            return
    raise AssertionError(
        f"{mode} raised a different error than eager:\n  eager: {type(eager).__name__}: "
        f"{eager}\n  {mode}: {type(compiled).__name__}: {str(compiled)[:800]}"
    )


def _assert_bitwise(got: Any, want: Any, mode: str) -> None:
    for name, a, b in zip(
        ("output", "input grad", "weight grad", "bias grad"), got, want, strict=True
    ):
        if b is None:
            assert a is None, f"{mode}: {name} is set, eager has none"
            continue
        assert a is not None, f"{mode}: no {name}"
        assert a.shape == b.shape and a.dtype == b.dtype, f"{mode}: {name} metadata differs"
        assert torch.equal(a, b), f"{mode}: {name} differs from eager"


def _gemm_bound(a, b, ea, eb):
    """Bound on |op(A_q) @ op(B_q) - A @ B| for elementwise operand bounds (fp32)."""
    abs_a, abs_b = a.abs(), b.abs()
    return ea @ abs_b + abs_a @ eb + ea @ eb + FP32_ACCUMULATION * (abs_a @ abs_b) + 1e-30


def _bound(q: Any, role: str, t: torch.Tensor) -> torch.Tensor:
    if q is None or t.numel() == 0:
        return torch.zeros_like(t, dtype=torch.float32)
    return error_bound(q[role], t)


def _assert_within_bound(result, module, recipe, x, dy, grad) -> None:
    """The eager result against the fp32 reference, within the documented bound."""
    q = _quantizers(recipe)
    w = module.weight.detach().float()
    x2 = x.float().reshape(-1, w.shape[1])
    dy2 = dy.float().reshape(-1, w.shape[0])
    ex, ew, edy = _bound(q, "input", x2), _bound(q, "weight", w), _bound(q, "grad_output", dy2)

    def check(name, got, ref, gemm_bound):
        bound = gemm_bound + BF16_HALF_ULP * (ref.abs() + gemm_bound)
        err = (got.float().reshape(ref.shape) - ref).abs()
        assert bool((err <= bound).all()), (
            f"{recipe}: {name} exceeds the format bound by "
            f"{float((err - bound).max()):.3g} (max error {float(err.max()):.3g})"
        )

    y_ref = x2 @ w.T
    if module.bias is not None:
        y_ref = y_ref + module.bias.detach().float()
    check("output", result[0], y_ref, _gemm_bound(x2, w.T, ex, ew.T))
    if grad:
        check("input grad", result[1], dy2 @ w, _gemm_bound(dy2, w, edy, ew))
        check("weight grad", result[2], dy2.T @ x2, _gemm_bound(dy2.T, x2, edy.T, ex))
        if module.bias is not None:
            bias_ref = dy2.sum(0)
            check("bias grad", result[3], bias_ref, FP32_ACCUMULATION * dy2.abs().sum(0))


def _check_case(recipe: str, case: dict[str, Any]) -> None:
    torch._dynamo.reset()  # no recompile limit or cached graph carries over between examples
    gen = torch.Generator().manual_seed(case["seed"])
    shape = (*case["leading"], case["in_features"])
    out_shape = (*case["leading"], case["out_features"])
    x = (torch.randn(shape, generator=gen) * 2.0).to(torch.bfloat16)
    dy = torch.randn(out_shape, generator=gen).to(torch.bfloat16)
    torch.manual_seed(case["seed"])
    module = Linear(
        case["in_features"], case["out_features"], bias=case["bias"], params_dtype=torch.bfloat16
    )
    grad = case["grad"]
    status, eager = _outcome(lambda: _run(module, recipe, x, dy, grad))
    compiled = {
        "compiled": torch.compile(module, fullgraph=True, backend=AOT),
        "compiled_dynamic": torch.compile(module, fullgraph=True, backend=AOT, dynamic=True),
    }
    for mode in MODES:
        torch._dynamo.reset()
        got_status, got = _outcome(lambda m=mode: _run(compiled[m], recipe, x, dy, grad))
        if status == "raised":
            _assert_same_error(eager, got, mode)
        else:
            assert got_status == "ok", f"{mode} raised where eager succeeded: {got!r}"[:1000]
            _assert_bitwise(got, eager, mode)
    if status == "ok":
        _assert_within_bound(eager, module, recipe, x, dy, grad)


@pytest.mark.parametrize("recipe", list(RECIPES))
@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(case=_cases(LEADING, FEATURES, ALIGNED_FEATURES))
def test_compiled_linear_equals_eager_within_the_format_bound_or_both_raise(recipe, case):
    _check_case(recipe, case)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(RECIPES))
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(case=_cases(LEADING_SLOW, FEATURES_SLOW, ALIGNED_FEATURES_SLOW))
def test_compiled_linear_property_over_more_shapes(recipe, case):
    _check_case(recipe, case)
