"""Delayed scaling keeps its state per module and per tensor role, carries the amax
history across steps (TE's update at autocast exit and after each backward), and saves
it through ``state_dict``'s ``_extra_state``."""

from __future__ import annotations

import io

import pytest
import torch

from transformer_engine_ops.modules.autocast import autocast, quantized_model_init
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.quantization import DelayedScaling, Format

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def test_weights_made_under_quantized_model_init_each_get_their_own_scale():
    torch.manual_seed(0)
    with quantized_model_init(recipe=DelayedScaling()):
        quantized = [Linear(64, 32), Linear(32, 32)]
    torch.manual_seed(0)
    plain = [Linear(64, 32), Linear(32, 32)]  # the same initial values, unquantized
    for q, p in zip(quantized, plain, strict=True):
        # Scaled from its own amax: E4M3's 3 mantissa bits, nothing clipped or flushed.
        assert rel_err(q.weight.dequantize(), p.weight) < 2**-4
        top = q.weight.dequantize().abs().max()
        torch.testing.assert_close(top, p.weight.abs().max(), rtol=1e-6, atol=0)


def test_two_layers_of_very_different_magnitudes_are_accurate_after_the_first_steps():
    torch.manual_seed(0)
    small, large = Linear(64, 64, bias=False), Linear(64, 64, bias=False)
    with torch.no_grad():
        small.weight.mul_(1e-3)
        large.weight.mul_(1e3)
    errors = []
    for _ in range(5):
        x = torch.randn(16, 64)
        with autocast(recipe=DelayedScaling()):
            h = small(x)
            y = large(h)
        h_ref = x @ small.weight.t()
        errors.append((rel_err(h, h_ref), rel_err(y, h_ref @ large.weight.t())))
    # Steps 0 and 1 run on scales from no (or a garbage) history, as in TE.
    for err_h, err_y in errors[2:]:
        assert err_h < 0.1 and err_y < 0.1, errors


def _ref_cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    fmax = FP8_MAX[dtype]
    return torch.clamp(x.float() * scale, -fmax, fmax).to(dtype).float() / scale


class RefState:
    """The delayed-scaling algorithm, written out for one tensor role."""

    def __init__(self, length: int, algo: str, margin: int, dtype: torch.dtype) -> None:
        self.history = torch.zeros(length)
        self.scale = torch.ones(())
        self.algo, self.margin, self.dtype = algo, margin, dtype

    def cast(self, x: torch.Tensor) -> torch.Tensor:
        amax = x.float().abs().max()
        self.history[0] = torch.maximum(self.history[0], amax)
        return _ref_cast(x, self.scale, self.dtype)

    def update(self) -> None:
        amax = self.history.max() if self.algo == "max" else self.history[0].clone()
        self.history = torch.roll(self.history, -1)
        self.history[0] = 0
        if amax > 0 and torch.isfinite(amax):
            self.scale = torch.tensor(FP8_MAX[self.dtype]) / amax / 2.0**self.margin


