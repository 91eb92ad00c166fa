"""GroupedLinear on the grouped-GEMM op (``ops/grouped_gemm.py``): which calls it serves
and which loop; on the CPU the loop's numbers to the bit (bf16, fp32, FP8 current
scaling; biases, empty groups, host lists and tensors); compiled equal to eager over
changing splits in one graph; the row counts checked; ``use_grouped_tensor``."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from module_cases import graph_breaks, unique_graphs

import transformer_engine_ops as te
import transformer_engine_ops.modules.grouped_linear as grouped_linear_module
from transformer_engine_ops import recipe
from transformer_engine_ops.ops import grouped_gemm
from transformer_engine_ops.quantization.float8 import Float8CurrentScalingQuantizer

SPLITS = ([5, 0, 7, 4], [16, 0, 0, 0], [0, 3, 3, 10])
RECIPES = {
    "none": None,
    "fp8_current": recipe.Float8CurrentScaling,
    "fp8_current_e4m3": lambda: recipe.Float8CurrentScaling(fp8_format=recipe.Format.E4M3),
}


def _module(dtype=torch.bfloat16, bias=True, in_features=32, out_features=16):
    torch.manual_seed(0)
    module = te.GroupedLinear(4, in_features, out_features, bias=bias, params_dtype=dtype)
    if bias:
        with torch.no_grad():
            for i in range(4):
                getattr(module, f"bias{i}").normal_(std=0.1)
    return module


def _context(name):
    make = RECIPES[name]
    return te.autocast(recipe=make()) if make is not None else contextlib.nullcontext()


def _step(module, x, splits, name):
    for p in module.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with _context(name):
        y = module(x, splits)
    g = torch.linspace(-1, 1, y.numel()).view_as(y).to(y.dtype)
    y.backward(g)
    inner = getattr(module, "_orig_mod", module)
    return [y.detach(), x.grad, *[p.grad for p in inner.parameters()]]


@contextlib.contextmanager
def _loop_only(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(te.GroupedLinear, "_grouped_gemm_serves", lambda *args: False)
        yield


@contextlib.contextmanager
def _calls(monkeypatch):
    """Counts the calls of each op (``grouped_gemm``, ``grouped_linear``)."""
    counts = {"grouped_gemm": 0, "grouped_linear": 0}
    with monkeypatch.context() as m:
        for name in counts:
            original = getattr(grouped_linear_module, f"call_{name}")

            def counted(*args, _name=name, _original=original, **kwargs):
                counts[_name] += 1
                return _original(*args, **kwargs)

            m.setattr(grouped_linear_module, f"call_{name}", counted)
        yield counts


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", list(RECIPES))
def test_grouped_gemm_computes_the_loops_numbers_on_the_cpu(name, dtype, bias, monkeypatch):
    module = _module(dtype, bias)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    for splits in SPLITS:
        with _calls(monkeypatch) as counts:
            got = _step(module, x, torch.tensor(splits), name)
        assert counts == {"grouped_gemm": 1, "grouped_linear": 0}
        with _loop_only(monkeypatch):
            expected = _step(module, x, torch.tensor(splits), name)
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert torch.equal(a, b), (splits, i)


def test_a_host_list_takes_the_grouped_gemm_too(monkeypatch):
    module = _module()
    x = torch.randn(16, 32).to(torch.bfloat16)
    with _calls(monkeypatch) as counts:
        got = _step(module, x, [5, 0, 7, 4], "none")
    assert counts["grouped_gemm"] == 1
    expected = _step(module, x, torch.tensor([5, 0, 7, 4]), "none")
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("delayed", {}),
        ("mxfp8", {}),
        ("fp8_block", {}),
        ("nvfp4", {}),
        ("fp8_current-cached", {"is_first_microbatch": True}),
        ("fp8_current-misaligned", {"in_features": 30}),
    ],
)
def test_the_loop_serves_what_the_grouped_gemm_has_no_kernel_for(name, kwargs, monkeypatch):
    from module_cases import RECIPES as ALL

    ALL = {**ALL, "delayed": recipe.DelayedScaling}
    recipe_name = name.split("-")[0]
    module = _module(in_features=kwargs.pop("in_features", 32))
    x = torch.randn(16, module.in_features).to(torch.bfloat16)
    with _calls(monkeypatch) as counts, te.autocast(recipe=ALL[recipe_name]()):
        module(x, torch.tensor([5, 0, 7, 4]), **kwargs)
    assert counts == {"grouped_gemm": 0, "grouped_linear": 1}


def test_fused_wgrad_accumulation_loops(monkeypatch):
    module = te.GroupedLinear(2, 32, 16, fuse_wgrad_accumulation=True, params_dtype=torch.bfloat16)
    for w in (module.weight0, module.weight1):
        w.main_grad = torch.zeros(16, 32)
    with _calls(monkeypatch) as counts:
        module(torch.randn(8, 32).to(torch.bfloat16), torch.tensor([3, 5]))
    assert counts == {"grouped_gemm": 0, "grouped_linear": 1}


def test_serves_names_why_not():
    cpu, fp8 = torch.device("cpu"), Float8CurrentScalingQuantizer()
    e5m2 = Float8CurrentScalingQuantizer(fp8_dtype=torch.float8_e5m2)
    assert grouped_gemm.serves(cpu, torch.bfloat16, 32, 16, (None, None, None)) is None
    assert grouped_gemm.serves(cpu, torch.bfloat16, 32, 16, (fp8, fp8, e5m2)) is None
    assert "E4M3" in grouped_gemm.serves(cpu, torch.bfloat16, 32, 16, (e5m2, fp8, e5m2))
    assert "multiples of 4" in grouped_gemm.serves(cpu, torch.float32, 30, 16, (None,) * 3)
    assert "float64" in grouped_gemm.serves(cpu, torch.float64, 32, 16, (None,) * 3)


@pytest.mark.parametrize("name", ["none", "fp8_current"])
def test_compiled_equals_eager_over_changing_splits_in_one_graph(name):
    module = _module()
    compiled = torch.compile(module, fullgraph=True)
    x = torch.randn(16, 32).to(torch.bfloat16)
    for splits in SPLITS:
        s = torch.tensor(splits)
        got, expected = _step(compiled, x, s, name), _step(module, x, s, name)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert unique_graphs() == 1 and graph_breaks() == 0


@pytest.mark.parametrize(
    "splits, match",
    [([5, 0, 7, 3], r"sum to the input's 16 rows"), ([9, -1, 4, 4], "non-negative")],
)
def test_row_counts_that_do_not_fit_are_refused(splits, match):
    with pytest.raises(ValueError, match=match):
        _module()(torch.randn(16, 32).to(torch.bfloat16), torch.tensor(splits))


def test_float_row_counts_are_refused_not_truncated():
    with pytest.raises(TypeError, match="row counts must be an integer tensor"):
        _module()(torch.randn(16, 32).to(torch.bfloat16), torch.tensor([4.0, 4.0, 4.0, 4.0]))


def test_bias_gradient_of_the_ones_column_gemm():
    """The CUDA bias gradient (a grouped GEMM of the gradient with a ones column), run on
    the CPU's grouped GEMM: each group's column sums."""
    dy = torch.randn(20, 16).to(torch.bfloat16)
    splits = torch.tensor([6, 0, 14])
    offsets = torch.cumsum(splits, 0).to(torch.int32)
    got = grouped_gemm._ones_column_sums(dy, offsets)
    expected = torch.stack([dy[:6].float().sum(0), torch.zeros(16), dy[6:].float().sum(0)])
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("value", [False, True, None])
@pytest.mark.parametrize("recipe_name", [*RECIPES, "delayed"])
def test_use_grouped_tensor_takes_tes_values_with_the_same_numbers(value, recipe_name, monkeypatch):
    """TE's values; each computes what the default module computes (both of TE's paths
    are one computation here), with its gradients, on host-list and tensor splits."""
    monkeypatch.delenv("NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM", raising=False)
    torch.manual_seed(0)
    module = te.GroupedLinear(4, 32, 16, params_dtype=torch.bfloat16, use_grouped_tensor=value)
    torch.manual_seed(0)
    default = te.GroupedLinear(4, 32, 16, params_dtype=torch.bfloat16)
    assert module.use_grouped_tensor is bool(value)
    make = {**RECIPES, "delayed": recipe.DelayedScaling}[recipe_name]
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for splits in ([32, 0, 16, 16], torch.tensor([0, 64, 0, 0])):
        results = []
        for m in (module, default):
            m.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_(True)
            ctx = te.autocast(recipe=make()) if make is not None else contextlib.nullcontext()
            with ctx:
                y = m(xi, splits)
            y.float().square().sum().backward()
            results.append([y, xi.grad, *(p.grad for p in m.parameters())])
        for a, b in zip(*results, strict=True):
            assert torch.equal(a, b), (value, recipe_name, splits)


@pytest.mark.parametrize("env, expected", [("1", True), ("0", False)])
def test_use_grouped_tensor_none_reads_tes_deprecated_variable(env, expected, monkeypatch):
    monkeypatch.setenv("NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM", env)
    with pytest.warns(FutureWarning, match="NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM is dep"):
        module = te.GroupedLinear(2, 32, 16)
    assert module.use_grouped_tensor is expected
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit value reads no variable
        assert te.GroupedLinear(2, 32, 16, use_grouped_tensor=not expected).use_grouped_tensor is (
            not expected
        )


def test_use_grouped_tensor_refuses_a_non_bool():
    with pytest.raises(TypeError, match="use_grouped_tensor must be a bool or None"):
        te.GroupedLinear(2, 32, 16, use_grouped_tensor=1)


def test_single_grouped_parameters_need_use_grouped_tensor_as_in_te(monkeypatch):
    monkeypatch.setenv("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")
    monkeypatch.delenv("NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM", raising=False)
    for kwargs in (dict(single_grouped_weight=True, bias=False), dict(single_grouped_bias=True)):
        with pytest.warns(UserWarning, match="experimental"):
            module = te.GroupedLinear(2, 32, 16, **kwargs)
        with pytest.raises(RuntimeError, match="require use_grouped_tensor=True"):
            module(torch.randn(6, 32), [2, 4])


# --- single_grouped_weight ---------------------------------------------------------


def _single(monkeypatch, **kwargs):
    monkeypatch.setenv("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="experimental"):
        return te.GroupedLinear(
            4, 32, 16, params_dtype=torch.bfloat16, use_grouped_tensor=True, **kwargs
        )


@pytest.mark.parametrize("name", list(RECIPES) + ["fp8_block"])
def test_single_grouped_parameters_compute_the_discrete_ones_numbers(name, monkeypatch):
    from module_cases import RECIPES as ALL

    single = _single(monkeypatch, single_grouped_weight=True, single_grouped_bias=True)
    discrete = _module()
    with torch.no_grad():
        for i in range(4):
            getattr(discrete, f"bias{i}").copy_(single.bias[i].normal_(std=0.1))
    assert sorted(single.state_dict()) == ["_extra_state", "bias", "weight"]
    assert single.weight.shape == (4, 16, 32) and single.bias.shape == (4, 16)
    assert single.weight0 is None and single.bias0 is None
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    make = {**RECIPES, "fp8_block": ALL["fp8_block"]}[name]
    for splits in SPLITS:
        got, want = [], []
        for module, out in ((single, got), (discrete, want)):
            module.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_(True)
            ctx = te.autocast(recipe=make()) if make is not None else contextlib.nullcontext()
            with ctx:
                y = module(xi, torch.tensor(splits))
            y.float().square().sum().backward()
            out += [y, xi.grad]
        got += [single.weight.grad, single.bias.grad]
        want += [
            torch.stack([getattr(discrete, f"weight{i}").grad for i in range(4)]),
            torch.stack([getattr(discrete, f"bias{i}").grad for i in range(4)]),
        ]
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), (name, splits)


def test_single_grouped_weight_is_read_as_it_is(monkeypatch):
    single = _single(monkeypatch, single_grouped_weight=True, bias=False)
    seen = {}
    original = grouped_linear_module.call_grouped_gemm

    def spy(**kwargs):
        seen["weight"] = kwargs["weight"]
        return original(**kwargs)

    monkeypatch.setattr(grouped_linear_module, "call_grouped_gemm", spy)
    single(torch.randn(6, 32).to(torch.bfloat16), torch.tensor([1, 2, 0, 3]))
    assert seen["weight"] is single.weight


def test_single_grouped_weight_needs_tes_environment_variable(monkeypatch):
    monkeypatch.delenv("NVTE_GROUPED_LINEAR_SINGLE_PARAM", raising=False)
    with pytest.warns(UserWarning, match="NVTE_GROUPED_LINEAR_SINGLE_PARAM environment variable"):
        module = te.GroupedLinear(2, 32, 16, single_grouped_weight=True)
    assert not module.single_grouped_weight and module.weight0 is not None


def test_single_grouped_weight_with_a_bias_warns_without_single_bias(monkeypatch):
    monkeypatch.setenv("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")
    with pytest.warns(UserWarning, match="enable single_grouped_bias"):
        te.GroupedLinear(2, 32, 16, single_grouped_weight=True)


def test_single_grouped_weight_refusals(monkeypatch):
    monkeypatch.setenv("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")
    with pytest.warns(UserWarning), pytest.raises(NotImplementedError, match="main_grad"):
        te.GroupedLinear(2, 32, 16, single_grouped_weight=True, fuse_wgrad_accumulation=True)
    with (
        pytest.warns(UserWarning),
        te.quantized_model_init(recipe=recipe.Float8CurrentScaling()),
        pytest.raises(NotImplementedError, match="quantized_model_init"),
    ):
        te.GroupedLinear(2, 32, 16, single_grouped_weight=True, bias=False)


def test_single_grouped_weight_reset_parameters_redraws_in_place(monkeypatch):
    single = _single(monkeypatch, single_grouped_weight=True, bias=False)
    weight = single.weight
    before = weight.detach().clone()
    torch.manual_seed(0)
    single.reset_parameters()
    assert single.weight is weight and torch.equal(single.weight, before)
