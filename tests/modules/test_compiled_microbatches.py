"""Gradient accumulation under ``torch.compile(fullgraph=True)``: ``is_first_microbatch``
with every stateless recipe, for every module that caches a quantized weight.

The cached workspace is module state a graph writes (flag True: the op quantizes the
weight and the graph hands the quantized wrapper back to the module) and reads (flag
False: the wrapper is a graph input and the op quantizes no weight), so one graph serves
each flag value. The weight quantization happens inside the op's kernel, so it is
counted twice: at run time (``Quantizer.quantize`` calls on a weight, eagerly and
compiled) and in the captured graphs (the flag-True graph's op takes no workspace, the
flag-False graph's op takes the cached one as a graph input).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from family_cases import make
from functorch.compile import make_boxed_func
from module_cases import graph_breaks
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import transformer_engine_ops as te
from transformer_engine_ops import recipe
from transformer_engine_ops.quantization.quantizer import Quantizer

pytestmark = pytest.mark.slow  # two compiles per case

KINDS = ["linear", "layernorm_linear", "layernorm_mlp", "grouped_linear"]
# Every stateless recipe with TE's defaults (NVFP4: random Hadamard transform and
# stochastic rounding included; each microbatch seeds the generator they draw from).
RECIPES = {
    "Float8CurrentScaling": recipe.Float8CurrentScaling,
    "MXFP8BlockScaling": recipe.MXFP8BlockScaling,
    "Float8BlockScaling": recipe.Float8BlockScaling,
    "NVFP4BlockScaling": recipe.NVFP4BlockScaling,
}
SCHEDULE = (True, False, False, False)
STEPS = 2
SPLITS = [32, 0, 64]  # GroupedLinear's rows per GEMM (96 rows in all)


class Grouped(torch.nn.Module):
    """GroupedLinear with fixed splits, callable as ``module(x, **kwargs)``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = te.GroupedLinear(3, 64, 64, params_dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.inner(x.reshape(-1, x.shape[-1]), SPLITS, **kwargs)


def build(kind: str) -> torch.nn.Module:
    if kind == "linear":
        torch.manual_seed(0)
        return te.Linear(64, 64, params_dtype=torch.bfloat16)
    if kind == "grouped_linear":
        return Grouped()
    return make(kind)


def weights(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The GEMM weights (the 2-D parameters)."""
    return [p for p in module.parameters() if p.dim() == 2]


def workspaces(module: torch.nn.Module) -> list[Any]:
    """Every cached quantized weight the module keeps (None where it keeps none)."""
    inner = getattr(module, "inner", module)
    if isinstance(inner, te.GroupedLinear):
        return list(inner._weight_workspaces or [None])
    if isinstance(inner, te.LayerNormMLP):
        return [inner._fc1_weight_workspace, inner._fc2_weight_workspace]
    return [inner._weight_workspace]


class WeightQuantizations:
    """Counts ``Quantizer.quantize`` calls on the module's weights (by storage: the op
    quantizes the parameter itself when the activation dtype is the weight's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count, self.watched = 0, set()
        original = Quantizer.quantize

        def counting(quantizer: Quantizer, t: torch.Tensor) -> Any:
            self.count += t.data_ptr() in self.watched
            return original(quantizer, t)

        monkeypatch.setattr(Quantizer, "quantize", counting)

    def watch(self, module: torch.nn.Module) -> None:
        self.watched = {w.data_ptr() for w in weights(module)}

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


def _input(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 48, 64, generator=gen).to(torch.bfloat16)


def train(module, forward, make_recipe, counter):
    """``STEPS`` optimizer steps of ``SCHEDULE`` microbatches, gradients accumulated over
    each step: per microbatch (output, input grad), per step the accumulated parameter
    grads, the weight quantizations and the cached workspaces' buffers."""
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    microbatches, steps = [], []
    recipe_value = make_recipe()
    for s in range(STEPS):
        counter.watch(module)
        counter.take()
        for i, first in enumerate(SCHEDULE):
            x = _input(10 * s + i).requires_grad_(True)
            torch.manual_seed(1000 + 10 * s + i)  # stochastic rounding's (seed, offset)
            y = forward(x, first, recipe_value)
            y.float().sum().backward()
            microbatches.append((y.detach(), x.grad))
        kept = [[t.clone() for t in w._inner_dict().values()] for w in workspaces(module)]
        grads = [p.grad.clone() for p in module.parameters()]
        steps.append((grads, counter.take(), kept, workspaces(module)))
        optimizer.step()  # the weights change: the next True must refresh the cache
        optimizer.zero_grad(set_to_none=True)
    return microbatches, steps


def forward_of(module):
    def forward(x, first, recipe_value):
        with te.autocast(recipe=recipe_value):
            return module(x, is_first_microbatch=first)

    return forward


class CapturingBackend:
    """``aot_eager``, keeping each graph Dynamo captured."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def _forward_op_calls(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    """Each ``teops::*_fwd`` call of the graph as {schema argument name: value}."""
    calls = []
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
            if target.namespace == "teops" and target._schema.name.endswith("_fwd"):
                names = [a.name for a in target._schema.arguments]
                calls.append({**dict(zip(names, node.args, strict=False)), **node.kwargs})
    return calls


def _workspace_arguments(call: dict[str, Any]) -> list[Any]:
    """The values of the op call's workspace slots (plain or wrapper-tensor slot, and
    the inner-buffer list)."""
    return [
        v
        for name, v in call.items()
        if "workspace" in name and not name.endswith("__meta") and v not in (None, [])
    ]


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("kind", KINDS)
def test_microbatch_loop_compiles_one_graph_per_flag_and_matches_eager(kind, name, monkeypatch):
    torch._dynamo.reset()
    counter = WeightQuantizations(monkeypatch)
    eager_module = build(kind)
    compiled_module = copy.deepcopy(eager_module)
    backend = CapturingBackend()
    compiled = torch.compile(forward_of(compiled_module), fullgraph=True, backend=backend)
    breaks = graph_breaks()

    eager_mb, eager_steps = train(eager_module, forward_of(eager_module), RECIPES[name], counter)
    got_mb, got_steps = train(compiled_module, compiled, RECIPES[name], counter)

    # Bitwise equal: every microbatch's output and input grad, every accumulated grad.
    for i, ((y, dx), (y_ref, dx_ref)) in enumerate(zip(got_mb, eager_mb, strict=True)):
        assert torch.equal(y, y_ref), f"microbatch {i}: output differs"
        assert torch.equal(dx, dx_ref), f"microbatch {i}: input grad differs"
    n_weights = len(weights(eager_module))
    for s, (got, want) in enumerate(zip(got_steps, eager_steps, strict=True)):
        for j, (g, g_ref) in enumerate(zip(got[0], want[0], strict=True)):
            assert torch.equal(g, g_ref), f"step {s}: grad of parameter {j} differs"
        # One quantization per weight per step, eagerly and compiled.
        assert want[1] == n_weights, f"step {s}: eager quantized the weights {want[1]} times"
        assert got[1] == n_weights, f"step {s}: compiled quantized the weights {got[1]} times"
        # The compiled run caches exactly eager's quantized weights.
        for kept, kept_ref in zip(got[2], want[2], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(kept, kept_ref, strict=True))
    # The optimizer step changed the weights (all but GroupedLinear's GEMM without rows,
    # whose gradient is zero); the next True made a fresh cache from them, eager's bits.
    assert any(
        not all(torch.equal(a, b) for a, b in zip(old, new, strict=True))
        for old, new in zip(got_steps[0][2], got_steps[1][2], strict=True)
    )
    assert all(a is not b for a, b in zip(got_steps[0][3], got_steps[1][3], strict=True))

    # One graph per flag value, no break, no recompile after the first step.
    assert graph_breaks() == breaks
    assert len(backend.graphs) == 2
    by_flag = {}
    for gm in backend.graphs:
        (call,) = _forward_op_calls(gm)
        by_flag[call["is_first_microbatch"]] = call
    assert set(by_flag) == {True, False}
    # True: the op gets no workspace (it quantizes the weights); False: the cached ones.
    assert _workspace_arguments(by_flag[True]) == []
    read = _workspace_arguments(by_flag[False])
    nodes = [t for v in read for t in (v if isinstance(v, list) else [v])]
    assert nodes and all(n.op == "placeholder" for n in nodes), read


def weight_caches(module: torch.nn.Module) -> list[Any]:
    """Every ``WeightWorkspace`` the module keeps its cached quantized weights in."""
    inner = getattr(module, "inner", module)
    if isinstance(inner, te.GroupedLinear):
        return list(inner._weight_caches)
    if isinstance(inner, te.LayerNormMLP):
        return [inner._fc1_weight_cache, inner._fc2_weight_cache]
    return [inner._weight_cache]


class StaticInputsBackend:
    """``aot_eager``, recording for each captured graph what CUDA-graph trees decide
    on (``cudagraph_utils.check_for_mutation``: a graph that mutates an input which is
    not a static input is run without CUDA graphs): the placeholders Dynamo marked
    static, and for the forward graph AOTAutograd made, the inputs it mutates and the
    static input indices Inductor hands to ``cudagraphify``."""

    def __init__(self) -> None:
        self.graphs: list[dict[str, Any]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        record: dict[str, Any] = {"gm": gm}
        record["dynamo_static"] = {
            node._dynamo_source.name: bool(
                node.meta.get("tensor_dict", {}).get("_dynamo_static_input_type")
            )
            for node in gm.graph.find_nodes(op="placeholder")
        }
        self.graphs.append(record)

        def forward_compiler(fw: torch.fx.GraphModule, inputs: Any) -> Any:
            placeholders = list(fw.graph.find_nodes(op="placeholder"))
            record["mutated"] = [
                placeholders.index(node.args[0])
                for node in fw.graph.nodes
                if node.op == "call_function"
                and node.target is torch.ops.aten.copy_.default
                and node.args[0].op == "placeholder"
            ]
            record["static"] = set(
                torch._guards.TracingContext.get().fw_metadata.static_input_indices
            )
            return make_boxed_func(fw)

        return aot_autograd(
            fw_compiler=forward_compiler,
            bw_compiler=lambda bw, inputs: make_boxed_func(bw),
            keep_inference_input_mutations=True,  # as Inductor asks
        )(gm, example_inputs)


@pytest.mark.parametrize("kind", KINDS)
def test_a_workspace_made_eagerly_is_written_in_place_by_the_compiled_first_microbatch(
    kind, monkeypatch
):
    """What ``mode="reduce-overhead"`` needs (docs/te.md, departure 9): after one eager
    caching call (the warm-up CUDA graphs are given), the workspace stays at its
    addresses; the flag-True graph writes the fresh quantized weights into them (a
    mutation of static inputs only, which CUDA-graph trees replay in place) and the
    flag-False graph reads them as static inputs. One graph per flag, eager's bits."""
    torch._dynamo.reset()
    counter = WeightQuantizations(monkeypatch)
    eager_module = build(kind)
    compiled_module = copy.deepcopy(eager_module)
    make_recipe = recipe.Float8CurrentScaling
    for module in (eager_module, compiled_module):  # the eager warm-up
        forward_of(module)(
            _input(99).requires_grad_(True), True, make_recipe()
        ).float().sum().backward()
        module.zero_grad(set_to_none=True)
    caches = weight_caches(compiled_module)
    assert all(cache.in_place for cache in caches)
    kept = [cache.value for cache in caches]
    addresses = [[b.data_ptr() for b in cache.buffers] for cache in caches]
    backend = StaticInputsBackend()
    compiled = torch.compile(forward_of(compiled_module), fullgraph=True, backend=backend)

    eager_mb, eager_steps = train(eager_module, forward_of(eager_module), make_recipe, counter)
    got_mb, got_steps = train(compiled_module, compiled, make_recipe, counter)

    for (y, dx), (y_ref, dx_ref) in zip(got_mb, eager_mb, strict=True):
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    for got, want in zip(got_steps, eager_steps, strict=True):
        assert all(torch.equal(g, g_ref) for g, g_ref in zip(got[0], want[0], strict=True))
        assert got[1] == want[1] == len(weights(eager_module))
        for buffers, buffers_ref in zip(got[2], want[2], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(buffers, buffers_ref, strict=True))
    # Both steps refreshed the same workspace objects, at the warm-up's addresses.
    assert all(cache.value is value for cache, value in zip(caches, kept, strict=True))
    assert all(a is b for a, b in zip(got_steps[1][3], kept, strict=True))
    assert [[b.data_ptr() for b in cache.buffers] for cache in caches] == addresses

    assert len(backend.graphs) == 2
    by_flag = {}
    for record in backend.graphs:
        (call,) = _forward_op_calls(record["gm"])
        by_flag[call["is_first_microbatch"]] = record
    first, later = by_flag[True], by_flag[False]
    # Every kept buffer (True: written; False: read) enters as a static input.
    for record in (first, later):
        cached = {n: s for n, s in record["dynamo_static"].items() if "weight_cache" in n}
        assert cached and all(cached.values()), record["dynamo_static"]
    # True writes each kept buffer, and only static inputs; False writes nothing.
    n_buffers = sum(len(cache.buffers) for cache in caches)
    assert len(first["mutated"]) == n_buffers
    assert set(first["mutated"]) <= first["static"]
    assert later["mutated"] == []


@pytest.mark.parametrize("kind", KINDS)
def test_false_before_any_true_quantizes_and_keeps_the_workspace_as_te_does(kind, monkeypatch):
    """TE's cache miss: ``is_first_microbatch=False`` with nothing cached quantizes the
    weights and keeps them; the next False reuses them. Compiled as eagerly."""
    torch._dynamo.reset()
    counter = WeightQuantizations(monkeypatch)
    eager_module = build(kind)
    compiled_module = copy.deepcopy(eager_module)
    compiled = torch.compile(forward_of(compiled_module), fullgraph=True, backend="aot_eager")
    n_weights = len(weights(eager_module))
    for module, forward in ((eager_module, forward_of(eager_module)), (compiled_module, compiled)):
        counter.watch(module)
        counter.take()
        for quantized in (n_weights, 0):
            x = _input(quantized)
            forward(x, False, recipe.Float8CurrentScaling()).float().sum().backward()
            assert counter.take() == quantized
        assert all(w is not None for w in workspaces(module))
    for got, want in zip(workspaces(compiled_module), workspaces(eager_module), strict=True):
        for a, b in zip(got._inner_dict().values(), want._inner_dict().values(), strict=True):
            assert torch.equal(a, b)


def test_the_workspace_stays_out_of_the_state_dict():
    module = build("layernorm_mlp")
    keys = set(module.state_dict())
    compiled = torch.compile(forward_of(module), fullgraph=True, backend="aot_eager")
    for first in (True, False):
        compiled(_input(0), first, recipe.MXFP8BlockScaling())
    assert all(w is not None for w in workspaces(module))
    assert set(module.state_dict()) == keys
    assert not any("workspace" in name for name, _ in module.named_buffers())
    fresh = build("layernorm_mlp")
    fresh.load_state_dict(module.state_dict())  # nothing unexpected, nothing missing


def test_a_workspace_cached_without_grad_is_remade_by_a_compiled_call_that_needs_it(monkeypatch):
    """A first microbatch under ``no_grad`` caches the weight without the columnwise data
    a dgrad GEMM reads; a later compiled microbatch with grad quantizes it again, keeps
    the new workspace and matches eager."""
    torch._dynamo.reset()
    counter = WeightQuantizations(monkeypatch)
    eager_module = build("linear")
    compiled_module = copy.deepcopy(eager_module)
    compiled = torch.compile(forward_of(compiled_module), fullgraph=True, backend="aot_eager")
    results = []
    for module, forward in ((eager_module, forward_of(eager_module)), (compiled_module, compiled)):
        counter.watch(module)
        with torch.no_grad():
            forward(_input(0), True, recipe.Float8BlockScaling())
        assert not workspaces(module)[0].columnwise_usage
        counter.take()
        x = _input(1).requires_grad_(True)
        y = forward(x, False, recipe.Float8BlockScaling())
        y.float().sum().backward()
        assert counter.take() == 1
        assert workspaces(module)[0].columnwise_usage
        results.append((y.detach(), x.grad, module.weight.grad))
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("kind", "warm_up"),
    [
        ("layernorm_mlp", False),
        ("grouped_linear", False),
        ("layernorm_mlp", True),
        ("grouped_linear", True),
    ],
)
def test_microbatch_loop_under_inductor_matches_eager(kind, warm_up, monkeypatch):
    """The same loop through Inductor (the recipes keep their op nodes on the CPU); after
    an eager warm-up, the flag-True graph writes the kept buffers in place (their
    addresses never change)."""
    torch._dynamo.reset()
    counter = WeightQuantizations(monkeypatch)
    eager_module = build(kind)
    compiled_module = copy.deepcopy(eager_module)
    make_recipe = RECIPES["NVFP4BlockScaling"]
    for module in (eager_module, compiled_module) if warm_up else ():
        torch.manual_seed(7)
        forward_of(module)(
            _input(99).requires_grad_(True), True, make_recipe()
        ).float().sum().backward()
        module.zero_grad(set_to_none=True)
    addresses = [[b.data_ptr() for b in c.buffers] for c in weight_caches(compiled_module)]
    backend = CompileCounterWithBackend("inductor")
    compiled = torch.compile(forward_of(compiled_module), fullgraph=True, backend=backend)
    eager_mb, eager_steps = train(eager_module, forward_of(eager_module), make_recipe, counter)
    got_mb, got_steps = train(compiled_module, compiled, make_recipe, counter)
    for (y, dx), (y_ref, dx_ref) in zip(got_mb, eager_mb, strict=True):
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    for got, want in zip(got_steps, eager_steps, strict=True):
        assert all(torch.equal(g, g_ref) for g, g_ref in zip(got[0], want[0], strict=True))
        assert got[1] == want[1] == len(weights(eager_module))
        for buffers, buffers_ref in zip(got[2], want[2], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(buffers, buffers_ref, strict=True))
    assert backend.frame_count == 2
    if warm_up:
        caches = weight_caches(compiled_module)
        assert [[b.data_ptr() for b in c.buffers] for c in caches] == addresses


