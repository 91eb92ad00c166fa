"""Every Inductor compile (a plain ``torch.compile``) lowers op calls into its graph
where they trace to eager's bits, and keeps the rest.

A plain call (no quantizer, quantized tensor, process group or integer tensor) is
traced into the graph, its reductions, activations and bias GEMMs kept whole as
``teops_exact`` ops, and stays bitwise equal to eager; an FP8 current-scaling call on
CUDA is traced with its fused quantize as one op and stays bitwise; any other quantized
call (every one on the CPU) keeps its op node and stays bitwise. An op whose declaration
does not say ``lowers=True`` keeps its node. The compile cache keys on the kernels'
source; ``inductor_backend(lowering=...)`` picks another lowering for one compile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from family_cases import make, make_input
from module_cases import MLP, assert_bitwise, cloned, graph_breaks, step, unique_graphs
from torch._dynamo.utils import counters

import transformer_engine_ops as te
from transformer_engine_ops.runtime import lowering

FAMILY = ["layernorm", "rmsnorm", "layernorm_linear", "layernorm_mlp"]


@pytest.fixture
def lowered_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts, per op, the calls each decomposition traced (declined ones excluded), in
    a fresh compile cache: a graph another test compiled would otherwise be a cache hit,
    which traces nothing."""
    from torch._inductor.utils import fresh_cache

    calls: dict[str, int] = {}
    for op, decomposition in lowering.decompositions().items():
        name = op._schema.name

        def counted(*slots: Any, _d: Any = decomposition, _n: str = name) -> Any:
            out = _d(*slots)
            if out is not NotImplemented:
                calls[_n] = calls.get(_n, 0) + 1
            return out

        monkeypatch.setitem(lowering._DECOMPOSITIONS, op, counted)
    with fresh_cache():
        yield calls


def test_linear_plain_calls_are_lowered_bit_for_bit(lowered_calls):
    model, x = MLP(), torch.randn(8, 64).to(torch.bfloat16)
    eager = step(model, x, None)
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    got = step(compiled, x, None)
    assert lowered_calls == {"teops::linear_fwd": 2, "teops::linear_bwd": 2}
    assert graph_breaks() == 0 and unique_graphs() == 1
    assert_bitwise(got, eager)
    again = step(compiled, x, None)  # the compiled graph runs again unchanged
    assert_bitwise(again, got)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("kind", FAMILY)
def test_family_plain_calls_are_lowered_bit_for_bit(kind, dtype, lowered_calls):
    """fp32 too: there no rounding to 16 bits hides a reduction Inductor reorders."""
    module, x = make(kind, dtype=dtype), make_input(dtype=dtype)
    eager = step(module, x, None)
    got = step(torch.compile(module, fullgraph=True, backend="inductor"), x, None)
    assert set(lowered_calls) == {
        f"teops::{kind.replace('rmsnorm', 'layernorm')}_fwd",
        f"teops::{kind.replace('rmsnorm', 'layernorm')}_bwd",
    }
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


