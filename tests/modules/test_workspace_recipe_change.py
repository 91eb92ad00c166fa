"""A weight kept across microbatches (``is_first_microbatch``) is read only under the
quantizer that made it: a first microbatch under one recipe, then a later one under
another (another type, or the same type with other settings), quantizes the weight
afresh, eagerly and compiled, for every module that caches a weight. TE drops its
cached weights when the recipe type changes and warns; the warning is TE's text."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from family_cases import make
from module_cases import graph_breaks, unique_graphs

import transformer_engine_ops as te
from transformer_engine_ops import recipe

KINDS = ["linear", "layernorm_linear", "layernorm_mlp", "grouped_linear"]
SPLITS = [32, 0, 96]  # GroupedLinear's rows per GEMM (128 rows in all)

# (first microbatch's recipe, later microbatch's recipe): the two pairs of
# types, and two pairs of one type whose weight quantizer differs.
PAIRS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "current->mxfp8": (recipe.Float8CurrentScaling, recipe.MXFP8BlockScaling),
    "block->nvfp4": (recipe.Float8BlockScaling, recipe.NVFP4BlockScaling),
    # fp32 scales: power-of-2 ones can coincide for a 128x128 block and its rows.
    "block 2d->1d weights": (
        lambda: recipe.Float8BlockScaling(use_f32_scales=True),
        lambda: recipe.Float8BlockScaling(use_f32_scales=True, w_block_scaling_dim=1),
    ),
    "nvfp4 2d->1d weights": (
        recipe.NVFP4BlockScaling,
        lambda: recipe.NVFP4BlockScaling(disable_2d_quantization=True),
    ),
}
TYPE_CHANGES = {"current->mxfp8", "block->nvfp4"}


class Grouped(torch.nn.Module):
    """GroupedLinear with fixed splits, callable as ``module(x, is_first_microbatch=)``."""

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


def _input(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 64, 64, generator=gen).to(torch.bfloat16).requires_grad_(True)


def forward_of(module: torch.nn.Module) -> Callable[..., torch.Tensor]:
    def forward(x: torch.Tensor, first: bool | None, recipe_value: Any) -> torch.Tensor:
        with te.autocast(recipe=recipe_value):
            return module(x, is_first_microbatch=first)

    return forward


def run(forward: Callable[..., torch.Tensor], x: torch.Tensor, first: bool | None, made: Any):
    """One microbatch: (output, input gradient), stochastic rounding seeded per call."""
    torch.manual_seed(7)
    x = x.detach().requires_grad_(True)
    y = forward(x, first, made)
    y.float().sum().backward()
    return y.detach(), x.grad


def _changed_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "Recipe type changed" in str(w.message)]


@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_later_microbatch_under_another_recipe_quantizes_afresh(kind, pair):
    """True under the first recipe, then False under the second: the output and input
    gradient are the second recipe's own (a module that never cached anything, run
    with False under it), bit for bit, not the first recipe's weight copy's."""
    first, later = PAIRS[pair]
    module = build(kind)
    reference = copy.deepcopy(module)
    x0, x1 = _input(0), _input(1)
    run(forward_of(module), x0, True, first())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y, dx = run(forward_of(module), x1, False, later())
    y_ref, dx_ref = run(forward_of(reference), x1, False, later())
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    if pair in TYPE_CHANGES:
        a, b = type(first()).__name__, type(later()).__name__
        assert _changed_warnings(caught) == [
            f"Recipe type changed from {a} to {b}. This may affect model behavior."
        ]
    else:
        assert _changed_warnings(caught) == []
    # The kept copy is now the second recipe's: a further False reads it (no error).
    y2, _ = run(forward_of(module), x1, False, later())
    assert torch.equal(y2, y_ref)


def test_a_later_microbatch_under_an_equal_weight_quantizer_reads_the_kept_weight():
    """Another recipe value whose weight quantizer is the same (HYBRID and E4M3 both
    quantize forward tensors to E4M3) reads the kept copy: it is the right one. The
    weight is changed after the first microbatch, so reading the copy shows."""
    module = build("linear")
    twin = copy.deepcopy(module)
    for m in (module, twin):
        run(forward_of(m), _input(0), True, recipe.Float8CurrentScaling())
        with torch.no_grad():
            m.weight.mul_(2)
    kept = module._weight_workspace
    e4m3 = recipe.Float8CurrentScaling(fp8_format=recipe.Format.E4M3)
    y, _ = run(forward_of(module), _input(1), False, e4m3)
    y_kept, _ = run(forward_of(twin), _input(1), False, recipe.Float8CurrentScaling())
    y_fresh, _ = run(forward_of(copy.deepcopy(module)), _input(1), None, e4m3)
    assert module._weight_workspace is kept
    assert torch.equal(y, y_kept) and not torch.equal(y, y_fresh)


def test_the_recipe_type_warning_is_te_s_and_only_on_a_change_of_type():
    """TE's rule: warn when a module's forward runs under a recipe whose class is not a
    subclass or superclass of its last quantized forward's; an unquantized forward in
    between changes nothing; each change warns."""
    module = build("linear")
    x = _input(0)
    schedule = [
        (recipe.Float8CurrentScaling(), []),
        (recipe.Float8CurrentScaling(fp8_format=recipe.Format.E4M3), []),
        (None, []),
        (recipe.MXFP8BlockScaling(), ["Float8CurrentScaling to MXFP8BlockScaling"]),
        (recipe.MXFP8BlockScaling(), []),
        (recipe.Float8CurrentScaling(), ["MXFP8BlockScaling to Float8CurrentScaling"]),
    ]
    for made, expected in schedule:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with te.autocast(enabled=made is not None, recipe=made):
                module(x)
        assert _changed_warnings(caught) == [
            f"Recipe type changed from {e}. This may affect model behavior." for e in expected
        ]


@pytest.mark.slow
@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("kind", KINDS)
def test_compiled_a_later_microbatch_under_another_recipe_quantizes_afresh(kind, pair):
    """Compiled (fullgraph): the flag-False graph is guarded on the quantizer the kept
    copy was made by, so under the second recipe it quantizes the weight (and keeps its
    copy), and the next flag-False graph reads that copy. Every call gives the bits of
    an eager module that caches nothing (the weights do not change in between), with no
    graph break, in four graphs: True under the first recipe (reused by its second
    True, which does not read the kept copy), False under the second recipe without a
    fitting copy, then with one, and False under the first recipe."""
    first, later = PAIRS[pair]
    module = build(kind)
    reference = forward_of(copy.deepcopy(module))
    compiled = torch.compile(forward_of(module), fullgraph=True, backend="aot_eager")
    breaks = graph_breaks()
    schedule = [(True, first), (False, later), (False, later), (True, first), (False, first)]
    for i, (flag, make_recipe) in enumerate(schedule):
        got = run(compiled, _input(i), flag, make_recipe())
        want = run(reference, _input(i), None, make_recipe())
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (i, flag)
    assert graph_breaks() == breaks
    assert unique_graphs() == 4
