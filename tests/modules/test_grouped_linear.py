"""GroupedLinear: every recipe x bias compiled bitwise equal to eager over changing
splits (zeros, one group taking everything) without recompiling, the plain formula,
one gradient per weight and bias, quantized weights (``quantized_model_init``) with their
gradients and weights-only state dicts, TE's constructor and state-dict keys."""

from __future__ import annotations

import contextlib
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from module_cases import QUANTIZED, RECIPES, graph_breaks, recipe_context, unique_graphs

import transformer_engine_ops as te
from transformer_engine_ops.quantization import DelayedScaling
from transformer_engine_ops.quantization.quantizer import QuantizedTensor, Quantizer
from transformer_engine_ops.runtime.fallback import EagerFallbackWarning

AOT = "aot_eager"
ROWS = 128
# Multiples of 32 rows (MXFP8's block), with empty groups and a group taking everything.
SPLITS = ([32, 0, 96], [128, 0, 0], [0, 0, 128], [64, 32, 32])


def make(
    bias: bool = True, seed: int = 0, num_gemms: int = 3, init_recipe: str | None = None
) -> te.GroupedLinear:
    """A bf16 GroupedLinear; with ``init_recipe``, built under that recipe's
    ``quantized_model_init`` (quantized weight parameters)."""
    torch.manual_seed(seed)
    if init_recipe is None:
        module = te.GroupedLinear(num_gemms, 64, 32, bias=bias, params_dtype=torch.bfloat16)
    else:
        with te.quantized_model_init(recipe=RECIPES[init_recipe]()):
            module = te.GroupedLinear(num_gemms, 64, 32, bias=bias, params_dtype=torch.bfloat16)
    with torch.no_grad():
        for i in range(num_gemms):
            if bias:
                getattr(module, f"bias{i}").normal_(std=0.1)
    return module


def make_input(seed: int = 1, rows: int = ROWS) -> torch.Tensor:
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def step(module, x, splits, recipe, **kwargs):
    for p in module.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with recipe_context(recipe):
        y = module(x, splits, **kwargs)
    y.float().square().sum().backward()
    inner = getattr(module, "_orig_mod", module)
    return [y.detach(), x.grad, *[p.grad for p in inner.parameters()]]


def assert_equal(got, expected):
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a is not None and b is not None, f"entry {i} has no value"
        assert torch.equal(a, b), f"entry {i} differs"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_compiled_is_bitwise_equal_to_eager_and_splits_change_without_recompile(recipe, bias):
    module, x = make(bias), make_input()
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    for splits in SPLITS:
        s = torch.tensor(splits)
        assert_equal(step(compiled, x, s, recipe), step(module, x, s, recipe))
    assert unique_graphs() == 1
    assert graph_breaks() == 0


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
def test_compiled_on_inductor_is_bitwise_equal_to_eager(recipe):
    module, x = make(), make_input()
    compiled = torch.compile(module, fullgraph=True, backend="inductor")
    for splits in SPLITS[:2]:
        s = torch.tensor(splits)
        assert_equal(step(compiled, x, s, recipe), step(module, x, s, recipe))
    assert unique_graphs() == 1


def test_list_splits_under_dynamic_compile_share_one_graph():
    module, x = make(), make_input()
    compiled = torch.compile(module, fullgraph=True, backend=AOT, dynamic=True)
    for splits in ([32, 0, 96], [64, 32, 32], [1, 2, 125]):
        assert_equal(step(compiled, x, splits, "bf16"), step(module, x, splits, "bf16"))
    assert unique_graphs() == 1


def test_dynamic_row_counts_share_one_graph():
    module = make()
    compiled = torch.compile(module, fullgraph=True, backend=AOT, dynamic=True)
    for rows in (32, 64, 96, 160, 224):
        x, s = make_input(rows, rows), torch.tensor([rows - 32, 0, 32])
        assert_equal(step(compiled, x, s, "mxfp8"), step(module, x, s, "mxfp8"))
    assert unique_graphs() == 1


