"""LayerNormMLP's ``forward(inp, is_first_microbatch)``: fc1's and fc2's weights are
quantized on the first microbatch and the quantized copies reused on later ones (no
weight quantizer runs again), with outputs and gradients equal to the uncached path;
inert without a recipe; under torch.compile a quantized cached call compiles
(``fullgraph=True``), as Linear's does (tests/modules/test_compiled_microbatches.py). TE's forward has no ``fp8_output``, and neither has ours."""

from __future__ import annotations

import copy
import inspect
import warnings

import pytest
import torch
from family_cases import make, make_input
from module_cases import (
    QUANTIZED,
    assert_bitwise,
    graph_breaks,
    recipe_context,
    step,
    unique_graphs,
)

import transformer_engine_ops as te
from transformer_engine_ops.quantization.quantizer import Quantizer
from transformer_engine_ops.runtime.fallback import EagerFallbackWarning

KIND = "layernorm_mlp"
AOT = "aot_eager"


class WeightQuantizations:
    """Counts ``Quantizer.quantize`` calls on either GEMM weight of ``module``."""

    def __init__(self, module: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
        self.module, self.count = module, 0
        original = Quantizer.quantize

        def counting(quantizer, t):
            weights = {self.module.fc1_weight.data_ptr(), self.module.fc2_weight.data_ptr()}
            self.count += t.data_ptr() in weights
            return original(quantizer, t)

        monkeypatch.setattr(Quantizer, "quantize", counting)

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_later_microbatches_reuse_both_quantized_weights_and_match_the_uncached_path(
    recipe, monkeypatch
):
    cached, plain, x = make(KIND), make(KIND), make_input()
    calls = WeightQuantizations(cached, monkeypatch)
    workspaces = []
    for first, quantized in ((True, 2), (False, 0), (False, 0), (True, 2), (False, 0)):
        got = step(cached, x, recipe, is_first_microbatch=first)
        assert calls.take() == quantized, f"is_first_microbatch={first}"
        assert_bitwise(got, step(plain, x, recipe))
        workspaces.append((cached._fc1_weight_workspace, cached._fc2_weight_workspace))
    assert all(w is not None for pair in workspaces for w in pair)
    assert workspaces[0][0] is workspaces[1][0] is workspaces[2][0]
    assert workspaces[0][1] is workspaces[1][1] is workspaces[2][1]
    # The next first microbatch quantizes them into the kept ones, in place (TE's
    # update_workspace): the same objects, at the same addresses.
    assert workspaces[3][0] is workspaces[0][0] and workspaces[3][1] is workspaces[0][1]


def test_the_uncached_path_quantizes_both_weights_on_every_call(monkeypatch):
    module, x = make(KIND), make_input()
    calls = WeightQuantizations(module, monkeypatch)
    for _ in range(2):
        step(module, x, "fp8_current")
        assert calls.take() == 2
    assert module._fc1_weight_workspace is None and module._fc2_weight_workspace is None


def test_later_microbatches_use_the_kept_weights_as_they_were():
    """TE's contract: a weight changed after the first microbatch changes nothing until
    the next first microbatch."""
    module, x = make(KIND), make_input()
    first = step(module, x, "mxfp8", is_first_microbatch=True)
    with torch.no_grad():
        module.fc1_weight.mul_(2)
        module.fc2_weight.mul_(3)
    later = step(module, x, "mxfp8", is_first_microbatch=False)
    assert torch.equal(later[0], first[0])
    refreshed = step(module, x, "mxfp8", is_first_microbatch=True)
    assert not torch.equal(refreshed[0], first[0])


def test_weights_kept_under_no_grad_are_remade_when_a_backward_reads_them(monkeypatch):
    module, plain, x = make(KIND), make(KIND), make_input()
    with torch.no_grad(), recipe_context("fp8_block"):
        module(x, is_first_microbatch=True)
    assert not module._fc1_weight_workspace.columnwise_usage
    calls = WeightQuantizations(module, monkeypatch)
    got = step(module, x, "fp8_block", is_first_microbatch=False)
    assert calls.take() == 2
    assert module._fc1_weight_workspace.columnwise_usage
    assert module._fc2_weight_workspace.columnwise_usage
    assert_bitwise(got, step(plain, x, "fp8_block"))


def test_inference_microbatches_reuse_the_weights(monkeypatch):
    module, x = make(KIND), make_input()
    calls = WeightQuantizations(module, monkeypatch)
    with torch.no_grad(), recipe_context("nvfp4"):
        plain = module(x)
        assert calls.take() == 2
        outs = [module(x, is_first_microbatch=first) for first in (True, False, False)]
    assert calls.take() == 2
    for out in outs:
        assert torch.equal(out, plain)


@pytest.mark.parametrize("first", [True, False])
def test_bf16_accepts_is_first_microbatch_and_compiles_it_in_one_graph(first):
    module, x = make(KIND), make_input()
    eager = step(module, x, "bf16")
    assert_bitwise(step(module, x, "bf16", is_first_microbatch=first), eager)
    assert module._fc1_weight_workspace is None
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    for flag in (None, first, not first) * 2:
        assert_bitwise(step(compiled, x, "bf16", is_first_microbatch=flag), eager)
    # Dynamo specializes on the Python constant: one graph per value, none broken.
    assert graph_breaks() == 0 and unique_graphs() == 3


def test_quantized_weights_make_is_first_microbatch_inert_and_compile():
    with te.quantized_model_init(recipe=te.recipe.MXFP8BlockScaling()):
        module = make(KIND)
    x = make_input()
    eager = step(module, x, "mxfp8")
    assert_bitwise(step(module, x, "mxfp8", is_first_microbatch=True), eager)
    assert module._fc1_weight_workspace is None and module._fc2_weight_workspace is None
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    for first in (True, False, True):
        assert_bitwise(step(compiled, x, "mxfp8", is_first_microbatch=first), eager)
    assert graph_breaks() == 0 and unique_graphs() == 2  # one per flag value


def test_compiled_microbatches_compile_under_fullgraph_and_match_eager(monkeypatch):
    eager_module = make(KIND)
    module = copy.deepcopy(eager_module)
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    x = make_input()
    calls = WeightQuantizations(module, monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for first in (True, False, False):
            got = step(compiled, x, "fp8_current", is_first_microbatch=first)
            assert calls.take() == (2 if first else 0)
            want = step(eager_module, x, "fp8_current", is_first_microbatch=first)
            assert_bitwise(got, want)
    fallbacks = [w for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert fallbacks == []
    assert module._fc1_weight_workspace is not None


def test_forward_takes_te_2_20_2s_arguments_and_no_fp8_output():
    # TE 2.20.2, pytorch/module/layernorm_mlp.py: LayerNormMLP.forward(self, inp,
    # is_first_microbatch=None); fp8_output is set internally (userbuffers only).
    params = inspect.signature(te.LayerNormMLP.forward).parameters
    assert [(n, p.default) for n, p in params.items()] == [
        ("self", inspect.Parameter.empty),
        ("inp", inspect.Parameter.empty),
        ("is_first_microbatch", None),
    ]
    with pytest.raises(TypeError, match="fp8_output"):
        make(KIND)(make_input(), fp8_output=True)


def test_delayed_scaling_microbatches_reuse_the_weights_of_the_first(monkeypatch):
    module, plain, x = make(KIND), make(KIND), make_input()
    calls = WeightQuantizations(module, monkeypatch)
    for first in (True, False, False):
        with te.autocast(recipe=te.recipe.DelayedScaling()):
            got = module(x, is_first_microbatch=first)
            want = plain(x)
        assert calls.take() == (2 if first else 0)
        # The weights keep the first microbatch's scale (TE's rule), the plain twin's
        # follow the history: close, not bitwise.
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert err < 0.1, err