def test_fp32_linear_bias_gradient_is_eagers(lowered_calls):
    """The bias gradient is a sum over rows: kept whole, not Inductor's own reduction."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(te.Linear(64, 48), torch.nn.ReLU(), te.Linear(48, 32))
    x = torch.randn(96, 64)
    eager = step(model, x, None)
    got = step(torch.compile(model, fullgraph=True, backend="inductor"), x, None)
    assert lowered_calls == {"teops::linear_fwd": 2, "teops::linear_bwd": 2}
    assert_bitwise(got, eager)


@pytest.mark.parametrize("lowering_", ["bitwise", "rounding"])
def test_rounding_lets_inductor_regenerate_the_kept_pieces(lowering_, lowered_calls, monkeypatch):
    """The pieces are recorded as ops only when bitwise; with ``rounding``, Inductor
    traces them (its own reductions) and the result is eager's to rounding."""
    recorded: list[str] = []
    real = lowering.exact_op

    def counting(name: str) -> Any:
        recorded.append(name)
        return real(name)

    monkeypatch.setattr(lowering, "exact_op", counting)
    torch.manual_seed(0)
    model = torch.nn.Sequential(te.Linear(64, 48), torch.nn.ReLU(), te.LayerNormLinear(48, 32))
    x = torch.randn(96, 64)
    eager = step(model, x, None)
    backend = te.inductor_backend(lowering=lowering_)
    got = step(torch.compile(model, fullgraph=True, backend=backend), x, None)
    assert lowered_calls == {
        "teops::linear_fwd": 1,
        "teops::linear_bwd": 1,
        "teops::layernorm_linear_fwd": 1,
        "teops::layernorm_linear_bwd": 1,
    }
    if lowering_ == "bitwise":
        pieces = {name.split("__", 1)[0] for name in recorded}
        assert {"bias_grad", "fp32_gemm", "norm_forward", "norm_backward"} <= pieces
        assert_bitwise(got, eager)
    else:
        assert recorded == []
        for a, b in zip([got[0], got[1], *got[2]], [eager[0], eager[1], *eager[2]], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert lowering._TRACING.keep_exact  # restored after the compile


def test_grouped_linear_keeps_its_op_as_it_reads_its_splits_on_the_host(lowered_calls):
    torch.manual_seed(0)
    module = te.GroupedLinear(3, 64, 32, params_dtype=torch.bfloat16)
    x = torch.randn(96, 64).to(torch.bfloat16)

    def run(m: Any) -> tuple[Any, ...]:
        for p in module.parameters():
            p.grad = None
        xi = x.clone().requires_grad_(True)
        y = m(xi, [32, 0, 64])
        y.float().square().sum().backward()
        return y.detach(), xi.grad, [p.grad for p in module.parameters()]

    eager = run(module)
    got = run(torch.compile(module, fullgraph=True, backend="inductor"))
    assert lowered_calls == {}
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


@pytest.mark.parametrize("recipe", ["fp8_current", "fp8_block"])
def test_quantized_calls_on_the_cpu_keep_their_op_and_stay_bitwise(recipe, lowered_calls):
    model, x = MLP(), torch.randn(8, 64).to(torch.bfloat16)
    eager = step(model, x, recipe)
    got = step(torch.compile(model, fullgraph=True, backend="inductor"), x, recipe)
    assert lowered_calls == {}
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


@contextlib.contextmanager
def caches_on() -> Iterator[None]:
    """Inductor's and AOTAutograd's caches on, whatever an earlier test left set."""
    with (
        torch._inductor.config.patch(force_disable_caches=False, fx_graph_cache=True),
        torch._functorch.config.patch(enable_autograd_cache=True),
    ):
        yield


@caches_on()
def test_lowering_off_keeps_every_op_node_and_never_reuses_the_default_graph(lowered_calls):
    """``lowering="off"`` compiles past AOTAutograd's cache (its key cannot tell the two
    graphs apart): after a default compile of the same model it still keeps the op
    nodes, and a default compile after it lowers again."""
    model, x = MLP(), torch.randn(8, 64).to(torch.bfloat16)
    eager = step(model, x, None)
    step(torch.compile(model, fullgraph=True), x, None)
    assert lowered_calls["teops::linear_fwd"] == 2
    torch._dynamo.reset()
    off = step(
        torch.compile(model, fullgraph=True, backend=te.inductor_backend(lowering="off")), x, None
    )
    assert lowered_calls["teops::linear_fwd"] == 2
    assert_bitwise(off, eager)
    torch._dynamo.reset()
    counters.clear()
    again = step(torch.compile(model, fullgraph=True), x, None)
    assert counters["aot_autograd"]["autograd_cache_hit"] >= 1, "the first default graph"
    assert_bitwise(again, eager)


def test_the_compile_cache_keys_on_the_kernels_source(lowered_calls, monkeypatch):
    """A decomposition's code is not in the graph Dynamo captures, so the fingerprint of
    the kernels' source joins the cache key: the same source hits AOTAutograd's cache
    across compiles, a changed one misses and traces the kernel again (never reusing a
    graph traced from the old code). A tag the user set is kept."""
    from torch._inductor.utils import fresh_cache

    model, x = MLP(), torch.randn(8, 64).to(torch.bfloat16)
    eager = step(model, x, None)

    def compile_once() -> dict[str, int]:
        torch._dynamo.reset()
        counters.clear()
        assert_bitwise(step(torch.compile(model, fullgraph=True), x, None), eager)
        return dict(counters["aot_autograd"])

    with (
        fresh_cache(),
        caches_on(),
        torch.compiler.config.patch(cache_key_tag="users-own"),
    ):
        first = compile_once()
        assert first.get("autograd_cache_miss", 0) >= 1 and lowered_calls["teops::linear_fwd"] == 2
        assert torch.compiler.config.cache_key_tag == (
            f"users-own+teops-lowered-{lowering.source_fingerprint()}"
        )
        again = compile_once()
        assert again.get("autograd_cache_hit", 0) >= 1 and not again.get("autograd_cache_miss")
        assert lowered_calls["teops::linear_fwd"] == 2, "a cache hit traces nothing"
        roots = tuple(sorted(lowering._PACKAGES))
        monkeypatch.setitem(lowering._FINGERPRINTS, roots, "0123456789abcdef")  # an edit
        edited = compile_once()
        assert edited.get("autograd_cache_miss", 0) >= 1 and not edited.get("autograd_cache_hit")
        assert lowered_calls["teops::linear_fwd"] == 4
        assert torch.compiler.config.cache_key_tag == "users-own+teops-lowered-0123456789abcdef"


def test_the_fingerprint_covers_every_source_file_of_the_package(tmp_path, monkeypatch):
    import sys
    import types

    pkg = tmp_path / "lowered_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "kernel.py").write_text("X = 1\n")
    module = types.ModuleType("lowered_pkg")
    module.__path__ = [str(pkg)]
    monkeypatch.setitem(sys.modules, "lowered_pkg", module)
    monkeypatch.setattr(lowering, "_PACKAGES", {"lowered_pkg"})
    monkeypatch.setattr(lowering, "_FINGERPRINTS", {})
    before = lowering.source_fingerprint()
    lowering._FINGERPRINTS.clear()
    assert lowering.source_fingerprint() == before, "deterministic"
    (pkg / "sub" / "kernel.py").write_text("X = 2\n")  # a module no one has imported yet
    lowering._FINGERPRINTS.clear()
    assert lowering.source_fingerprint() != before


def test_only_ops_declared_lowers_are_lowered_by_default():
    """The shipped ops mark their pieces and declare ``lowers=True``; GroupedLinear (whose
    calls always read their splits on the host) declares nothing and keeps its nodes in
    a default compile (``tests/ops/test_every_kind_op.py`` checks a user's op module)."""
    import torch._inductor.decomposition as inductor_decomposition

    from transformer_engine_ops.generated import grouped_linear  # noqa: F401

    lowering.install()
    # The package's own ops (a test's fixture ops may be defined in this process too).
    ours = {
        op
        for op in lowering.decompositions()
        if lowering._MODULES[op].startswith("transformer_engine_ops.")
    }
    by_default = {op._schema.name for op in lowering.lowered_by_default() & ours}
    shipped = {"linear", "layernorm", "l2normalization", "layernorm_linear", "layernorm_mlp"}
    assert by_default == {f"teops::{n}_{d}" for n in shipped for d in ("fwd", "bwd")}
    table = {op for op in inductor_decomposition.decompositions if op in ours}
    assert {op._schema.name for op in table} == by_default
    assert "teops::grouped_linear_fwd" in {op._schema.name for op in lowering.decompositions()}


def test_mode_and_options_reach_inductor(monkeypatch):
    seen: list[dict[str, Any]] = []
    import torch._inductor.compile_fx as compile_fx_module

    def fake_compile_fx(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return gm.forward

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile_fx)
    backend = te.inductor_backend(mode="max-autotune-no-cudagraphs", options={"debug": False})
    model, x = MLP(), torch.randn(8, 64).to(torch.bfloat16)
    torch.compile(model, fullgraph=True, backend=backend)(x)
    (kwargs,) = seen
    assert kwargs["config_patches"] == {
        "max_autotune": True,
        "coordinate_descent_tuning": True,
        "debug": False,
    }
    assert "decompositions" not in kwargs  # Inductor's own table, ours in it
    ours = lowering.decompositions()
    for name in ("rounding", "off"):
        seen.clear()
        torch._dynamo.reset()
        backend = te.inductor_backend(options={"debug": False}, lowering=name)
        torch.compile(model, fullgraph=True, backend=backend)(x)
        assert seen[0]["config_patches"] == {"debug": False}
        table = seen[0]["decompositions"]
        if name == "rounding":
            assert all(op in table for op in ours)
        else:
            assert not any(op in table for op in ours)


def test_lowerable_call_rule_reads_the_slot_table(monkeypatch):
    from transformer_engine_ops.generated import grouped_linear, linear
    from transformer_engine_ops.modules.autocast import RecipeQuantizers
    from transformer_engine_ops.quantization import MXFP8BlockScaling
    from transformer_engine_ops.quantization.float8 import Float8CurrentScalingQuantizer
    from transformer_engine_ops.runtime import boundary, codec

    lowerable = lowering.Lowerable(linear.FORWARD_SLOTS)
    names = [row.slot for row in linear.FORWARD_SLOTS]
    slots: list[Any] = [None] * len(names)
    slots[names.index("inp")] = torch.ones(2)
    for field in ("weight", "weight_workspace"):
        slots[names.index(f"{field}__inner")] = []
        slots[names.index(f"{field}__meta")] = boundary._TENSOR_CODE
    assert lowerable(slots)

    def changed(field: str, value: Any) -> list[Any]:
        out = list(slots)
        out[names.index(field)] = value
        return out

    assert not lowerable(changed("tp_group", "group"))
    assert not lowerable(changed("inp", torch.ones(2, dtype=torch.int64))), "an integer tensor"
    fp8 = Float8CurrentScalingQuantizer()
    fp8_code = codec.code_of(fp8)
    stored = fp8.with_internal(True).quantize(torch.randn(4, 8))
    _, inner, stored_meta = boundary.quantized_slots(stored)
    quantized_weight = changed("weight__meta", stored_meta)
    quantized_weight[names.index("weight__inner")] = inner
    mxfp8_code = codec.code_of(RecipeQuantizers.from_recipe(MXFP8BlockScaling()).input)
    # On the CPU, FP8 current scaling traces its reference ops: declined.
    assert not lowerable(changed("input_quantizer", fp8_code))
    assert not lowerable(quantized_weight)
    # Where it traces its fused kernels (CUDA), lowered; a block format never is.
    monkeypatch.setattr(Float8CurrentScalingQuantizer, "lowers_bitwise_on", lambda q, d: True)
    assert lowerable(changed("input_quantizer", fp8_code))
    assert lowerable(quantized_weight)
    assert not lowerable(changed("input_quantizer", mxfp8_code))
    grouped = lowering.Lowerable(grouped_linear.FORWARD_SLOTS)
    names = [row.slot for row in grouped_linear.FORWARD_SLOTS]
    slots = [[] if n.endswith(("__inner", "__meta")) else None for n in names]
    slots[names.index("inp")] = torch.ones(2)
    slots[names.index("input_quantizers")] = [None, None]
    assert grouped(slots)
    slots[names.index("input_quantizers")] = [None, mxfp8_code]
    assert not grouped(slots)
    slots[names.index("input_quantizers")] = None
    slots[names.index("m_splits")] = torch.tensor([1, 2])
    assert not grouped(slots)


def test_the_rules_kind_names_are_the_generators():
    """The runtime reads slot kinds by name (generated slot tables carry them as
    strings); each name it tests must be one the generator writes."""
    from codegen.model import Kind

    written = {k.value for k in Kind}
    used = (
        lowering._GROUP_KINDS
        | lowering._QUANTIZER_KINDS
        | lowering._QUANTIZER_LIST_KINDS
        | lowering._QUANTIZABLE_KINDS
        | lowering._TENSOR_KINDS
    )
    assert used <= written, sorted(used - written)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("kind", ["linear", *FAMILY])
def test_plain_calls_are_lowered_on_cuda_without_skips(kind, mode, lowered_calls):
    if kind == "linear":
        module, x = MLP(device="cuda"), torch.randn(8, 64, device="cuda").to(torch.bfloat16)
    else:
        module, x = make(kind).cuda(), make_input().cuda()
    eager = step(module, x, None)
    compiled = torch.compile(module, fullgraph=True, mode=mode)
    skips = counters["inductor"]["cudagraph_skips"]
    first = cloned(step(compiled, x, None))  # CUDA graph outputs are reused: clone
    for _ in range(2):
        if mode:
            torch.compiler.cudagraph_mark_step_begin()
        again = cloned(step(compiled, x, None))
        assert_bitwise(again, first)
    assert lowered_calls and all(n > 0 for n in lowered_calls.values())
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert graph_breaks() == 0 and unique_graphs() == 1
    assert_bitwise(first, eager)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_fp8_current_scaling_calls_lower_on_cuda_bit_for_bit(mode, lowered_calls):
    """On CUDA an FP8 current-scaling call lowers with its fused quantize recorded as one
    op (the same kernels eager runs): bitwise equal to eager, CUDA graphs included."""
    model, x = MLP(device="cuda"), torch.randn(32, 64, device="cuda").to(torch.bfloat16)
    eager = cloned(step(model, x, "fp8_current"))
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(3):
        if mode:
            torch.compiler.cudagraph_mark_step_begin()
        assert_bitwise(cloned(step(compiled, x, "fp8_current")), eager)
    assert lowered_calls == {"teops::linear_fwd": 2, "teops::linear_bwd": 2}
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert graph_breaks() == 0 and unique_graphs() == 1


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_block"])
def test_block_format_calls_on_cuda_stay_bitwise(recipe, lowered_calls):
    """MXFP8 keeps its op node; FP8 block scaling lowers with its quantize recorded as
    one op (64-wide: the GEMMs take the dequantized fp32 product, traced by Inductor)."""
    model, x = MLP(device="cuda"), torch.randn(32, 64, device="cuda").to(torch.bfloat16)
    eager = step(model, x, recipe)
    got = step(torch.compile(model, fullgraph=True, backend="inductor"), x, recipe)
    want = {"teops::linear_fwd": 2, "teops::linear_bwd": 2} if recipe == "fp8_block" else {}
    assert lowered_calls == want
    assert_bitwise(got, eager)


@pytest.mark.gpu
@cuda
def test_the_recorded_fp8_quantize_op_passes_opcheck():
    from transformer_engine_ops.kernels import cuda_kernels

    op = cuda_kernels._quantize_op()
    for shape, rowwise, columnwise, bias_grad in [
        ((64, 256), True, True, False),
        ((64, 256), False, True, True),
        ((3, 5, 7), True, False, False),
        ((6, 10), True, True, True),
    ]:
        x = torch.randn(shape, device="cuda").to(torch.bfloat16)
        args = (x, torch.float8_e4m3fn, 0.0, False, rowwise, columnwise, bias_grad)
        torch.library.opcheck(op, args)


# --- breaking it on purpose -----------------------------------------------------------


@pytest.mark.parametrize("activation", ["swiglu", "srelu", "qgelu"])
def test_layernorm_mlp_activations_and_rmsnorm_lower_bit_for_bit(activation, lowered_calls):
    module = make("layernorm_mlp", activation=activation, normalization="RMSNorm")
    x = make_input()
    eager = step(module, x, None)
    got = step(torch.compile(module, fullgraph=True, backend="inductor"), x, None)
    assert lowered_calls == {"teops::layernorm_mlp_fwd": 1, "teops::layernorm_mlp_bwd": 1}
    assert_bitwise(got, eager)


def test_dynamic_batch_sizes_recompile_no_more_than_the_default_backend(lowered_calls):
    """Batch 0 and 1 specialize (3 graphs over these sizes on either backend); every
    graph lowers both layers, and batch 0 and 1 match eager."""
    sizes = (5, 9, 1, 0, 33)
    graphs = {}
    for name, backend in (("off", te.inductor_backend(lowering="off")), ("default", "inductor")):
        torch._dynamo.reset()
        counters.clear()
        model = MLP()
        compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=backend)
        for rows in sizes:
            x = torch.randn(rows, 64).to(torch.bfloat16)
            got = step(compiled, x, None)
            if name == "default":
                assert_bitwise(got, step(model, x, None))
        assert graph_breaks() == 0
        graphs[name] = unique_graphs()
    assert graphs["off"] == graphs["default"]
    assert lowered_calls["teops::linear_fwd"] == 2 * graphs["default"]