@pytest.mark.parametrize("bias", [True, False])
def test_bf16_matches_per_group_linear_and_every_parameter_gets_its_gradient(bias):
    module, x = make(bias), make_input()
    splits = [32, 0, 96]
    got = step(module, x, torch.tensor(splits), "bf16")
    xf = x.float().requires_grad_(True)
    params = [p.detach().float().requires_grad_(True) for p in module.parameters()]
    weights = params[0::2] if bias else params
    biases = params[1::2] if bias else [None] * 3
    y = torch.cat(
        [F.linear(xi, w, b) for xi, w, b in zip(xf.split(splits), weights, biases, strict=True)]
    )
    y.square().sum().backward()
    for a, b in zip(got, [y, xf.grad, *[p.grad for p in params]], strict=True):
        assert (a.float() - b).abs().max() <= 2e-2 * max(b.abs().max().item(), 1.0)
    # The empty group's weight (and bias) gets a zero gradient, not None.
    empty_w = got[2 + (2 if bias else 1)]
    assert torch.equal(empty_w, torch.zeros_like(empty_w))


def test_bad_splits_are_named():
    module, x = make(), make_input()
    with pytest.raises(ValueError, match="must be non-negative and sum to the input's 128 rows"):
        module(x, [64, 0, 32])
    with pytest.raises(ValueError, match="m_splits: shape \\(2,\\), expected \\(3,\\)"):
        module(x, [64, 64])


def test_a_3d_input_keeps_its_leading_dims():
    module = make()
    x = make_input().view(4, 32, 64)
    assert tuple(module(x, [32, 32, 64]).shape) == (4, 32, 32)


# --- TE's constructor and state dict ----------------------------------------------------


def test_te_positional_arguments_mean_what_they_mean_in_te():
    m = te.GroupedLinear(2, 64, 32, False, False, None, 1, None, None, None, False)
    assert (m.num_gemms, m.use_bias) == (2, False)
    assert set(m.state_dict()) == {"weight0", "weight1", "_extra_state"}


@pytest.mark.parametrize(
    "kwargs",
    [dict(return_bias=True), dict(ub_overlap_ag=True)],
    ids=lambda kw: next(iter(kw)),
)
def test_unimplemented_arguments_raise_naming_them(kwargs):
    with pytest.raises(NotImplementedError, match=next(iter(kwargs))):
        te.GroupedLinear(2, 64, 32, **kwargs)


def test_state_dict_has_te_keys_and_loads_strictly_both_ways():
    a, b = make(), make(seed=4)
    state = a.state_dict()
    expected = {f"weight{i}": (32, 64) for i in range(3)}
    expected |= {f"bias{i}": (32,) for i in range(3)}
    expected["_extra_state"] = (0,)
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    b.load_state_dict(state, strict=True)
    x = make_input()
    assert torch.equal(b(x, [32, 0, 96]), a(x, [32, 0, 96]))
    a.load_state_dict(b.state_dict(), strict=True)