@pytest.mark.parametrize("kind", KINDS)
def test_delayed_scaling_with_caching_stays_refused_under_fullgraph(kind):
    """Delayed scaling's amax history is state no graph holds: a caching call under it
    raises naming DelayedScaling, as a call without caching does."""
    torch._dynamo.reset()
    module = build(kind)
    compiled = torch.compile(forward_of(module), fullgraph=True, backend="aot_eager")
    with pytest.raises(torch._dynamo.exc.Unsupported, match="DelayedScaling"):
        compiled(_input(0), True, recipe.DelayedScaling())


def test_transformer_layer_microbatch_loop_compiles_two_graphs_and_matches_eager(monkeypatch):
    """A composition (MultiheadAttention's fused QKV LayerNormLinear and projection
    Linear, the LayerNormMLP) passes the flag to each GEMM module: the whole layer is
    still one graph per flag value, eager's bits, the weights quantized by the True
    microbatch only."""
    torch._dynamo.reset()
    counter = WeightQuantizations(monkeypatch)
    torch.manual_seed(0)
    eager_module = te.TransformerLayer(
        64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.bfloat16
    )
    compiled_module = copy.deepcopy(eager_module)
    backend = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(forward_of(compiled_module), fullgraph=True, backend=backend)
    breaks = graph_breaks()
    runs = []
    for module, forward in ((eager_module, forward_of(eager_module)), (compiled_module, compiled)):
        optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
        outputs, quantized = [], []
        for s in range(STEPS):
            counter.watch(module)
            counter.take()
            for i, first in enumerate(SCHEDULE):
                x = _input(10 * s + i).transpose(0, 1).contiguous().requires_grad_(True)
                y = forward(x, first, recipe.Float8CurrentScaling())
                y.float().sum().backward()
                outputs.append((y.detach(), x.grad))
                quantized.append(counter.take())
            outputs.append(tuple(p.grad.clone() for p in module.parameters()))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        runs.append((outputs, quantized))
    (want, want_q), (got, got_q) = runs
    for a, b in zip(got, want, strict=True):
        assert all(torch.equal(t, t_ref) for t, t_ref in zip(a, b, strict=True))
    # Counted by storage: the separate Q, K and V weights are concatenated before their
    # quantization, so the watched ones are the projection's, fc1's and fc2's.
    assert got_q == want_q == [3, 0, 0, 0] * STEPS
    # Every GEMM module (the QKV one too) keeps a workspace, compiled as eagerly.
    gemms = [m for m in compiled_module.modules() if isinstance(m, (te.Linear, te.LayerNormLinear))]
    mlps = [m for m in compiled_module.modules() if isinstance(m, te.LayerNormMLP)]
    assert len(gemms) == 2 and len(mlps) == 1
    assert all(m._weight_workspace is not None for m in gemms)
    assert all(w is not None for w in workspaces(mlps[0]))
    assert backend.frame_count == 2
    assert graph_breaks() == breaks


