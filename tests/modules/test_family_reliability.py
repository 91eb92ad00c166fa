"""Linear's reliability guarantees, for the Linear family: activation checkpointing
recomputes under the recipe of the original forward (``te.checkpoint`` and
``torch.utils.checkpoint``); delayed scaling keeps its state per module and per GEMM
(LayerNormMLP's fc1 and fc2 apart, as TE keeps FP8 metadata per GEMM), seeds
``quantized_model_init`` weights from their own amax, and saves it in ``_extra_state``
(``weights_only=True``); recipes are per thread."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint
from family_cases import HIDDEN, make, make_input, ref_norm
from module_cases import QUANTIZED, RECIPES

import transformer_engine_ops as te
from transformer_engine_ops.quantization import DelayedScaling

MLP = "layernorm_mlp"


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


# --- activation checkpointing -------------------------------------------------------


def _grouped() -> torch.nn.Module:
    torch.manual_seed(0)
    grouped = te.GroupedLinear(2, HIDDEN, 32, params_dtype=torch.bfloat16)

    class Split(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.grouped = grouped

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.grouped(x.reshape(-1, HIDDEN), [64, 64])

    return Split()


def _module(kind: str) -> torch.nn.Module:
    return _grouped() if kind == "grouped_linear" else make(kind)


def _grads(module, recipe, x, reentrant, checkpoint_fn=checkpoint.checkpoint):
    x = x.detach().requires_grad_(True)
    with te.autocast(recipe=RECIPES[recipe]()):
        if reentrant is None:
            y = module(x)
        else:
            y = checkpoint_fn(module, x, use_reentrant=reentrant)
    y.float().pow(2).sum().backward()  # outside autocast, as usual
    params = list(getattr(module, "_orig_mod", module).parameters())
    grads = [p.grad.clone() for p in params] + [x.grad.clone()]
    for p in params:
        p.grad = None
    return y.detach(), grads


def _assert_equal_runs(a, b):
    assert torch.equal(a[0], b[0])
    for i, (ga, gb) in enumerate(zip(a[1], b[1], strict=True)):
        assert torch.equal(ga, gb), f"gradient {i} differs"


CHECKPOINT_CASES = [(MLP, r) for r in QUANTIZED] + [
    ("layernorm_linear", "mxfp8"),
    ("grouped_linear", "fp8_current"),
]


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
@pytest.mark.parametrize(("kind", "recipe"), CHECKPOINT_CASES)
def test_checkpoint_recomputes_under_the_forwards_recipe(kind, recipe, reentrant):
    module, x = _module(kind), make_input()
    plain = _grads(module, recipe, x, None)
    _assert_equal_runs(_grads(module, recipe, x, reentrant), plain)


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_te_checkpoint_of_a_compiled_layernorm_mlp_equals_the_plain_run(reentrant):
    module, x = make(MLP), make_input()
    plain = _grads(module, "fp8_block", x, None)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    got = _grads(compiled, "fp8_block", x, reentrant, checkpoint_fn=te.checkpoint)
    _assert_equal_runs(got, plain)


def test_checkpoint_inside_a_fullgraph_compiled_region_equals_the_plain_run():
    module, x = make(MLP), make_input()
    plain = _grads(module, "nvfp4", x, None)
    compiled = torch.compile(
        lambda t: checkpoint.checkpoint(module, t, use_reentrant=False),
        fullgraph=True,
        backend="aot_eager",
    )
    x = x.detach().requires_grad_(True)
    with te.autocast(recipe=RECIPES["nvfp4"]()):
        y = compiled(x)
    y.float().pow(2).sum().backward()
    got = (y.detach(), [p.grad for p in module.parameters()] + [x.grad])
    _assert_equal_runs(got, plain)


# --- delayed scaling: per module, per GEMM ----------------------------------------


def _mlp_reference(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    p = {n: t.detach().float() for n, t in module.named_parameters()}
    ln = ref_norm(x.float(), "LayerNorm", p["layer_norm_weight"], p["layer_norm_bias"])
    h = F.gelu(F.linear(ln, p["fc1_weight"]), approximate="tanh")
    return F.linear(h, p["fc2_weight"])


def _far_apart_mlp() -> torch.nn.Module:
    """fc1's weights around 1e-4, fc2's around 1e2: one shared per-tensor FP8 scale
    flushes fc1's weights (and fc2's tiny inputs) to zero."""
    module = make(MLP, bias=False, dtype=torch.float32)
    with torch.no_grad():
        module.fc1_weight.mul_(1e-3)
        module.fc2_weight.mul_(1e3)
    return module


def _delayed_steps(module, steps, seed=0):
    outs = []
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, HIDDEN, generator=gen)
        with te.autocast(recipe=DelayedScaling()):
            y = module(x)
        y.sum().backward()
        outs.append((x, y.detach()))
    return outs


def test_fc1_and_fc2_keep_their_own_delayed_scaling_state_and_stay_accurate():
    module = _far_apart_mlp()
    errors = [rel_err(y, _mlp_reference(module, x)) for x, y in _delayed_steps(module, 5)]
    # Steps 0 and 1 run on scales from no (or a garbage) history, as in TE.
    assert max(errors[2:]) < 0.1, errors
    state = module.state_dict()["_extra_state"]
    fc1_weight_scale, fc2_weight_scale = state["scale_fwd"][1], state["fc2"]["scale_fwd"][1]
    assert fc1_weight_scale > 1e3 * fc2_weight_scale


def test_layernorm_mlp_scaling_state_round_trips_through_weights_only_load():
    trained = _far_apart_mlp()
    _delayed_steps(trained, 3)
    buffer = io.BytesIO()
    torch.save(trained.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert set(state["_extra_state"]) >= {"scale_fwd", "amax_history_fwd", "fc2"}
    fresh = make(MLP, bias=False, dtype=torch.float32, seed=5)
    fresh.load_state_dict(state, strict=True)
    ((x, want),) = _delayed_steps(trained, 1, seed=9)
    ((_, got),) = _delayed_steps(fresh, 1, seed=9)
    assert torch.equal(got, want)
    for key in ("scale_fwd", "scale_bwd", "amax_history_fwd", "amax_history_bwd"):
        assert torch.equal(
            fresh.state_dict()["_extra_state"]["fc2"][key],
            trained.state_dict()["_extra_state"]["fc2"][key],
        )


def test_quantized_model_init_weights_each_get_their_own_delayed_scale():
    def small(w):
        torch.nn.init.normal_(w, std=1e-3)

    torch.manual_seed(0)
    with te.quantized_model_init(recipe=DelayedScaling()):
        quantized = te.LayerNormMLP(
            HIDDEN, 128, init_method=small, output_layer_init_method=lambda w: w.normal_()
        )
    torch.manual_seed(0)
    plain = te.LayerNormMLP(
        HIDDEN, 128, init_method=small, output_layer_init_method=lambda w: w.normal_()
    )
    for name in ("fc1_weight", "fc2_weight"):
        q, p = getattr(quantized, name), getattr(plain, name)
        assert rel_err(q.dequantize(), p) < 2**-4, name
        torch.testing.assert_close(q.dequantize().abs().max(), p.abs().max(), rtol=1e-6, atol=0)


# --- threads ------------------------------------------------------------------------


def test_layernorm_mlp_in_threads_under_different_recipes_matches_each_alone():
    from module_cases import run_in_threads, step

    x = make_input()
    names = [f"{r}#{i}" for r in ["bf16", *QUANTIZED] for i in range(2)]
    alone = {n: step(make(MLP), x, n.split("#")[0]) for n in names}
    modules = {n: make(MLP) for n in names}  # built here: the init RNG is global
    results = run_in_threads(
        lambda n: [step(modules[n], x, n.split("#")[0]) for _ in range(2)], names
    )
    for n, runs in results.items():
        for got in runs:
            want = alone[n]
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), n
            for a, b in zip(got[2], want[2], strict=True):
                assert torch.equal(a, b), n
