"""TE's own compile tests of ``te.Linear`` (the seed PR's ``test_torch_compile.py``, its
te.Linear section, and the later ones TE 2.20 added), ported as a TE user would port
them: ``import transformer_engine_ops as te``, recipes from ``te.recipe``, on the CPU.
Each test's behaviour is the seed's; every departure from its text is listed in
docs/te.md ("The seed's te.Linear compile tests, ported"). The ``te.autocast`` inside
each compiled function is the pattern these tests exist for.

A test that fails for a feature this library lacks is a strict xfail naming it, so it
turns into a failure the day the feature lands.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import transformer_engine_ops as te
from transformer_engine_ops import recipe
from transformer_engine_ops.quantization import Float8Tensor
from transformer_engine_ops.runtime.fallback import EagerFallbackWarning

pytestmark = pytest.mark.slow  # every test compiles with Inductor, as the seed does


def nvfp4_row_scaled():
    nvfp4_recipe = recipe.NVFP4BlockScaling(
        disable_rht=True,
        disable_stochastic_rounding=True,
        disable_2d_quantization=True,
        row_scaled_activation=True,
        backward_override="dequantized",
    )
    nvfp4_recipe.fp4_quant_fwd_inp = recipe.QParams()
    nvfp4_recipe.fp4_quant_fwd_weight = recipe.QParams()
    nvfp4_recipe.fp4_quant_bwd_grad = recipe.QParams()
    return nvfp4_recipe


def nvfp4_4over6():
    nvfp4_recipe = recipe.NVFP4BlockScaling(
        disable_rht=True,
        disable_stochastic_rounding=True,
        nvfp4_4over6="all",
    )
    nvfp4_recipe.fp4_quant_fwd_inp = recipe.QParams()
    nvfp4_recipe.fp4_quant_fwd_weight = recipe.QParams(fp4_2d_quantization=True)
    nvfp4_recipe.fp4_quant_bwd_grad = recipe.QParams()
    return nvfp4_recipe


# The seed's ``_all_recipes`` (every recipe is available on the CPU here), as factories:
# the two NVFP4 variants change the recipe after construction, as TE users do.
_all_recipes = [
    pytest.param(recipe.Float8CurrentScaling, id="Float8CurrentScaling"),
    pytest.param(recipe.Float8BlockScaling, id="Float8BlockScaling"),
    pytest.param(recipe.MXFP8BlockScaling, id="MXFP8BlockScaling"),
    pytest.param(recipe.NVFP4BlockScaling, id="NVFP4BlockScaling"),
    pytest.param(nvfp4_4over6, id="NVFP4BlockScaling-4over6"),
    pytest.param(nvfp4_row_scaled, id="NVFP4BlockScaling-row_scaled"),
]

# torch.compile modes exercised by the te.Linear tests: the default backend and
# "reduce-overhead" (CUDA-graph trees, so CUDA only).
_compile_modes = [
    pytest.param("default", id="default"),
    pytest.param("reduce-overhead", id="reduce-overhead", marks=pytest.mark.gpu),
]


def _device(compile_mode: str) -> str:
    return "cuda" if compile_mode == "reduce-overhead" else "cpu"


def _cudagraph_warmup(fn, inp, *, backward: bool) -> None:
    """One eager call before capture, as the seed does."""
    out = fn(inp)
    if backward:
        out.sum().backward()


@contextlib.contextmanager
def _assert_no_cudagraph_skips(enabled: bool):
    """``reduce-overhead`` captured CUDA graphs for every graph instead of silently
    running one eagerly (Inductor counts each skip)."""
    before = counters["inductor"]["cudagraph_skips"]
    yield
    if enabled:
        skipped = counters["inductor"]["cudagraph_skips"] - before
        assert skipped == 0, f"reduce-overhead fell back to eager: {skipped} cudagraph skip(s)"


# Eager and compiled run the same kernels: bit for bit.
_EAGER_ATOL, _EAGER_RTOL = 0.0, 0.0


def _assert_close_eager_compiled(fn, compiled, model, base):
    """``fn`` eagerly and ``compiled`` on identical inputs: the output and the input,
    weight and bias gradients match."""
    inp_eager = base.detach().clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    out_eager = fn(inp_eager)
    out_eager.sum().backward()
    ref_out = out_eager.detach().clone()
    ref_wgrad = model.weight.grad.detach().clone()
    ref_bgrad = model.bias.grad.detach().clone()
    ref_igrad = inp_eager.grad.detach().clone()

    inp_compiled = base.detach().clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    # Clone before a later cuda-graph replay overwrites the static output buffer.
    out_compiled = compiled(inp_compiled).clone()
    out_compiled.sum().backward()

    torch.testing.assert_close(out_compiled, ref_out, atol=_EAGER_ATOL, rtol=_EAGER_RTOL)
    torch.testing.assert_close(inp_compiled.grad, ref_igrad, atol=_EAGER_ATOL, rtol=_EAGER_RTOL)
    torch.testing.assert_close(model.weight.grad, ref_wgrad, atol=_EAGER_ATOL, rtol=_EAGER_RTOL)
    torch.testing.assert_close(model.bias.grad, ref_bgrad, atol=_EAGER_ATOL, rtol=_EAGER_RTOL)


def _graph_breaks() -> int:
    return sum(counters["graph_break"].values())


# ---------------------------------------------------------------------------
# te.Linear
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("compile_mode", _compile_modes)
@pytest.mark.parametrize("fp8_recipe", [pytest.param(None, id="bf16"), *_all_recipes])
def test_te_linear_compiles(fp8_recipe, compile_mode):
    """torch.compile(fullgraph=True) of ``te.Linear`` under every built-in recipe
    (plus the bf16-only baseline with no autocast), for both the default backend and
    ``mode="reduce-overhead"`` (CUDA-graph trees)."""
    fp8_recipe = None if fp8_recipe is None else fp8_recipe()
    dtype = torch.bfloat16
    device = _device(compile_mode)

    # FP8 GEMMs require leading dimensions divisible by 16.
    model = te.Linear(64, 32, params_dtype=dtype, device=device)

    def fn(inp):
        if fp8_recipe is None:
            return model(inp)
        with te.autocast(recipe=fp8_recipe):
            return model(inp)

    torch._dynamo.reset()
    if compile_mode == "reduce-overhead":
        _cudagraph_warmup(
            fn,
            torch.randn(32, 64, dtype=dtype, device=device, requires_grad=True),
            backward=True,
        )
        model.zero_grad(set_to_none=True)
    compiled = torch.compile(fn, fullgraph=True, mode=compile_mode)

    # ``reduce-overhead`` warms up on the first call(s) and replays a captured
    # CUDA graph afterwards, so iterate a few times to actually exercise replay.
    n_iters = 3 if compile_mode == "reduce-overhead" else 1
    with _assert_no_cudagraph_skips(compile_mode == "reduce-overhead"):
        for _ in range(n_iters):
            base = torch.randn(32, 64, dtype=dtype, device=device)
            _assert_close_eager_compiled(fn, compiled, model, base)
    assert _graph_breaks() == 0


@pytest.mark.parametrize("compile_mode", _compile_modes)
def test_te_linear_compile_with_quantized_fp8_weight(compile_mode):
    """torch.compile handles Linear weights initialized as FP8 tensors
    (``quantized_model_init``), for both modes."""
    dtype = torch.bfloat16
    device = _device(compile_mode)
    fp8_recipe = recipe.Float8CurrentScaling()

    with te.quantized_model_init(enabled=True, recipe=fp8_recipe):
        model = te.Linear(64, 32, params_dtype=dtype, device=device)

    assert isinstance(model.weight, Float8Tensor)

    def fn(inp):
        with te.autocast(recipe=fp8_recipe):
            return model(inp)

    torch._dynamo.reset()
    if compile_mode == "reduce-overhead":
        _cudagraph_warmup(
            fn,
            torch.randn(32, 64, dtype=dtype, device=device, requires_grad=True),
            backward=True,
        )
        model.zero_grad(set_to_none=True)
    compiled = torch.compile(fn, fullgraph=True, mode=compile_mode)

    n_iters = 3 if compile_mode == "reduce-overhead" else 1
    with _assert_no_cudagraph_skips(compile_mode == "reduce-overhead"):
        for _ in range(n_iters):
            base = torch.randn(32, 64, dtype=dtype, device=device)
            _assert_close_eager_compiled(fn, compiled, model, base)


@pytest.mark.parametrize("compile_mode", _compile_modes)
def test_te_linear_compile_with_fp8_output(compile_mode):
    """``te.Linear(..., fp8_output=True)`` compiled without gradient returns a
    ``Float8Tensor`` whose dequantized value equals eager's."""
    dtype = torch.bfloat16
    device = _device(compile_mode)
    fp8_recipe = recipe.Float8CurrentScaling()

    model = te.Linear(64, 32, params_dtype=dtype, device=device)

    def fn(inp):
        with te.autocast(recipe=fp8_recipe):
            return model(inp, fp8_output=True)

    torch._dynamo.reset()
    if compile_mode == "reduce-overhead":
        with torch.no_grad():
            _cudagraph_warmup(fn, torch.randn(32, 64, dtype=dtype, device=device), backward=False)
    compiled = torch.compile(fn, fullgraph=True, mode=compile_mode)

    n_iters = 3 if compile_mode == "reduce-overhead" else 1
    with _assert_no_cudagraph_skips(compile_mode == "reduce-overhead"):
        for _ in range(n_iters):
            inp = torch.randn(32, 64, dtype=dtype, device=device)
            with torch.no_grad():
                out_eager = fn(inp)
                out = compiled(inp)
            assert isinstance(out, Float8Tensor), (
                f"expected Float8Tensor output, got {type(out).__name__}"
            )
            assert out.shape == (32, 32)
            assert out._quantizer is not None, (
                "FP8 output lost its quantizer on the torch.compile path"
            )
            deq = out.dequantize()
            assert deq.shape == (32, 32)
            assert deq.dtype == dtype
            torch.testing.assert_close(
                deq, out_eager.dequantize(), atol=_EAGER_ATOL, rtol=_EAGER_RTOL
            )