def test_one_wide_features_and_no_bias_lower_bit_for_bit(lowered_calls):
    """1-wide layers cancel: any change of rounding would show at once."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        te.Linear(1, 7, bias=False, params_dtype=torch.bfloat16),
        te.Linear(7, 1, params_dtype=torch.bfloat16),
    )
    x = torch.randn(3, 1).to(torch.bfloat16)
    eager = step(model, x, None)
    got = step(torch.compile(model, fullgraph=True, backend="inductor"), x, None)
    assert lowered_calls == {"teops::linear_fwd": 2, "teops::linear_bwd": 2}
    assert_bitwise(got, eager)


def test_inference_and_repeated_backward(lowered_calls):
    model, x = MLP(), torch.randn(8, 64).to(torch.bfloat16)
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
    xi = x.clone().requires_grad_(True)
    y = compiled(xi).float().sum()
    (first,) = torch.autograd.grad(y, xi, retain_graph=True)
    (second,) = torch.autograd.grad(y, xi)
    assert torch.equal(first, second)
    assert lowered_calls["teops::linear_bwd"] >= 2


def test_checkpointed_compiled_module_recomputes_the_lowered_graph(lowered_calls):
    model, x = MLP(), torch.randn(8, 64).to(torch.bfloat16)
    eager = step(model, x, None)
    compiled = torch.compile(model, fullgraph=True, backend="inductor")

    class Checkpointed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return te.checkpoint(compiled, t)

    got = step(Checkpointed(), x, None)
    assert_bitwise(got, eager)


def test_a_wrong_shape_is_the_ops_error_not_a_tracing_failure():
    model = MLP()
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    with pytest.raises(Exception, match=r"64|shape|features") as info:
        compiled(torch.randn(4, 63).to(torch.bfloat16))
    assert "GuardOnDataDependentSymNode" not in str(info.value)


@pytest.mark.parametrize("recipe", [None, "fp8_current"])
def test_quantized_weight_parameters_keep_their_op_with_or_without_a_recipe(recipe, lowered_calls):
    """``quantized_model_init`` weights are wrapper subclasses: their op call is split
    into buffers by the op's dispatch rule before the decomposition sees it, which then
    declines, with no recipe active at the call as under one."""
    from module_cases import RECIPES

    with te.quantized_model_init(recipe=RECIPES["fp8_current"]()):
        model = MLP()
    x = torch.randn(32, 64).to(torch.bfloat16)
    eager = step(model, x, recipe)
    got = step(torch.compile(model, fullgraph=True, backend="inductor"), x, recipe)
    assert lowered_calls == {}
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


@pytest.mark.parametrize(
    ("kind", "kwargs"),
    [
        ("layernorm_linear", {"bias": False, "zero_centered_gamma": True}),
        ("layernorm_linear", {"normalization": "RMSNorm", "return_bias": True}),
        ("layernorm_linear", {"return_layernorm_output": True}),
        ("layernorm_mlp", {"bias": False, "zero_centered_gamma": True}),
        ("layernorm_mlp", {"return_layernorm_output": True}),
        ("layernorm", {"zero_centered_gamma": True}),
        ("layernorm_linear", {"dtype": torch.float32}),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)),
)
def test_module_options_lower_bit_for_bit(kind, kwargs, lowered_calls):
    dtype = kwargs.pop("dtype", torch.bfloat16)
    module = make(kind, dtype=dtype, **kwargs)
    x = make_input(dtype=dtype)

    def run(m: Any) -> list[torch.Tensor]:
        for p in module.parameters():
            p.grad = None
        xi = x.clone().requires_grad_(True)
        out = m(xi)
        outs = list(out) if isinstance(out, tuple) else [out]
        sum(o.float().sum() for o in outs).backward()
        return [o.detach() for o in outs] + [xi.grad] + [p.grad for p in module.parameters()]

    eager = run(module)
    got = run(torch.compile(module, fullgraph=True, backend="inductor"))
    assert lowered_calls, "nothing was lowered"
    assert graph_breaks() == 0
    assert len(got) == len(eager)
    for i, (a, b) in enumerate(zip(got, eager, strict=True)):
        assert (a is None and b is None) or torch.equal(a, b), f"entry {i}"


def test_an_unknown_mode_is_refused_when_the_backend_is_made():
    with pytest.raises(RuntimeError, match="Unrecognized mode=fast"):
        te.inductor_backend(mode="fast")


def test_a_model_mixing_quantized_and_plain_layers_lowers_only_the_plain_ones(lowered_calls):
    """fc1 holds a quantized weight parameter (its calls stay op nodes), fc2 a plain one
    (lowered): one graph holding both kinds."""
    from module_cases import RECIPES

    model = MLP()
    with te.quantized_model_init(recipe=RECIPES["fp8_current"]()):
        model.fc1 = te.Linear(64, 64, params_dtype=torch.bfloat16)
    x = torch.randn(32, 64).to(torch.bfloat16)
    eager = step(model, x, None)
    got = step(torch.compile(model, fullgraph=True, backend="inductor"), x, None)
    assert lowered_calls == {"teops::linear_fwd": 1, "teops::linear_bwd": 1}
    assert graph_breaks() == 0 and unique_graphs() == 1
    assert_bitwise(got, eager)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kind", ["layernorm_linear", "layernorm_mlp", "quantized_weights"])
def test_fp8_current_scaling_family_and_quantized_weights_lower_bit_for_bit(kind, lowered_calls):
    from module_cases import RECIPES

    if kind == "quantized_weights":
        with te.quantized_model_init(recipe=RECIPES["fp8_current"]()):
            module = MLP(device="cuda")
        x = torch.randn(32, 64, device="cuda").to(torch.bfloat16)
    else:
        module, x = make(kind).cuda(), make_input().cuda()
    eager = cloned(step(module, x, "fp8_current"))
    got = cloned(step(torch.compile(module, fullgraph=True, backend="inductor"), x, "fp8_current"))
    assert lowered_calls, "nothing was lowered"
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


_CACHED_RUN = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from module_cases import step
import transformer_engine_ops as te
torch.manual_seed(0)
model = torch.nn.Sequential(te.Linear(64, 48), torch.nn.ReLU(), te.LayerNormMLP(48, 32))
x = torch.randn(16, 64)  # fp32 on the CPU: the GEMMs are kept pieces too
eager = step(model, x, None)
from torch._dynamo.utils import counters
got = step(torch.compile(model, fullgraph=True), x, None)
same = all(torch.equal(a, b) for a, b in zip([got[0], got[1], *got[2]], [eager[0], eager[1], *eager[2]]))
print("hits", counters["aot_autograd"]["autograd_cache_hit"], "bitwise", same)
"""