# --- quantized weight parameters (quantized_model_init) -----------------------------------


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("recipe", QUANTIZED)
def test_quantized_init_weights_compile_bitwise_equal_to_eager_each_with_its_gradient(recipe, bias):
    module, x = make(bias, init_recipe=recipe), make_input()
    weights = [getattr(module, f"weight{i}") for i in range(3)]
    assert all(isinstance(w, QuantizedTensor) and w.requires_grad for w in weights)
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    for splits in SPLITS[:2]:
        s = torch.tensor(splits)
        expected = step(module, x, s, recipe)
        assert_equal(step(compiled, x, s, recipe), expected)
        # Every weight (the empty groups' included) gets a plain gradient of its shape.
        for i, w in enumerate(weights):
            assert type(w.grad) is torch.Tensor and w.grad.shape == (32, 64), i
    assert unique_graphs() == 1
    assert graph_breaks() == 0


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_quantized_init_weights_are_the_quantized_plain_weights(recipe):
    """The weights' values are the plain module's (same seed), quantized once: the
    forward equals the plain module's under the same recipe (whose weight quantizer
    makes the same codes from the same values)."""
    quantized, plain, x = make(init_recipe=recipe), make(), make_input()
    for i in range(3):
        w, p = getattr(quantized, f"weight{i}"), getattr(plain, f"weight{i}")
        assert (w.dequantize().float() - p.float()).abs().max() <= 0.2 * p.abs().max()
    with recipe_context(recipe), torch.no_grad():
        got, ref = quantized(x, [32, 0, 96]), plain(x, [32, 0, 96])
    assert torch.equal(got, ref)


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_quantized_init_state_dict_round_trips_through_weights_only_load(recipe):
    saved, fresh, x = make(init_recipe=recipe), make(seed=5, init_recipe=recipe), make_input()
    s = torch.tensor([32, 0, 96])
    expected = step(saved, x, s, recipe)
    assert not torch.equal(step(fresh, x, s, recipe)[0], expected[0])
    buf = io.BytesIO()
    torch.save(saved.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    for i in range(3):
        assert type(state[f"weight{i}"]) is type(getattr(saved, f"weight{i}").data)
    fresh.load_state_dict(state, strict=True)
    assert all(isinstance(getattr(fresh, f"weight{i}"), QuantizedTensor) for i in range(3))
    assert_equal(step(fresh, x, s, recipe), expected)


def test_delayed_scaling_quantized_init_seeds_one_scale_from_every_weight_and_trains():
    torch.manual_seed(0)
    with te.quantized_model_init(recipe=DelayedScaling()):
        module = te.GroupedLinear(3, 64, 32, params_dtype=torch.bfloat16)
    torch.manual_seed(0)
    plain = te.GroupedLinear(3, 64, 32, params_dtype=torch.bfloat16)
    for i in range(3):
        w, p = getattr(module, f"weight{i}").dequantize().float(), getattr(plain, f"weight{i}")
        # E4M3 from a scale covering every weight's amax: nothing clipped or flushed.
        assert ((w - p.float()).norm() / p.float().norm()).item() < 2**-4
    x = make_input().requires_grad_(True)
    with te.autocast(recipe=DelayedScaling()):
        y = module(x, [32, 0, 96])
    y.float().square().sum().backward()
    assert all(getattr(module, f"weight{i}").grad is not None for i in range(3))
    assert "scale_fwd" in module.state_dict()["_extra_state"]


def _scaling_states(module: te.GroupedLinear) -> list[dict]:
    """Each GEMM's delayed-scaling state as its ``_extra_state`` holds it (copies); a
    module without one yet starts from scales of 1."""
    state = module.state_dict()["_extra_state"]
    if not isinstance(state, dict):
        return [{"scale_fwd": torch.ones(3), "scale_bwd": torch.ones(3)}] * module.num_gemms
    states = [state] + [state[f"gemm{i}"] for i in range(1, module.num_gemms)]
    return [{k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for s in states]


def _dequantized(t: torch.Tensor, role: str, scale: torch.Tensor) -> torch.Tensor:
    """``t`` quantized as delayed scaling's ``role`` quantizer quantizes it at ``scale``,
    dequantized in fp32 (as the CPU GEMM reads FP8 operands)."""
    quantizer = DelayedScaling().make_quantizer(role)
    quantizer.load_state(scale, quantizer.amax_history)
    return quantizer.quantize(t).dequantize(dtype=torch.float32)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_delayed_scaling_gradients_use_the_forwards_quantized_operands(compiled):
    """TE's delayed scaling: the backward's GEMMs read the input and weight the forward
    quantized (at the scales of the forward), though autocast's exit has updated those
    scales since. Each GEMM's gradients are checked against ones computed from the same
    quantized operands, over steps whose input amax grows (so every scale moves)."""
    module = make(bias=False)
    run = torch.compile(module, backend=AOT) if compiled else module
    splits = torch.tensor([32, 0, 96])
    for scale_up in (1.0, 1.5, 3.0):
        states = _scaling_states(module)  # the scales this step's forward quantizes with
        x = (make_input() * scale_up).requires_grad_(True)
        for p in module.parameters():
            p.grad = None
        with te.autocast(recipe=DelayedScaling()):
            y = run(x, splits)
        y.float().square().sum().backward()
        dy = (2 * y.detach().float()).to(torch.bfloat16)
        start = 0
        for i, rows in enumerate(splits.tolist()):
            fwd, bwd = states[i]["scale_fwd"], states[i]["scale_bwd"]
            x_i, dy_i = x.detach()[start : start + rows], dy[start : start + rows]
            xq = _dequantized(x_i, "input", fwd[0:1])
            wq = _dequantized(getattr(module, f"weight{i}").detach(), "weight", fwd[1:2])
            dyq = _dequantized(dy_i, "grad_output", bwd[0:1])
            torch.testing.assert_close(
                x.grad[start : start + rows],
                (dyq @ wq).to(torch.bfloat16),
                rtol=2**-7,  # one bf16 rounding of fp32 sums taken in another order
                atol=1e-5,
                msg=lambda m, i=i, s=scale_up: f"GEMM {i} dgrad at x{s}: {m}",
            )
            torch.testing.assert_close(
                getattr(module, f"weight{i}").grad,
                (dyq.t() @ xq).to(torch.bfloat16),
                rtol=2**-7,  # one bf16 rounding of fp32 sums taken in another order
                atol=1e-5,
                msg=lambda m, i=i, s=scale_up: f"GEMM {i} wgrad at x{s}: {m}",
            )
            start += rows


def test_delayed_scaling_backward_leaves_the_forward_scales_alone():
    """The backward records no amax into the forward roles' state (TE updates those
    once per step, at autocast's exit): a step with grad moves the input and weight
    scales exactly as the same step without grad does."""
    with_grad, without = make(bias=False), make(bias=False)
    x, splits = make_input(), torch.tensor([32, 0, 96])
    for _ in range(2):
        with te.autocast(recipe=DelayedScaling()):
            y = with_grad(x.detach().requires_grad_(True), splits)
            with torch.no_grad():
                without(x, splits)
        (y.float() * 3).square().sum().backward()
    for a, b in zip(_scaling_states(with_grad), _scaling_states(without), strict=True):
        assert torch.equal(a["scale_fwd"][:2], b["scale_fwd"][:2])
        assert torch.equal(a["amax_history_fwd"][:, :2], b["amax_history_fwd"][:, :2])


def test_delayed_scaling_refuses_save_original_input_as_te_does():
    module = te.GroupedLinear(3, 64, 32, save_original_input=True, params_dtype=torch.bfloat16)
    x, splits = make_input(), [32, 0, 96]
    with te.autocast(recipe=DelayedScaling()):
        with pytest.raises(ValueError, match="DelayedScaling recipe is not supported with save"):
            module(x, splits)
        with torch.no_grad():  # no backward: nothing quantized again
            module(x, splits)
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        module(x, splits)


# --- tensor parallelism: TE's shapes, no communication (tests/distributed runs 2 ranks) ---


@pytest.mark.parametrize("mode", ["column", "row"])
def test_parallel_mode_shards_each_weight_as_te_does(mode):
    """Without a group TE takes ``tp_size`` as given; rank 0's shard of each weight is
    the first slice of the single-process module's (same seed)."""
    torch.manual_seed(0)
    full = te.GroupedLinear(3, 64, 32, bias=False, params_dtype=torch.bfloat16)
    torch.manual_seed(0)
    part = te.GroupedLinear(
        3, 64, 32, bias=False, params_dtype=torch.bfloat16, parallel_mode=mode, tp_size=2
    )
    dim = 0 if mode == "column" else 1
    assert (part.in_features, part.out_features) == ((64, 16) if mode == "column" else (32, 32))
    for i in range(3):
        want = getattr(full, f"weight{i}").chunk(2, dim)[0]
        assert torch.equal(getattr(part, f"weight{i}"), want)
    x = make_input()
    if mode == "row":
        x = x[:, :32]
    assert part(x, [32, 0, 96]).shape == (ROWS, 16 if mode == "column" else 32)


def test_sequence_parallel_only_counts_with_more_than_one_rank():
    one = te.GroupedLinear(2, 64, 32, sequence_parallel=True, parallel_mode="column")
    two = te.GroupedLinear(
        2, 64, 32, sequence_parallel=True, parallel_mode="column", tp_size=2, bias=False
    )
    assert (one.sequence_parallel, two.sequence_parallel) == (False, True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(parallel_mode="row", tp_size=2), "bias=True is not supported with tp_size=2"),
        (dict(parallel_mode="diagonal"), "parallel_mode must be one of"),
        (dict(parallel_mode="column", tp_size=3, bias=False), "out_features=32 is not divisible"),
        (dict(parallel_mode="row", tp_size=0, bias=False), "tp_size must be a positive int"),
    ],
    ids=["bias", "mode", "divisible", "tp_size"],
)
def test_bad_parallel_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        te.GroupedLinear(2, 64, 32, **kwargs)