@pytest.mark.parametrize("compile_mode", _compile_modes)
def test_te_linear_compile_is_first_microbatch(compile_mode):
    """``te.Linear`` across a microbatch schedule that caches the FP8 weight
    (``is_first_microbatch``) stays aligned with eager under compile."""
    dtype = torch.bfloat16
    device = _device(compile_mode)
    fp8_recipe = recipe.Float8CurrentScaling()
    model = te.Linear(64, 32, params_dtype=dtype, device=device)

    # First microbatch caches the FP8 weight, the rest reuse the cache.
    schedule = [True, False, False]
    is_first = schedule[0]  # rebound each step; closed over by ``fn``.

    def fn(inp):
        with te.autocast(recipe=fp8_recipe):
            return model(inp, is_first_microbatch=is_first)

    torch._dynamo.reset()
    if compile_mode == "reduce-overhead":
        _cudagraph_warmup(
            fn,
            torch.randn(32, 64, dtype=dtype, device=device, requires_grad=True),
            backward=True,
        )
        model.zero_grad(set_to_none=True)
    compiled = torch.compile(fn, fullgraph=True, mode=compile_mode)

    with _assert_no_cudagraph_skips(compile_mode == "reduce-overhead"):
        for is_first in schedule:  # noqa: B007 (read by ``fn``)
            base = torch.randn(32, 64, dtype=dtype, device=device)
            _assert_close_eager_compiled(fn, compiled, model, base)