def _cuda_graph_schedule(module, forward, make_recipe):
    """``STEPS`` steps of ``SCHEDULE`` on CUDA, each microbatch's output and gradients
    cloned as soon as it ran (CUDA-graph trees reuse their outputs' memory), then an
    SGD update from the last microbatch's weight gradients."""
    results = []
    recipe_value = make_recipe()
    for s in range(STEPS):
        for i, first in enumerate(SCHEDULE):
            module.zero_grad(set_to_none=True)
            x = _input(10 * s + i).cuda().requires_grad_(True)
            torch.manual_seed(1000 + 10 * s + i)  # stochastic rounding's (seed, offset)
            y = forward(x, first, recipe_value)
            y.float().sum().backward()
            results.append(
                (y.detach().clone(), x.grad.clone(), *(p.grad.clone() for p in module.parameters()))
            )
        with torch.no_grad():
            for p in module.parameters():
                p.sub_(0.5 * p.grad)
    return results


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("kind", KINDS)
def test_microbatch_loop_under_cuda_graphs_matches_eager(kind, name):
    """``mode="reduce-overhead"`` after one eager warm-up (which makes the workspaces
    in ordinary memory): every microbatch of two steps bitwise equal to eager, no
    CUDA-graph skip, the kept buffers never moved (the True graph writes them in
    place, docs/te.md, departure 9)."""
    torch._dynamo.reset()
    eager_module = build(kind).cuda()
    compiled_module = copy.deepcopy(eager_module)
    for module in (eager_module, compiled_module):  # the eager warm-up
        x = _input(99).cuda().requires_grad_(True)
        torch.manual_seed(7)
        forward_of(module)(x, True, RECIPES[name]()).float().sum().backward()
    caches = weight_caches(compiled_module)
    addresses = [[b.data_ptr() for b in cache.buffers] for cache in caches]
    compiled = torch.compile(forward_of(compiled_module), fullgraph=True, mode="reduce-overhead")
    skips, breaks = counters["inductor"]["cudagraph_skips"], graph_breaks()

    want = _cuda_graph_schedule(eager_module, forward_of(eager_module), RECIPES[name])
    got = _cuda_graph_schedule(compiled_module, compiled, RECIPES[name])
    torch.cuda.synchronize()

    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        for j, (t, t_ref) in enumerate(zip(a, b, strict=True)):
            assert torch.equal(t, t_ref), f"microbatch {i}: tensor {j} differs"
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert graph_breaks() == breaks
    assert [[b.data_ptr() for b in cache.buffers] for cache in caches] == addresses