@pytest.mark.parametrize(("algo", "length", "margin"), [("max", 3, 0), ("most_recent", 4, 1)])
def test_module_matches_a_step_by_step_replay_of_the_delayed_scaling_algorithm(
    algo, length, margin
):
    torch.manual_seed(0)
    recipe = DelayedScaling(margin=margin, amax_history_len=length, amax_compute_algo=algo)
    layer = Linear(32, 16, bias=False)
    ref = {
        "input": RefState(length, algo, margin, E4M3),
        "weight": RefState(length, algo, margin, E4M3),
        "grad_output": RefState(length, algo, margin, E5M2),
    }
    magnitudes = [1.0, 30.0, 0.01, 5.0, 200.0, 0.5]
    for step, magnitude in enumerate(magnitudes):
        x = (torch.randn(8, 32) * magnitude).requires_grad_(True)
        dy = torch.randn(8, 16) * magnitude
        with autocast(recipe=recipe):
            y = layer(x)
        y.backward(dy)
        # Reference step: forward casts, forward update at autocast exit, backward cast
        # of the output gradient, backward update at the end of the backward.
        xq = ref["input"].cast(x.detach())
        wq = ref["weight"].cast(layer.weight.detach())
        y_ref = xq @ wq.t()
        ref["input"].update()
        ref["weight"].update()
        dyq = ref["grad_output"].cast(dy)
        ref["grad_output"].update()
        # Same quantized operands; only the GEMMs' summation order may differ.
        assert rel_err(y, y_ref) < 1e-6, step
        assert rel_err(layer.weight.grad, dyq.t() @ xq) < 1e-6, step
        state = layer.state_dict()["_extra_state"]
        for i, role in enumerate(("input", "weight")):
            assert torch.equal(state["scale_fwd"][i], ref[role].scale), (step, role)
            assert torch.equal(state["amax_history_fwd"][:, i], ref[role].history), (step, role)
        assert torch.equal(state["scale_bwd"][0], ref["grad_output"].scale), step
        assert torch.equal(state["amax_history_bwd"][:, 0], ref["grad_output"].history), step
        layer.weight.grad = None