def test_a_graph_loaded_from_the_cache_in_a_fresh_process_finds_its_recorded_ops(tmp_path):
    """A lowered graph calls the kept pieces (``teops_exact::*``) as ops. Loaded from the
    compile cache in a new process, it traces nothing: the ops must be defined anyway."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    here = str(Path(__file__).resolve().parent)
    runs = [
        subprocess.run(
            [sys.executable, "-c", _CACHED_RUN, here],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    assert runs[0].stdout.split()[-3:] == ["0", "bitwise", "True"], runs[0].stdout
    second = runs[1].stdout.split()
    assert int(second[-3]) >= 1 and second[-1] == "True", runs[1].stdout


_IMPORT_ORDER = """
import sys, torch
if sys.argv[1] == "inductor-first":
    import torch._inductor.lowering  # Inductor before any op is defined
import transformer_engine_ops as te
from transformer_engine_ops.runtime import lowering
model = torch.nn.Sequential(te.Linear(32, 16), torch.nn.ReLU(), te.Linear(16, 8))
model(torch.randn(4, 32))  # the ops are defined; Inductor not yet imported unless first
before = "torch._inductor.lowering" in sys.modules
hooked = any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)
traced = []
for op, d in lowering.decompositions().items():
    lowering._DECOMPOSITIONS[op] = lambda *s, _d=d, _op=op: traced.append(_op) or _d(*s)