def test_te_linear_dynamic_shapes():
    """A graph compiled for one batch size serves others (the batch dimension marked
    dynamic) without recompiling, each equal to eager."""
    dtype = torch.bfloat16
    device = "cpu"
    in_features, out_features = 64, 32
    model = te.Linear(in_features, out_features, params_dtype=dtype, device=device)

    def fn(inp):
        return model(inp)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)

    batch_sizes = [16, 32, 48]

    for i, batch in enumerate(batch_sizes):
        inp = torch.randn(batch, in_features, dtype=dtype, device=device, requires_grad=True)
        # Mark batch dim as dynamic so Dynamo traces once and reuses across batch sizes.
        torch._dynamo.mark_dynamic(inp, 0)
        out = compiled(inp)
        assert out.shape == (batch, out_features), f"wrong output shape for batch={batch}"
        out.sum().backward()
        assert inp.grad is not None, f"no input gradient for batch={batch}"
        assert inp.grad.shape == inp.shape, f"wrong grad shape for batch={batch}"

        inp_eager = inp.detach().clone().requires_grad_(True)
        model.zero_grad(set_to_none=True)
        out_eager = model(inp_eager)
        out_eager.sum().backward()
        torch.testing.assert_close(
            out.detach(),
            out_eager.detach(),
            atol=_EAGER_ATOL,
            rtol=_EAGER_RTOL,
            msg=f"forward mismatch at batch={batch}",
        )
        torch.testing.assert_close(
            inp.grad,
            inp_eager.grad,
            atol=_EAGER_ATOL,
            rtol=_EAGER_RTOL,
            msg=f"dgrad mismatch at batch={batch}",
        )

        if i == 0:
            # After the first (tracing) call: later batch sizes must not add a graph.
            graphs_baseline = counters["stats"]["unique_graphs"]
            assert graphs_baseline >= 1

    assert counters["stats"]["unique_graphs"] == graphs_baseline, (
        "Unexpected recompilation(s) across different batch sizes: "
        f"{counters['stats']['unique_graphs'] - graphs_baseline} new graph(s)"
    )