def _train(layer: Linear, steps: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    outs = []
    for _ in range(steps):
        x = torch.randn(8, 32, generator=gen) * 10
        with autocast(recipe=DelayedScaling(amax_history_len=8)):
            y = layer(x.requires_grad_(True))
        y.sum().backward()
        outs.append(y.detach())
    return outs


def test_scaling_state_round_trips_through_state_dict_with_weights_only():
    torch.manual_seed(0)
    trained = Linear(32, 16)
    _train(trained, 3, seed=1)
    buf = io.BytesIO()
    torch.save(trained.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state["_extra_state"]["amax_history_fwd"].shape == (8, 3)
    resumed = Linear(32, 16)
    resumed.load_state_dict(state)
    fresh = Linear(32, 16)
    fresh.load_state_dict({k: v for k, v in state.items() if k != "_extra_state"}, strict=False)
    expected = _train(trained, 2, seed=2)
    assert all(
        torch.equal(a, b) for a, b in zip(_train(resumed, 2, seed=2), expected, strict=False)
    )
    # Without the saved state the first step restarts at scale 1: different numbers.
    assert not torch.equal(_train(fresh, 1, seed=2)[0], expected[0])


@pytest.mark.parametrize("extra", [None, torch.empty(0, dtype=torch.uint8)])
def test_a_te_shaped_state_dict_with_empty_extra_state_loads(extra):
    source = Linear(8, 4)
    state = {"weight": source.weight.detach(), "bias": source.bias.detach()}
    state["_extra_state"] = extra
    target = Linear(8, 4)
    target.load_state_dict(state)
    assert torch.equal(target.weight, source.weight)
    assert target.state_dict()["_extra_state"].numel() == 0  # stateless until used


def test_a_pickled_te_extra_state_is_refused_naming_the_remedy():
    target = Linear(8, 4)
    state = dict(target.state_dict())
    state["_extra_state"] = torch.frombuffer(bytearray(b"\x80\x04pickled"), dtype=torch.uint8)
    with pytest.raises(ValueError, match="pickled FP8 metadata.*Drop the '_extra_state'"):
        target.load_state_dict(state)


def test_a_changed_recipe_keeps_the_history_that_still_fits():
    layer = Linear(16, 8)
    x = torch.randn(4, 16) * 7
    with autocast(recipe=DelayedScaling(amax_history_len=4)):
        layer(x)
    before = layer.state_dict()["_extra_state"]["scale_fwd"].clone()
    with autocast(recipe=DelayedScaling(amax_history_len=4, fp8_format=Format.E4M3)):
        layer(x)  # same forward dtype and length: the state carries over
    after = layer.state_dict()["_extra_state"]
    assert after["recipe"]["fp8_format"] == "E4M3"
    assert torch.equal(after["scale_fwd"], before)


def _steps(recipe: DelayedScaling, steps: int = 4) -> tuple[list[torch.Tensor], dict]:
    torch.manual_seed(0)
    layer = Linear(32, 16, bias=False)
    gen = torch.Generator().manual_seed(3)
    outs = []
    for step in range(steps):
        x = (torch.randn(8, 32, generator=gen) * 4.0**step).requires_grad_(True)
        with autocast(recipe=recipe):
            y = layer(x)
        y.backward(torch.randn(8, 16, generator=gen))
        outs.append(
            torch.cat([y.detach().flatten(), x.grad.flatten(), layer.weight.grad.flatten()])
        )
        layer.weight.grad = None
    return outs, layer.state_dict()["_extra_state"]


def test_callable_amax_and_scaling_factor_algorithms_run_at_each_update():
    """TE's callables: ``amax_compute_algo(amax_history)`` (a ``(len, 1)`` history) and
    ``scaling_factor_compute_algo(amax, scale, fp8_max, recipe)``; written as the
    built-in rule, they give the built-in recipe's numbers bit for bit."""
    calls = []

    def amax_of(history: torch.Tensor) -> torch.Tensor:
        assert history.shape == (4, 1)
        return history.max(dim=0).values

    def scale_of(amax, scale, fp8_max, recipe):
        calls.append((fp8_max, recipe.margin, recipe.amax_history_len))
        new = (torch.full_like(amax, fp8_max) / amax) / 2**recipe.margin  # a true division
        return torch.where((amax > 0) & torch.isfinite(amax), new, scale)

    custom = DelayedScaling(
        margin=1,
        amax_history_len=4,
        amax_compute_algo=amax_of,
        scaling_factor_compute_algo=scale_of,
    )
    outs, state = _steps(custom)
    ref_outs, ref_state = _steps(DelayedScaling(margin=1, amax_history_len=4))
    assert all(torch.equal(a, b) for a, b in zip(outs, ref_outs, strict=True))
    for key in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"):
        assert torch.equal(state[key], ref_state[key]), key
    assert {fp8_max for fp8_max, _, _ in calls} == {448.0, 57344.0}
    assert {(m, n) for _, m, n in calls} == {(1, 4)}


def test_a_scaling_factor_algorithm_of_its_own_sets_the_scale():
    halve = DelayedScaling(scaling_factor_compute_algo=lambda amax, scale, fp8_max, r: scale / 2)
    _, state = _steps(halve, steps=3)
    # Three updates of each role a Linear quantizes (input, weight; grad_output): one per
    # autocast exit and one per backward.
    assert torch.equal(state["scale_fwd"][:2], torch.full((2,), 0.125))
    assert torch.equal(state["scale_bwd"][:1], torch.full((1,), 0.125))


def test_a_state_made_with_callables_loads_with_them():
    """The recipe's callables are kept in ``_extra_state`` (a state loaded in process, or
    pickled without ``weights_only``, as TE's pickled recipe is): a resumed module keeps
    updating its scales with them."""
    recipe = DelayedScaling(
        amax_compute_algo=lambda h: h[0], scaling_factor_compute_algo=lambda a, s, m, r: s * 3
    )
    torch.manual_seed(0)
    trained = Linear(32, 16)
    with autocast(recipe=recipe):
        trained(torch.randn(8, 32))
    state = trained.state_dict()
    assert state["_extra_state"]["recipe"]["scaling_factor_compute_algo"] is (
        recipe.scaling_factor_compute_algo
    )
    resumed = Linear(32, 16)
    resumed.load_state_dict(state)
    with autocast(recipe=recipe):
        resumed(torch.randn(8, 32))
    assert torch.equal(resumed.state_dict()["_extra_state"]["scale_fwd"][:2], torch.full((2,), 9.0))