x = torch.randn(4, 32, requires_grad=True)
torch.compile(model, fullgraph=True)(x).sum().backward()
still = any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)
print(before, hooked, still, len(traced) > 0, torch.compiler.config.cache_key_tag.startswith("teops-lowered-"))
"""


@pytest.mark.parametrize("order", ["ops-first", "inductor-first"])
def test_the_ops_join_inductor_whichever_is_imported_first(order, tmp_path):
    """Defined before Inductor is imported, the ops join it through a one-shot import
    hook (the package imports no Inductor); defined after, at once."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    run = subprocess.run(
        [sys.executable, "-c", _IMPORT_ORDER, order],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    before, hooked, still_hooked, lowered, tagged = run.stdout.split()[-5:]
    assert still_hooked == "False", "the hook is one-shot"
    assert before == ("True" if order == "inductor-first" else "False")
    assert hooked == ("True" if order == "ops-first" else "False")
    assert lowered == "True" and tagged == "True", run.stdout


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, cuda])])
def test_max_autotune_keeps_the_op_nodes(device, lowered_calls):
    """Autotuning may give a traced GEMM to a Triton template that rounds otherwise than
    eager's library call: under a ``max-autotune`` mode the calls keep their nodes."""
    model = MLP(device=device)
    x = torch.randn(8, 64, device=device).to(torch.bfloat16)
    eager = step(model, x, None)
    compiled = torch.compile(model, fullgraph=True, mode="max-autotune-no-cudagraphs")
    got = step(compiled, x, None)
    assert lowered_calls == {}
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


def test_a_failure_to_join_inductor_never_breaks_its_import(monkeypatch):
    """The import hook runs inside Inductor's own import: whatever goes wrong there is a
    warning (the calls stay op nodes), never a failed import of Inductor."""
    import types

    ran: list[str] = []

    def broken() -> None:
        ran.append("then")
        raise RuntimeError("a torch without make_fallback")

    hook = lowering._AfterImport("teops_hook_probe", broken)
    module = types.ModuleType("teops_hook_probe")

    class Loader:
        def exec_module(self, m: Any) -> None:
            ran.append("exec")

    class Spec:
        loader = Loader()

    class Finder:
        def find_spec(self, *args: Any) -> Any:
            return Spec()

    import sys

    monkeypatch.setattr(sys, "meta_path", [hook, Finder()])
    spec = hook.find_spec("teops_hook_probe", None)
    assert hook not in sys.meta_path, "one shot"
    with pytest.warns(UserWarning, match="could not join Inductor.*a torch without"):
        spec.loader.exec_module(module)
    assert ran == ["exec", "then"]
