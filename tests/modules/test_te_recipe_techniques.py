"""TE's recipe techniques in the modules. ``NVFP4BlockScaling()`` with TE's defaults
(random Hadamard transform, stochastic rounding of gradients, 2-D weight blocks) trains
every Linear-family module, eagerly and compiled, bit for bit: each module call draws
its stochastic-rounding (seed, offset) from torch's default generator through one op
call that a compiled graph keeps, so both paths read the same pair from the same
generator state. Also TE's other NVFP4 variants (4over6, row-scaled activations) and
MXFP8's 2-D weight tiles."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from module_cases import graph_breaks, linear_call_bundle, unique_graphs

import transformer_engine_ops as te
from transformer_engine_ops.generated import linear as generated_linear
from transformer_engine_ops.runtime.lowering import Lowerable

DTYPE = torch.bfloat16
SEED = 1234
KINDS = ["linear", "layernorm_linear", "layernorm_mlp", "grouped_linear"]


def make(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "linear":
        return torch.nn.Sequential(
            te.Linear(64, 64, params_dtype=DTYPE), te.Linear(64, 32, params_dtype=DTYPE)
        )
    if kind == "layernorm_linear":
        return te.LayerNormLinear(64, 32, params_dtype=DTYPE)
    if kind == "layernorm_mlp":
        return te.LayerNormMLP(64, 128, params_dtype=DTYPE)
    return GroupedMLP()


class GroupedMLP(torch.nn.Module):
    """A GroupedLinear of 3 GEMMs over fixed splits (multiples of 16 rows, as the
    transform of the input's columnwise data needs)."""

    def __init__(self) -> None:
        super().__init__()
        self.grouped = te.GroupedLinear(3, 64, 32, params_dtype=DTYPE)
        self.splits = [32, 64, 32]

    def forward(self, x: torch.Tensor) -> Any:
        return self.grouped(x.reshape(-1, 64), self.splits)


def make_input() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(4, 32, 64, generator=gen).to(DTYPE)


def step(module: Any, x: torch.Tensor, seed: int = SEED, recipe: Any = None) -> list[Any]:
    """Output, input grad and parameter grads of one step under the default recipe, the
    default generator seeded with ``seed`` (and restored after). The output gradient
    varies per element, so stochastic rounding has something to round."""
    inner = getattr(module, "_orig_mod", module)
    for p in inner.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with te.autocast(recipe=recipe or te.recipe.NVFP4BlockScaling()):
            y = module(x)
        dy = torch.linspace(-2.0, 3.0, y.numel()).reshape(y.shape) ** 3
        y.backward(dy.to(y.dtype))
    return [y.detach(), x.grad, *[p.grad for p in inner.parameters()]]


def assert_bitwise(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a is not None and b is not None, f"entry {i} has no value"
        assert torch.equal(a, b), f"entry {i} differs"


@pytest.mark.parametrize("kind", KINDS)
def test_default_recipe_compiles_bitwise_equal_to_eager(kind):
    module, x = make(kind), make_input()
    eager = step(module, x)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    assert_bitwise(step(compiled, x), eager)
    assert_bitwise(step(compiled, x), eager)  # the second call reuses the graph
    assert graph_breaks() == 0
    assert unique_graphs() == 1


@pytest.mark.slow
def test_default_recipe_compiles_bitwise_equal_to_eager_on_inductor():
    module, x = make("layernorm_mlp"), make_input()
    eager = step(module, x)
    compiled = torch.compile(module, fullgraph=True, backend="inductor")
    assert_bitwise(step(compiled, x), eager)
    assert graph_breaks() == 0


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_depend_on_the_generator_seed_and_only_on_it(kind):
    module, x = make(kind), make_input()
    first = step(module, x, seed=5)
    assert_bitwise(step(module, x, seed=5), first)
    other = step(module, x, seed=6)
    assert torch.equal(other[0], first[0])  # the forward draws no random bits
    param_grads = range(2, len(first))
    assert any(not torch.equal(other[i], first[i]) for i in param_grads)


def test_without_stochastic_rounding_no_generator_state_is_consumed():
    module, x = make("linear"), make_input()
    recipe = te.recipe.NVFP4BlockScaling(disable_stochastic_rounding=True)
    torch.manual_seed(3)
    step(module, x, recipe=recipe)
    after = torch.rand(1)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(1), after)
    assert_bitwise(step(module, x, seed=1, recipe=recipe), step(module, x, seed=2, recipe=recipe))


@pytest.mark.parametrize("kind", KINDS)
def test_default_recipe_gradients_stay_close_to_bf16(kind):
    """Each technique keeps NVFP4's accuracy: the output and every gradient within a
    relative error of the unquantized step (NVFP4 alone: ~10-15% per tensor)."""
    module, x = make(kind), make_input()
    got = step(module, x)
    inner_params = list(module.parameters())
    x_ref = x.detach().clone().requires_grad_(True)
    y = module(x_ref)
    dy = torch.linspace(-2.0, 3.0, y.numel()).reshape(y.shape) ** 3
    y.backward(dy.to(y.dtype))
    ref = [y.detach(), x_ref.grad, *[p.grad for p in inner_params]]
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        err = ((a.float() - b.float()).norm() / b.float().norm()).item()
        assert err < 0.3, f"entry {i}: relative error {err:.3f}"


def _train(recipe: Any) -> list[float]:
    """Ten SGD steps of a LayerNormMLP fitting ``sin(2x)``; the losses."""
    torch.manual_seed(0)
    model = te.LayerNormMLP(64, 128, params_dtype=DTYPE)
    x = make_input().reshape(-1, 64)
    target = torch.sin(x.float() * 2)
    opt = torch.optim.SGD(model.parameters(), lr=20.0)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = model(x)
        loss = (y.float() - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
def test_training_follows_the_unquantized_loss_curve():
    plain = _train(None)
    nvfp4 = _train(te.recipe.NVFP4BlockScaling())
    assert plain[-1] < 0.6 * plain[0]
    assert nvfp4[-1] < 0.6 * nvfp4[0]
    for a, b in zip(nvfp4, plain, strict=True):
        assert abs(a - b) <= 0.25 * b, (nvfp4, plain)


def test_an_op_call_that_rounds_stochastically_never_lowers_into_inductor():
    module, x = make("linear"), make_input()
    with te.autocast(recipe=te.recipe.NVFP4BlockScaling()):
        args = linear_call_bundle(module[0], x)
    assert args.sr_rng_state is not None
    slots = generated_linear.flatten_linear_fwd_args(args)
    assert not Lowerable(generated_linear.FORWARD_SLOTS)(slots)


def test_a_missing_rng_state_names_the_field():
    module, x = make("linear"), make_input().reshape(-1, 64)
    with te.autocast(recipe=te.recipe.NVFP4BlockScaling()):
        args = linear_call_bundle(module[0], x.requires_grad_(True))
    args.sr_rng_state = None
    (y,), _ = generated_linear.linear_eager(args)
    with pytest.raises(ValueError, match=r"LinearBwdArgs.sr_rng_state: .* needs an int64"):
        y.sum().backward()


def test_token_counts_off_the_hadamard_size_are_refused_naming_the_shape():
    module = make("layernorm_linear")
    x = torch.randn(3, 6, 64, dtype=DTYPE, requires_grad=True)
    with te.autocast(recipe=te.recipe.NVFP4BlockScaling()):
        with pytest.raises(ValueError, match=r"multiple of 16, got shape \(18, 64\)"):
            module(x)
    with te.autocast(recipe=te.recipe.NVFP4BlockScaling(disable_rht=True)):
        module(x).sum().backward()


VARIANTS = {
    "4over6_weights": lambda: te.recipe.NVFP4BlockScaling(nvfp4_4over6="weights"),
    "4over6_all": lambda: te.recipe.NVFP4BlockScaling(disable_rht=True, nvfp4_4over6="all"),
    "row_scaled": lambda: te.recipe.NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True),
}


@pytest.mark.parametrize("kind", ["linear", "layernorm_mlp"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_te_nvfp4_variants_compile_bitwise_equal_to_eager(variant, kind):
    """TE's compile tests' other NVFP4 recipes: 4over6 and row-scaled activations."""
    module, x = make(kind), make_input()
    eager = step(module, x, recipe=VARIANTS[variant]())
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    assert_bitwise(step(compiled, x, recipe=VARIANTS[variant]()), eager)
    assert graph_breaks() == 0
    plain = step(module, x, recipe=te.recipe.NVFP4BlockScaling())
    assert not torch.equal(plain[0], eager[0])  # the variant changes the forward


@pytest.mark.parametrize("kind", ["linear", "grouped_linear"])
def test_mxfp8_2d_weights_compile_bitwise_equal_to_eager(kind):
    recipe = te.recipe.MXFP8BlockScaling(enable_2d_quantization=True)
    module, x = make(kind), make_input()
    with torch.no_grad():  # rows of other magnitudes, so tiles and 1x32 blocks differ
        for p in module.parameters():
            if p.dim() == 2:
                p.mul_(torch.logspace(-2, 1, p.shape[0])[:, None].to(p.dtype))
    eager = step(module, x, recipe=recipe)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    assert_bitwise(step(compiled, x, recipe=recipe), eager)
    assert graph_breaks() == 0
    one_d = step(module, x, recipe=te.recipe.MXFP8BlockScaling())
    assert not torch.equal(one_d[0], eager[0])  # the weight's tiles change the forward


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_redraws_the_same_pair(use_reentrant):
    """``torch.utils.checkpoint`` restores the CPU generator before the recomputation,
    so the recomputed forward draws the pair the first forward drew."""
    module, x = make("linear"), make_input()
    plain = step(module, x)

    class Checkpointed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, t: torch.Tensor) -> Any:
            return torch.utils.checkpoint.checkpoint(self.inner, t, use_reentrant=use_reentrant)

    assert_bitwise(step(Checkpointed(), x), plain)
