"""LayerNorm and RMSNorm modules: the plain formula, compile equal to eager, dynamic
batch sizes, TE's constructor and state-dict keys."""

from __future__ import annotations

import pytest
import torch
from family_cases import (
    assert_close_to_reference,
    compile_and_compare,
    make,
    make_input,
    reference_step,
)
from module_cases import assert_bitwise, graph_breaks, step, unique_graphs

import transformer_engine_ops as te

NORMS = ["layernorm", "rmsnorm"]


@pytest.mark.parametrize("zero_centered_gamma", [False, True])
@pytest.mark.parametrize("kind", NORMS)
def test_bf16_eager_matches_the_torch_formula(kind, zero_centered_gamma):
    module = make(kind, zero_centered_gamma=zero_centered_gamma)
    x = make_input()
    got = step(module, x, "bf16")
    assert got[0].dtype == torch.bfloat16
    assert_close_to_reference(got, reference_step(module, kind, x), rtol=2e-2)


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
@pytest.mark.parametrize("kind", NORMS)
def test_compiled_is_bitwise_equal_to_eager(kind, recipe):
    compile_and_compare(make(kind), recipe)


@pytest.mark.parametrize("kind", NORMS)
def test_compiled_on_inductor_is_bitwise_equal_to_eager(kind):
    compile_and_compare(make(kind), "bf16", backend="inductor")


@pytest.mark.parametrize("kind", NORMS)
def test_dynamic_batch_sizes_share_one_graph(kind):
    module = make(kind)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager", dynamic=True)
    for batch in (2, 3, 5, 6, 8):
        x = make_input(batch=batch, seed=batch)
        assert_bitwise(step(compiled, x, "bf16"), step(module, x, "bf16"))
    assert unique_graphs() == 1
    assert graph_breaks() == 0


def test_no_grad_forward_matches_the_training_forward():
    module, x = make("layernorm"), make_input()
    with torch.no_grad():
        y = module(x)
    assert torch.equal(y, module(x))


# --- TE's constructor and state dict ----------------------------------------------------


def test_te_positional_arguments_mean_what_they_mean_in_te():
    # TE: (normalized_shape, eps, sequence_parallel, params_dtype, zero_centered_gamma)
    m = te.LayerNorm(64, 1e-3, None, torch.bfloat16, True)
    assert (m.normalized_shape, m.eps, m.zero_centered_gamma) == ((64,), 1e-3, True)
    assert m.weight.dtype == torch.bfloat16 and torch.equal(m.weight, torch.zeros(64))
    assert te.RMSNorm(32, dtype=torch.float16).weight.dtype == torch.float16


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(normalized_shape=(4, 8)), NotImplementedError, "normalized_shape=(4, 8)"),
        (dict(), ValueError, "pass normalized_shape"),
        (dict(normalized_shape=8, unknown=1), TypeError, "unknown"),
    ],
)
def test_bad_constructor_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        te.LayerNorm(**kwargs)


@pytest.mark.parametrize(
    ("cls", "keys"),
    [(te.LayerNorm, {"weight", "bias", "_extra_state"}), (te.RMSNorm, {"weight", "_extra_state"})],
)
def test_state_dict_has_te_keys_and_loads_strictly_both_ways(cls, keys):
    a, b = cls(64), cls(64)
    with torch.no_grad():
        a.weight.normal_()
    state = a.state_dict()
    assert set(state) == keys
    # What TE writes for a module without recipe state: an empty uint8 tensor.
    te_state = {k: v.clone() for k, v in state.items()}
    te_state["_extra_state"] = torch.empty(0, dtype=torch.uint8)
    b.load_state_dict(te_state, strict=True)
    assert torch.equal(b.weight, a.weight)
    a.load_state_dict(b.state_dict(), strict=True)


def test_a_non_empty_extra_state_is_refused_by_name():
    module = te.LayerNorm(8)
    state = module.state_dict()
    state["_extra_state"] = torch.ones(3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="LayerNorm: this _extra_state is a non-empty byte tensor"):
        module.load_state_dict(state)


def _run(module: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
    x = x.detach().requires_grad_()
    out = module(x)
    out.backward(dy)
    return [out, x.grad, *(p.grad for p in module.parameters())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "make_norm",
    [
        lambda: te.LayerNorm(128),
        lambda: te.RMSNorm(128, zero_centered_gamma=True),
        lambda: te.LayerNormLinear(128, 32, normalization="RMSNorm"),
        lambda: te.LayerNormMLP(128, 64),
        lambda: te.modules.L2Normalization(),
    ],
    ids=["LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP", "L2Normalization"],
)
def test_a_transposed_input_gives_the_contiguous_bits(make_norm, dtype):
    """TE reads a non-contiguous input as its contiguous copy (TE's
    ``test_noncontiguous`` allows 1e-7): the output and every gradient are those of
    the contiguous input, bit for bit. The norm's row sums used to follow the input's
    strides (5e-6 apart in the norm weight's gradient)."""
    torch.manual_seed(0)
    module = make_norm().to(dtype)
    x = torch.randn(128, 256).to(dtype).T  # (256, 128), not contiguous
    dy = torch.randn(module(x.contiguous()).shape).to(dtype)
    assert not x.is_contiguous()
    got = _run(module, x, dy)
    module.zero_grad(set_to_none=True)
    want = _run(module, x.contiguous(), dy)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), i


@pytest.mark.parametrize(
    "make_norm",
    [lambda: te.LayerNorm(128), lambda: te.RMSNorm(128), lambda: te.modules.L2Normalization()],
    ids=["LayerNorm", "RMSNorm", "L2Normalization"],
)
def test_a_transposed_output_gradient_gives_the_contiguous_bits(make_norm):
    """The norm backward's sums do not follow the output gradient's strides either."""
    torch.manual_seed(0)
    module = make_norm()
    x = torch.randn(256, 128)
    dy = torch.randn(128, 256).T
    got = _run(module, x, dy)
    module.zero_grad(set_to_none=True)
    want = _run(module, x, dy.contiguous())
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), i


@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_fp32_gradients_at_tes_126m_size_are_within_tes_tolerance_of_float64(kind):
    """TE's ``test_layernorm_accuracy`` at its 126m size (2048 x 2 rows of 768): every
    fp32 gradient within TE's tolerance (atol 1e-4, rtol 1.3e-6) of the float64
    gradient. (torch's CPU ``layer_norm`` backward, TE's reference there, sums the
    weight gradient row by row and lands 1.6e-4 to 2.1e-4 from float64.)"""
    torch.manual_seed(1234)
    module = getattr(te, kind)(768, eps=1e-7)
    x = torch.randn(2048, 2, 768)
    got = _run(module, x, torch.ones(2048, 2, 768))
    x64 = x.double().requires_grad_()
    w64 = module.weight.detach().double().requires_grad_()
    if kind == "LayerNorm":
        b64 = module.bias.detach().double().requires_grad_()
        out = torch.nn.functional.layer_norm(x64, (768,), w64, b64, 1e-7)
        params = [w64, b64]
    else:
        out = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-7) * w64
        params = [w64]
    out.sum().backward()
    for g, want in zip(got[1:], [x64.grad, *(p.grad for p in params)], strict=True):
        assert torch.allclose(g.double(), want, rtol=1.3e-6, atol=1e-4)