# --- weight caching across microbatches (is_first_microbatch) ------------------------------


@contextlib.contextmanager
def weight_quantizations(module: te.GroupedLinear):
    """Count the quantizer calls on the module's weights (their storage), per weight."""
    ptrs = {getattr(module, f"weight{i}").data_ptr(): i for i in range(module.num_gemms)}
    calls: list[int] = []
    original = Quantizer.quantize

    def counting(self, t):
        if t.data_ptr() in ptrs:
            calls.append(ptrs[t.data_ptr()])
        return original(self, t)

    Quantizer.quantize = counting
    try:
        yield calls
    finally:
        Quantizer.quantize = original


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_later_microbatches_do_not_run_the_weight_quantizers_and_match_uncached(recipe):
    cached, plain, x = make(), make(), make_input()
    workspaces = []
    for first, splits in ((True, [32, 0, 96]), (False, [64, 32, 32]), (False, [0, 0, 128])):
        s = torch.tensor(splits)
        with weight_quantizations(cached) as calls:
            got = step(cached, x, s, recipe, is_first_microbatch=first)
        # The first microbatch quantizes each weight once (forward), for the cache and
        # the backward's dgrad; later ones never run a weight quantizer.
        assert sorted(calls) == ([0, 1, 2] if first else []), (first, calls)
        assert_equal(got, step(plain, x, s, recipe))
        workspaces.append(cached._weight_workspaces)
    assert len(workspaces[0]) == 3 and all(w is not None for w in workspaces[0])
    # The same kept weights, GEMM by GEMM.
    assert all(a is b is c for a, b, c in zip(*workspaces, strict=True))


