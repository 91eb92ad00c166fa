"""``is_first_microbatch`` caches nothing without a recipe or with weights already
quantized (``quantized_model_init``), as in TE; every module then compiles such a call
(``fullgraph=True``, no eager fallback) equal to its eager call. With a recipe that
quantizes the weight the call compiles too, caching it (test_compiled_microbatches.py)."""

from __future__ import annotations

import pytest
import torch
from family_cases import make, make_input
from module_cases import assert_bitwise, graph_breaks, step

import transformer_engine_ops as te

AOT = "aot_eager"


class Grouped(torch.nn.Module):
    """GroupedLinear with fixed splits, callable as ``module(x, **kwargs)``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = te.GroupedLinear(3, 64, 48, params_dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        return self.inner(flat, [40, 0, flat.shape[0] - 40], **kwargs)


def build(kind: str) -> torch.nn.Module:
    if kind == "linear":
        torch.manual_seed(0)
        return te.Linear(64, 64, params_dtype=torch.bfloat16)
    if kind == "grouped_linear":
        return Grouped()
    return make(kind)


def x_for(kind: str) -> torch.Tensor:
    x = make_input()
    return x[..., :64].contiguous() if kind in ("linear", "grouped_linear") else x


@pytest.mark.parametrize("kind", ["linear", "layernorm_linear", "grouped_linear"])
def test_bf16_is_first_microbatch_compiles_under_fullgraph(kind):
    module, x = build(kind), x_for(kind)
    eager = step(module, x, "bf16")
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    breaks = graph_breaks()
    for flag in (True, False, None):
        assert_bitwise(step(compiled, x, "bf16", is_first_microbatch=flag), eager)
    assert graph_breaks() == breaks


def test_quantized_model_init_weights_make_linear_caching_inert_and_compile():
    with te.quantized_model_init(recipe=te.recipe.MXFP8BlockScaling()):
        module = build("linear")
    x = x_for("linear")
    eager = step(module, x, "mxfp8")
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    for flag in (True, False):
        assert_bitwise(step(compiled, x, "mxfp8", is_first_microbatch=flag), eager)
    assert module._weight_workspace is None


@pytest.mark.parametrize("kind", ["linear", "layernorm_linear"])
def test_a_workspace_cached_under_a_recipe_never_replaces_the_weight_of_a_bf16_call(kind):
    module, x = build(kind), x_for(kind)
    bf16 = step(module, x, "bf16")
    step(module, x, "fp8_current", is_first_microbatch=True)
    assert module._weight_workspace is not None
    assert_bitwise(step(module, x, "bf16", is_first_microbatch=False), bf16)
