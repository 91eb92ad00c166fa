"""``torch.func`` over the modules: ``functional_call`` (no transform) works; every
transform is refused naming the module and what is supported, eagerly and compiled,
instead of torch's generic error about ``setup_context`` from inside an op."""

from __future__ import annotations

import pytest
import torch
from torch import func

import transformer_engine_ops as te

MESSAGE = (
    r"^{name}: torch\.func transforms \(grad, vmap, jvp, vjp, jacrev, jacfwd, hessian\) are "
    r"not supported: .* Supported: torch\.autograd \(loss\.backward\(\), torch\.autograd\.grad"
    r".*torch\.compile; torch\.func\.functional_call outside a transform"
)


def _linear() -> te.Linear:
    torch.manual_seed(0)
    return te.Linear(8, 4)


def _x() -> torch.Tensor:
    return torch.randn(3, 8, generator=torch.Generator().manual_seed(1))


TRANSFORMS = {
    "grad": lambda f, x: func.grad(lambda t: f(t).sum())(x),
    "vmap": lambda f, x: func.vmap(lambda row: f(row.unsqueeze(0)))(x),
    "jvp": lambda f, x: func.jvp(f, (x,), (torch.ones_like(x),)),
    "vjp": lambda f, x: func.vjp(f, x),
    "jacrev": lambda f, x: func.jacrev(f)(x),
    "jacfwd": lambda f, x: func.jacfwd(f)(x),
    "hessian": lambda f, x: func.hessian(lambda t: f(t).sum())(x),
}


def test_functional_call_runs_the_module_with_other_parameters():
    module = _linear()
    x = _x()
    params = {name: p.detach() * 2 for name, p in module.named_parameters()}
    got = func.functional_call(module, params, (x,))
    expected = torch.nn.functional.linear(x, params["weight"], params["bias"])
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    # And torch.autograd through it, the supported way to differentiate.
    params = {name: p.detach().requires_grad_() for name, p in module.named_parameters()}
    (grad_w,) = torch.autograd.grad(
        func.functional_call(module, params, (x,)).sum(), params["weight"]
    )
    assert torch.allclose(grad_w, x.sum(0).expand(4, 8))


@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_every_transform_is_refused_naming_the_module(transform):
    module = _linear()
    with pytest.raises(RuntimeError, match=MESSAGE.format(name="Linear")):
        TRANSFORMS[transform](module, _x())


def test_grad_over_functional_call_is_refused_too():
    module = _linear()
    params = dict(module.named_parameters())
    with pytest.raises(RuntimeError, match=MESSAGE.format(name="Linear")):
        func.grad(lambda p: func.functional_call(module, p, (_x(),)).sum())(params)


@pytest.mark.parametrize(
    ("name", "make", "call"),
    [
        ("LayerNormLinear", lambda: te.LayerNormLinear(8, 4), lambda m, x: m(x)),
        ("LayerNormMLP", lambda: te.LayerNormMLP(8, 16), lambda m, x: m(x)),
        ("GroupedLinear", lambda: te.GroupedLinear(2, 8, 4), lambda m, x: m(x, [1, 2])),
        ("LayerNorm", lambda: te.LayerNorm(8), lambda m, x: m(x)),
        ("RMSNorm", lambda: te.RMSNorm(8), lambda m, x: m(x)),
        (
            "DotProductAttention",
            lambda: te.DotProductAttention(2, 4),
            lambda m, x: m(*(x.reshape(3, 1, 2, 4),) * 3),
        ),
        ("MultiheadAttention", lambda: te.MultiheadAttention(8, 2), lambda m, x: m(x.unsqueeze(1))),
        ("TransformerLayer", lambda: te.TransformerLayer(8, 16, 2), lambda m, x: m(x.unsqueeze(1))),
    ],
    ids=["LNLinear", "LNMLP", "GroupedLinear", "LayerNorm", "RMSNorm", "DPA", "MHA", "Layer"],
)
def test_each_module_refuses_a_transform_by_its_name(name, make, call):
    torch.manual_seed(0)
    module = make()
    with pytest.raises(RuntimeError, match=MESSAGE.format(name=name)):
        func.grad(lambda t: call(module, t).float().sum())(_x())


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_compiled_transform_is_refused_naming_the_module(fullgraph):
    """Dynamo traces the transform with it active: the refusal is decided while tracing,
    and reaches the caller quoted in Dynamo's error (``fullgraph=True``) or raised by the
    eager call behind the graph break."""
    module = _linear()
    compiled = torch.compile(
        func.grad(lambda t: module(t).sum()), backend="aot_eager", fullgraph=fullgraph
    )
    error = torch._dynamo.exc.Unsupported if fullgraph else RuntimeError
    with pytest.raises(error) as raised:
        compiled(_x())
    assert "Linear: torch.func transforms" in str(raised.value)