def test_uncached_calls_quantize_each_weight_in_forward_and_backward(monkeypatch):
    """What the cache saves: without it every call of the loop op quantizes each weight
    twice (the grouped-GEMM op, which serves this call by default, quantizes each once
    in its forward and keeps the codes for the backward)."""
    module, x = make(), make_input()
    monkeypatch.setattr(te.GroupedLinear, "_grouped_gemm_serves", lambda *args: False)
    with weight_quantizations(module) as calls:
        step(module, x, torch.tensor([32, 0, 96]), "fp8_current")
    assert sorted(calls) == [0, 0, 1, 1, 2, 2]


def test_a_weight_changed_after_the_first_microbatch_is_seen_at_the_next_first_one():
    module, x = make(), make_input()
    s = torch.tensor([32, 32, 64])
    first = step(module, x, s, "fp8_current", is_first_microbatch=True)
    with torch.no_grad():
        module.weight1.mul_(2)
    later = step(module, x, s, "fp8_current", is_first_microbatch=False)
    assert torch.equal(later[0], first[0])  # TE's contract: the cached workspace is used
    refreshed = step(module, x, s, "fp8_current", is_first_microbatch=True)
    assert not torch.equal(refreshed[0], first[0])


def test_workspaces_cached_without_grad_are_refreshed_when_backward_needs_them():
    module, plain, x = make(), make(), make_input()
    s = torch.tensor([32, 0, 96])
    with torch.no_grad(), recipe_context("mxfp8"):
        module(x, s, is_first_microbatch=True)
    assert not any(w.columnwise_usage for w in module._weight_workspaces)
    assert_equal(step(module, x, s, "mxfp8", is_first_microbatch=False), step(plain, x, s, "mxfp8"))
    assert all(w.columnwise_usage for w in module._weight_workspaces)


def test_caching_with_bf16_or_quantized_weights_keeps_nothing_and_matches():
    for module, recipe in ((make(), "bf16"), (make(init_recipe="fp8_current"), "fp8_current")):
        plain = make(init_recipe=None if recipe == "bf16" else recipe)
        x, s = make_input(), torch.tensor([32, 0, 96])
        for first in (True, False):
            got = step(module, x, s, recipe, is_first_microbatch=first)
            assert_equal(got, step(plain, x, s, recipe))
        assert module._weight_workspaces is None