# ---------------------------------------------------------------------------
# te.Linear: the tests TE added after the seed
# ---------------------------------------------------------------------------


def _fp8_output_with_grad(model, inp):
    return model(inp, fp8_output=True)


def _quantized(inp):
    quantizer = recipe.Float8CurrentScaling().make_quantizer("input")
    return quantizer.with_internal(False).quantize(inp)


def _plain(inp):
    return inp


# (the input as given to the compiled function, the call, the reason, Linear's arguments)
_EAGER_FALLBACK_CASES = [
    pytest.param(
        _plain,
        _fp8_output_with_grad,
        "fp8_output=True with autograd enabled",
        {},
        id="fp8_output_grad",
    ),
    pytest.param(
        _quantized,
        lambda model, inp: model(inp),
        "a quantized input tensor",
        {},
        id="quantized_input",
    ),
    pytest.param(
        _plain,
        lambda model, inp: model(inp),
        "fused wgrad accumulation",
        {"fuse_wgrad_accumulation": True},
        id="fuse_wgrad_accumulation",
    ),
]


@pytest.mark.parametrize("given, call, reason, kwargs", _EAGER_FALLBACK_CASES)
def test_te_linear_compile_eager_fallback(given, call, reason, kwargs):
    """A call the op path cannot serve runs eagerly under torch.compile, warning once
    with its reason, and equals eager; ``fullgraph=True`` raises quoting the reason."""
    dtype = torch.bfloat16
    fp8_recipe = recipe.Float8CurrentScaling()
    model = te.Linear(64, 32, params_dtype=dtype, **kwargs)

    def fn(inp):
        with te.autocast(recipe=fp8_recipe):
            return call(model, inp)

    inp = given(torch.randn(32, 64, dtype=dtype))
    expected = fn(inp)

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(fn)(inp)
    messages = [str(w.message) for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert any(reason in message for message in messages), messages
    with torch.no_grad():
        got, expected = (
            t.dequantize() if isinstance(t, Float8Tensor) else t for t in (got, expected)
        )
    torch.testing.assert_close(got, expected, atol=_EAGER_ATOL, rtol=_EAGER_RTOL)

    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=reason):
        torch.compile(fn, fullgraph=True)(inp)


def test_te_linear_compile_delayed_scaling_raises():
    """``te.autocast(recipe=DelayedScaling())`` inside a fullgraph compile raises an
    error naming DelayedScaling: its amax history is state no graph can hold."""
    model = te.Linear(64, 32, params_dtype=torch.bfloat16)
    fp8_recipe = recipe.DelayedScaling()

    def fn(inp):
        with te.autocast(recipe=fp8_recipe):
            return model(inp)

    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="DelayedScaling"):
        torch.compile(fn, fullgraph=True)(torch.randn(32, 64, dtype=torch.bfloat16))


def test_te_linear_compile_train_eval_switch():
    """One compiled function through train -> eval (no grad) -> train: each phase
    equals eager, bit for bit."""
    dtype = torch.bfloat16
    fp8_recipe = recipe.Float8CurrentScaling()
    model = te.Linear(64, 32, params_dtype=dtype)

    def fn(inp):
        with te.autocast(recipe=fp8_recipe):
            return model(inp)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    for phase in ("train", "eval", "train"):
        base = torch.randn(32, 64, dtype=dtype)
        if phase == "train":
            model.train()
            _assert_close_eager_compiled(fn, compiled, model, base)
        else:
            model.eval()
            with torch.no_grad():
                torch.testing.assert_close(
                    compiled(base), fn(base), atol=_EAGER_ATOL, rtol=_EAGER_RTOL
                )
    assert _graph_breaks() == 0
