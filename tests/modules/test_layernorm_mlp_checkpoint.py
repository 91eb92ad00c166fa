"""``LayerNormMLP(checkpoint=True)``, TE's selective recompute: the forward keeps no
activation (nothing but the inputs and the weights it read), the backward recomputes
the norm, fc1 and the activation with the forward's kernels and quantizers, and skips
fc2's GEMM. Outputs and gradients are the bits of ``checkpoint=False`` in every recipe
(delayed scaling too, whose scale has moved by the backward), eager and compiled, with
TE's call patterns (microbatches, frozen weights, ``return_layernorm_output``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from family_cases import FFN, make, make_input
from module_cases import RECIPES, assert_bitwise, cloned, graph_breaks, recipe_context, step

import transformer_engine_ops as te
from transformer_engine_ops.ops import linear as linear_op

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.memory import SavedTensors  # noqa: E402

KIND = "layernorm_mlp"
AOT = "aot_eager"
CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=CUDA)]


def _pair(device: str = "cpu", **kwargs: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same module (same seed, same parameters) with and without checkpoint."""
    return (
        make(KIND, checkpoint=True, **kwargs).to(device),
        make(KIND, checkpoint=False, **kwargs).to(device),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_gradients_are_the_bits_of_the_kept_activations(recipe, bias, device):
    checkpointed, plain = _pair(device, bias=bias)
    x = make_input().to(device)
    assert_bitwise(cloned(step(checkpointed, x, recipe)), cloned(step(plain, x, recipe)))


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_compiled_equals_eager(recipe):
    module, x = make(KIND, checkpoint=True), make_input()
    eager = step(module, x, recipe)
    got = step(torch.compile(module, fullgraph=True, backend=AOT), x, recipe)
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("recipe", "activation"), [("bf16", "gelu"), ("fp8_current", "swiglu")])
def test_compiled_on_inductor_equals_eager_and_the_plain_module(recipe, activation, device):
    checkpointed, plain = _pair(device, activation=activation)
    x = make_input().to(device)
    eager = cloned(step(plain, x, recipe))
    assert_bitwise(cloned(step(torch.compile(checkpointed, fullgraph=True), x, recipe)), eager)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "mxfp8"])
def test_cuda_graphs_replay_the_recompute(recipe):
    checkpointed, plain = _pair("cuda")
    x = make_input().cuda()
    eager = cloned(step(plain, x, recipe))
    compiled = torch.compile(checkpointed, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        assert_bitwise(cloned(step(compiled, x, recipe)), eager)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(activation="clamped_swiglu", activation_params={"limit": 0.5}),
        dict(activation="srelu", normalization="RMSNorm", zero_centered_gamma=True),
        dict(activation="geglu", return_layernorm_output=True),
        dict(return_layernorm_output=True, return_bias=True),
    ],
    ids=["clamped_swiglu", "srelu-rmsnorm-zc", "geglu-ln_out", "ln_out-return_bias"],
)
@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_activations_norms_and_returned_outputs(recipe, kwargs):
    checkpointed, plain = _pair(**kwargs)
    x = make_input()

    def run(module: torch.nn.Module) -> tuple[Any, ...]:
        for p in module.parameters():
            p.grad = None
        xi = x.clone().requires_grad_(True)
        with recipe_context(recipe):
            out = module(xi)
        outs = out if isinstance(out, tuple) else (out,)
        # Every returned tensor reaches the loss (the norm output's gradient too).
        sum(o.float().sum() * (i + 1) for i, o in enumerate(outs)).backward()
        return [o.detach() for o in outs], xi.grad, [p.grad for p in module.parameters()]

    got, want = run(checkpointed), run(plain)
    for a, b in zip(got[0], want[0], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(got[1], want[1])
    for a, b in zip(got[2], want[2], strict=True):
        assert torch.equal(a, b)


def _sanity(module: torch.nn.Module, recipe: str, microbatching: bool, skip: str) -> list[Any]:
    """TE's ``_test_sanity_common``: frozen weights (skip_wgrad) or an input without
    gradient (skip_dgrad), one call or two microbatches, then ``out.sum().backward()``."""
    if skip == "wgrad":
        for p in module.parameters():
            p.requires_grad_(False)
    x = make_input().requires_grad_(skip != "dgrad")
    with recipe_context(recipe):
        if microbatching:
            module(x, is_first_microbatch=True)
            out = module(x, is_first_microbatch=False)
        else:
            out = module(x)
    out.sum().backward()
    return [out.detach(), x.grad, *(p.grad for p in module.parameters())]


@pytest.mark.parametrize("skip", ["none", "wgrad", "dgrad"])
@pytest.mark.parametrize("microbatching", [True, False], ids=["microbatches", "one_call"])
@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "nvfp4", "fp8_block"])
def test_te_sanity_call_patterns(recipe, microbatching, skip):
    checkpointed, plain = _pair()
    got = _sanity(checkpointed, recipe, microbatching, skip)
    want = _sanity(plain, recipe, microbatching, skip)
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        assert a is None or torch.equal(a, b)