def test_compiled_microbatches_compile_under_fullgraph_and_match_eager():
    """As Linear: the cached workspaces are state the graphs write and read, so a
    compiled call with is_first_microbatch needs no fallback and equals the eager module."""
    eager_module, module, x = make(), make(), make_input()
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for first in (True, False, False):
            s = torch.tensor([32, 0, 96])
            got = step(compiled, x, s, "fp8_current", is_first_microbatch=first)
            assert_equal(got, step(eager_module, x, s, "fp8_current", is_first_microbatch=first))
    fallbacks = [w for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert fallbacks == []
    assert module._weight_workspaces is not None


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "mxfp8"])
def test_reduce_overhead_follows_each_calls_m_splits(recipe):
    """One ``mode="reduce-overhead"`` graph serves every ``m_splits`` of the same length
    (a CPU tensor, as TE takes it): the grouped ops run outside the CUDA graphs
    (``cudagraph_unsafe``), so each call splits its rows by its own ``m_splits`` instead
    of replaying the first call's split. Bitwise equal to eager, no CUDA-graph skip."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    torch.manual_seed(0)
    module = te.GroupedLinear(3, 64, 64, params_dtype=torch.bfloat16).cuda()

    def step(fn, x, m_splits):
        module.zero_grad(set_to_none=True)
        x = x.detach().clone().requires_grad_(True)
        with recipe_context(recipe):
            y = fn(x, m_splits)
        y.float().sum().backward()
        return [y.detach().clone(), x.grad.clone(), *(p.grad.clone() for p in module.parameters())]

    compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
    skips, breaks = counters["inductor"]["cudagraph_skips"], graph_breaks()
    # Multiples of 32 rows (MXFP8's columnwise blocks); the same length every call.
    for splits in ([32, 0, 64], [0, 96, 0], [64, 32, 0], [32, 0, 64], [32, 32, 32]):
        m_splits = torch.tensor(splits, dtype=torch.int64)
        x = torch.randn(96, 64, device="cuda", dtype=torch.bfloat16)
        got, want = step(compiled, x, m_splits), step(module, x, m_splits)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(a, b), f"m_splits {splits}: tensor {i} differs"
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert graph_breaks() == breaks


def test_make_grouped_weights_packs_the_weights_into_one_parameter(monkeypatch) -> None:
    """TE's ``make_grouped_weights()``: ``weight0``.. become one ``[G, out, in]``
    parameter ``weight`` holding the same values, and the forward computes as before."""
    monkeypatch.setenv("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")
    torch.manual_seed(0)
    layer = te.GroupedLinear(3, 32, 16, bias=False, params_dtype=torch.float32)
    before = [getattr(layer, f"weight{i}").detach().clone() for i in range(3)]
    x = torch.randn(12, 32)
    want = layer(x, [4, 5, 3])
    layer.use_grouped_tensor = True
    layer.make_grouped_weights()
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
    assert torch.equal(layer.weight, torch.stack(before))
    assert torch.equal(layer(x, [4, 5, 3]), want)
    layer.make_grouped_weights()  # already grouped: nothing to do
    assert torch.equal(layer.weight, torch.stack(before))


def test_make_grouped_weights_refuses_partial_high_precision_init() -> None:
    """As TE: packing refuses weights of which only some keep their high-precision
    initial values, rather than mix preserved and dequantized initializations."""
    with te.quantized_model_init(
        enabled=True, recipe=te.recipe.MXFP8BlockScaling(), preserve_high_precision_init_val=True
    ):
        layer = te.GroupedLinear(2, 32, 64, bias=False, params_dtype=torch.bfloat16)
    layer.weight0.clear_high_precision_init_val()
    with pytest.raises(RuntimeError, match="inconsistent high-precision initialization state"):
        layer.make_grouped_weights()
    layer.weight1.clear_high_precision_init_val()
    with pytest.raises(NotImplementedError, match="make_grouped_weights: quantized weights"):
        layer.make_grouped_weights()