def test_microbatches_compile_equal_to_eager():
    module, x = make(KIND, checkpoint=True), make_input()

    def two(m: Any) -> tuple[Any, ...]:
        return step(m, x, "fp8_current", is_first_microbatch=True), step(
            m, x, "fp8_current", is_first_microbatch=False
        )

    eager = two(module)
    fresh = make(KIND, checkpoint=True)  # the same parameters, no workspace yet
    compiled = two(torch.compile(fresh, fullgraph=True, backend=AOT))
    assert graph_breaks() == 0
    for a, b in zip(compiled, eager, strict=True):
        assert_bitwise(a, b)
    # The first microbatch kept the workspaces the later one (and its recompute) read.
    assert fresh._fc1_weight_workspace is not None
    assert fresh._fc2_weight_workspace is not None


def test_quantized_model_init_weights():
    with te.quantized_model_init(recipe=RECIPES["fp8_block"]()):
        checkpointed, plain = _pair()
    x = make_input()
    assert_bitwise(step(checkpointed, x, "fp8_block"), step(plain, x, "fp8_block"))


def _delayed_steps(module: torch.nn.Module, steps: int = 3) -> list[Any]:
    recipe = te.recipe.DelayedScaling(amax_history_len=4)
    results = []
    for i in range(steps):
        x = make_input(seed=i).requires_grad_(True)
        for p in module.parameters():
            p.grad = None
        with te.autocast(recipe=recipe):
            out = module(x, is_first_microbatch=None if i < 2 else True)
        out.sum().backward()
        results.append((out.detach(), x.grad, [p.grad for p in module.parameters()]))
    return results


def _tensors(state: Any) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for key in sorted(state) for t in _tensors(state[key])]
    return []


def test_delayed_scaling_recomputes_with_the_forward_scales():
    """Delayed scaling's scale is updated when the autocast region exits, before the
    backward: the recompute quantizes with the forward's scales, and records no amax
    into the recipe's state (the histories and scales equal the plain module's)."""
    checkpointed, plain = _pair()
    got, want = _delayed_steps(checkpointed), _delayed_steps(plain)
    for a, b in zip(got, want, strict=True):
        assert_bitwise(a, b)
    state, ref = checkpointed.state_dict()["_extra_state"], plain.state_dict()["_extra_state"]
    pairs = list(zip(_tensors(state), _tensors(ref), strict=True))
    assert pairs
    for a, b in pairs:
        assert torch.equal(a, b)
    # The scales did move between the steps: a recompute at the current scale would differ.
    assert not torch.equal(state["scale_fwd"], torch.ones_like(state["scale_fwd"]))


def test_fused_wgrad_accumulation_into_main_grad():
    checkpointed, plain = _pair(fuse_wgrad_accumulation=True)
    x = make_input()
    outs = []
    for module in (checkpointed, plain):
        for w in (module.fc1_weight, module.fc2_weight):
            w.main_grad = torch.ones(w.shape, dtype=torch.float32)
        outs.append(step(module, x, "fp8_current", is_first_microbatch=False))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert torch.equal(checkpointed.fc1_weight.main_grad, plain.fc1_weight.main_grad)
    assert torch.equal(checkpointed.fc2_weight.main_grad, plain.fc2_weight.main_grad)
    assert not torch.equal(plain.fc1_weight.main_grad, torch.ones_like(plain.fc1_weight.main_grad))


# --- what is kept, and what the backward runs ------------------------------------------


def _saved_bytes(module: torch.nn.Module, recipe: str, compiled: bool) -> tuple[int, int]:
    """(bytes kept besides the parameters and the input, bytes of those two)."""
    run = torch.compile(module, fullgraph=True, backend=AOT) if compiled else module
    x = make_input().requires_grad_(True)
    record = SavedTensors()
    with record.hooks(), recipe_context(recipe):
        run(x)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    params.add(x.untyped_storage().data_ptr())
    own = sum(n for n, ptr in record.saved if ptr not in params)
    shared = sum(n for n, ptr in record.saved if ptr in params)
    return own, shared


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_only_the_inputs_are_kept(recipe, compiled):
    checkpointed, plain = _pair()
    own, _ = _saved_bytes(checkpointed, recipe, compiled)
    plain_own, _ = _saved_bytes(plain, recipe, compiled)
    # Without checkpoint: the norm statistics, fc1's output and both GEMMs' inputs (and
    # quantized weight copies); with it, nothing of its own.
    assert own == 0
    assert plain_own > make_input().numel() * 2


def test_the_backward_recomputes_fc1_and_not_fc2(monkeypatch):
    calls: list[int] = []
    gemm = linear_op.gemm

    def counting(*args: Any, **kwargs: Any) -> Any:
        out = gemm(*args, **kwargs)
        calls.append(out.shape[-1])
        return out

    monkeypatch.setattr(linear_op, "gemm", counting)
    counts = []
    for module in _pair():
        calls.clear()
        step(module, make_input(), "fp8_current")
        counts.append(list(calls))
    checkpointed, plain = counts
    # One GEMM more: fc1's forward (its output has 2 * 64 features here, fc2's 64).
    assert len(checkpointed) == len(plain) + 1
    extra = list(checkpointed)
    for n in plain:
        extra.remove(n)
    assert extra == [FFN]


def test_without_grad_nothing_is_recomputed_or_kept():
    checkpointed, plain = _pair()
    x = make_input()
    with torch.no_grad():
        assert torch.equal(checkpointed(x), plain(x))
