"""A second op, written only as docs/op_contract.md says, generated and run end to end.

The generator writes the fixture's module (tests/ops/fixtures/every_kind_op.py) into a
temporary folder (``tests/ops/fixture_ops.py``); the test imports it, so its calling
side, boundary helpers and registration run: round trips, opcheck, eager autograd against plain PyTorch,
torch.compile bit for bit, repeated backward.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the fixtures' namespace package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bundles import fields_by_name  # noqa: E402
from tests.ops import fixture_ops  # noqa: E402
from tests.ops.fixtures import every_kind_op as op  # noqa: E402
from transformer_engine_ops.quantization.quantizer import QuantizedData  # noqa: E402
from transformer_engine_ops.runtime.values import GemmConfig  # noqa: E402


@pytest.fixture(scope="module")
def g() -> ModuleType:
    return fixture_ops.load("every_kind_op")


BATCH, K, N = (2, 3), 5, 4


def make_args(
    seed: int = 0, *, bias: bool = True, requires_grad: bool = True, **changes: Any
) -> op.EveryKindOpFwdArgs:
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float64

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_(requires_grad)

    args = op.EveryKindOpFwdArgs(
        x=rand(*BATCH, K),
        w=rand(N, K),
        b=rand(N) if bias else None,
        extras=[torch.randn(N, generator=gen, dtype=dtype) for _ in range(2)],
        view_shape=(*BATCH, N),
        hint_shape=(1, 2),
        sign=op.Sign.NEGATIVE,
        reduction="mean",
        scale=0.5,
        offset=3,
        out_dtype=None,
        note="a note",
        negate_z=True,
        device=torch.device("cpu"),
        input_quantizer=None,
        group=None,
        gemm=GemmConfig(),
        hook=None,
    )
    return dataclasses.replace(args, **changes)


def plain_pytorch(args: op.EveryKindOpFwdArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's meaning in plain PyTorch autograd."""
    scale = (1.0 if args.scale is None else args.scale) * (
        -1.0 if args.sign is op.Sign.NEGATIVE else 1.0
    )
    y = torch.nn.functional.linear(args.x, args.w, args.b) * scale + sum(args.extras)
    z = args.x.sum(-1) if args.reduction == "sum" else args.x.mean(-1)
    z = -z if args.negate_z else z
    z = z + (args.offset or 0)
    dtype = args.out_dtype or args.x.dtype
    return y.reshape(args.view_shape).to(dtype), z.to(dtype)


VARIANTS = {
    "all": {},
    "no-bias": {"bias": False},
    "defaults": {
        "scale": None,
        "offset": None,
        "note": None,
        "hint_shape": None,
        "sign": op.Sign.POSITIVE,
    },
    "sum-float32": {"reduction": "sum", "out_dtype": torch.float32, "negate_z": False},
}


def _variant(name: str, seed: int = 0) -> op.EveryKindOpFwdArgs:
    kwargs = dict(VARIANTS[name])
    bias = kwargs.pop("bias", True)
    return make_args(seed, bias=bias, **kwargs)


def _grads(args: op.EveryKindOpFwdArgs) -> list[torch.Tensor | None]:
    out = []
    for t in (args.x, args.w, args.b):
        out.append(None if t is None or t.grad is None else t.grad.clone())
        if t is not None:
            t.grad = None
    return out


def _loss(outputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    y, z = outputs
    return (y * y).sum() + (z * torch.arange(z.numel(), dtype=z.dtype).view(z.shape)).sum()


# --- the boundary -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(VARIANTS))
def test_forward_bundle_round_trips(g, name):
    args = _variant(name)
    back = g.unflatten_every_kind_op_fwd_args(*g.flatten_every_kind_op_fwd_args(args))
    assert back == args
    assert isinstance(back.view_shape, torch.Size) and back.sign is args.sign


def test_backward_bundle_round_trips(g):
    fwd = make_args()
    bwd = op.EVERY_KIND_OP.backward_args(fwd, (), ())
    bwd.grad_outputs = [torch.ones(*BATCH, N), torch.ones(*BATCH)]
    back = g.unflatten_every_kind_op_bwd_args(*g.flatten_every_kind_op_bwd_args(bwd))
    assert back == bwd


_INTS = st.integers(-(2**40), 2**40)


@st.composite
def _bundles(draw: Any) -> tuple[op.EveryKindOpFwdArgs, op.EveryKindOpBwdArgs]:
    """Any field values the flatten checks accept (the impls' rules aside)."""
    maybe = st.none().__or__
    shape = st.lists(_INTS, max_size=4).map(torch.Size)  # what a size unflattens to
    dtype = st.sampled_from([torch.float32, torch.bfloat16, torch.float64, torch.int8])
    tq = fixture_ops.tensor_or_quantized((32, 32), none=False)
    fwd = op.EveryKindOpFwdArgs(
        x=torch.randn(2, 3),
        w=draw(tq),
        b=draw(maybe(st.just(torch.randn(4)))),
        extras=[torch.randn(2) for _ in range(draw(st.integers(0, 3)))],
        view_shape=draw(shape),
        hint_shape=draw(maybe(shape)),
        sign=draw(st.sampled_from(op.Sign)),
        reduction=draw(st.sampled_from(["sum", "mean"])),
        scale=draw(maybe(st.floats(allow_nan=False))),
        offset=draw(maybe(_INTS)),
        out_dtype=draw(maybe(dtype)),
        note=draw(maybe(st.text(max_size=8))),
        negate_z=draw(st.booleans()),
        device=torch.device(draw(st.sampled_from(["cpu", "meta"]))),
        input_quantizer=draw(maybe(st.sampled_from(list(fixture_ops.QUANTIZERS.values())))),
        group=None,
        gemm=GemmConfig(draw(st.booleans())),
        hook=None,
    )
    bwd = op.EveryKindOpBwdArgs(
        grad_outputs=[torch.randn(2) for _ in range(draw(st.integers(0, 2)))],
        x=torch.randn(2, 3),
        w=draw(maybe(tq)),
        x_shape=torch.Size(draw(st.lists(st.integers(0, 2**20), max_size=4))),
        has_bias=draw(st.booleans()),
        sign=draw(st.sampled_from(op.Sign)),
        reduction=draw(st.sampled_from(["sum", "mean"])),
        scale=draw(st.floats(allow_nan=False)),
        out_dtype=draw(maybe(dtype)),
        negate_z=draw(st.booleans()),
    )
    return fwd, bwd


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(bundles=_bundles())
def test_any_bundle_values_round_trip(g, bundles):
    fwd, bwd = bundles
    back = g.unflatten_every_kind_op_fwd_args(*g.flatten_every_kind_op_fwd_args(fwd))
    fixture_ops.same_bundle(back, fwd)
    assert isinstance(back.view_shape, torch.Size)
    assert back.hint_shape is None or isinstance(back.hint_shape, torch.Size)
    back = g.unflatten_every_kind_op_bwd_args(*g.flatten_every_kind_op_bwd_args(bwd))
    fixture_ops.same_bundle(back, bwd)


def test_a_quantized_weight_round_trips_as_its_buffers(g):
    # A storage crosses as its inner buffers plus its description; a wrapper as a tensor.
    storage = fixture_ops.QUANTIZERS["mxfp8"].with_internal(True).quantize(torch.randn(32, 32))
    slots = g.flatten_every_kind_op_fwd_args(make_args(w=storage))
    w_slot = [row.slot for row in g.FORWARD_SLOTS].index("w")
    assert slots[w_slot] is None and len(slots[w_slot + 1]) == len(storage.inner_names())
    back = g.unflatten_every_kind_op_fwd_args(*slots).w
    assert isinstance(back, QuantizedData) and fixture_ops.same(back, storage)


def test_unsupported_field_must_be_none(g):
    with pytest.raises(TypeError, match="EveryKindOpFwdArgs.hook: this field cannot cross"):
        g.flatten_every_kind_op_fwd_args(make_args(hook=lambda: None))


def test_a_bad_literal_is_named(g):
    with pytest.raises(ValueError, match="EveryKindOpFwdArgs.reduction: expected one of"):
        g.call_every_kind_op(**fields_by_name(make_args(reduction="max")))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_opcheck_forward_and_backward(g, name):
    args = _variant(name)
    torch.library.opcheck(g.every_kind_op_fwd, g.flatten_every_kind_op_fwd_args(args))
    bwd = op.EVERY_KIND_OP.backward_args(args, (), ())
    bwd.x, bwd.w = bwd.x.detach(), bwd.w.detach()  # the backward op has no derivative
    y, z = plain_pytorch(args)
    bwd.grad_outputs = [torch.ones_like(y).detach(), torch.ones_like(z).detach()]
    torch.library.opcheck(g.every_kind_op_bwd, g.flatten_every_kind_op_bwd_args(bwd))


# --- autograd: eager, compiled, repeated ----------------------------------------------


@pytest.mark.parametrize("name", list(VARIANTS))
def test_eager_autograd_equals_plain_pytorch(g, name):
    args, ref = _variant(name), _variant(name)
    out = g.call_every_kind_op(**fields_by_name(args))
    want = plain_pytorch(ref)
    for o, w in zip(out, want, strict=True):
        torch.testing.assert_close(o, w)
    _loss(out).backward()
    _loss(want).backward()
    for a, b in zip(_grads(args), _grads(ref), strict=True):
        torch.testing.assert_close(a, b)


def _run(g: ModuleType, args: op.EveryKindOpFwdArgs, compiled: Any) -> Any:
    outputs = compiled(args.x, args.w, args.b, args.extras)
    _loss(outputs).backward()
    return outputs, _grads(args)


def _compiled_call(g: ModuleType, template: op.EveryKindOpFwdArgs, backend: str) -> Any:
    def f(x, w, b, extras):
        return g.call_every_kind_op(
            **fields_by_name(dataclasses.replace(template, x=x, w=w, b=b, extras=extras))
        )

    return torch.compile(f, fullgraph=True, backend=backend)


@pytest.mark.parametrize(
    ("name", "backend"),
    [(n, "aot_eager") for n in VARIANTS] + [("all", "inductor")],
)
def test_compiled_equals_eager_bit_for_bit(g, name, backend):
    torch._dynamo.reset()
    eager_args, comp_args = _variant(name), _variant(name)
    eager = _run(
        g, eager_args, lambda x, w, b, e: g.call_every_kind_op(**fields_by_name(eager_args))
    )
    got = _run(g, comp_args, _compiled_call(g, comp_args, backend))
    for a, b in zip([*eager[0], *eager[1]], [*got[0], *got[1]], strict=True):
        assert (a is None and b is None) or torch.equal(a.detach(), b.detach())


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_two_backward_passes_with_retain_graph(g, compiled):
    torch._dynamo.reset()
    args, ref = make_args(), make_args()
    call = _compiled_call(g, args, "aot_eager") if compiled else None
    out = (
        call(args.x, args.w, args.b, args.extras)
        if compiled
        else g.call_every_kind_op(**fields_by_name(args))
    )
    want = plain_pytorch(ref)
    for outputs in (out, want):
        _loss(outputs).backward(retain_graph=True)
        outputs[0].sum().backward()
    for a, b in zip(_grads(args), _grads(ref), strict=True):
        torch.testing.assert_close(a, b)


def test_eager_path_saves_every_backward_tensor_through_save_for_backward(g):
    args = make_args()
    packed: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        g.call_every_kind_op(**fields_by_name(args))
    assert any(t is args.x for t in packed) and any(t is args.w for t in packed)


def test_without_grad_the_forward_impl_runs_directly(g):
    args = make_args(requires_grad=False)
    outputs, saved = g.every_kind_op_eager(args)
    assert saved == () and all(o.grad_fn is None for o in outputs)


def test_an_op_module_that_does_not_declare_lowers_keeps_its_nodes_on_inductor(g, monkeypatch):
    """Its kernel marks no piece (``lowering.exact``): a default Inductor compile must call
    the op, not trace the kernel (which would be eager's to rounding only)."""
    from transformer_engine_ops.runtime import lowering

    ops = {g.FORWARD_OP, g.BACKWARD_OP}
    registered = {op._schema.name: op for op in lowering.decompositions()}
    assert ops <= set(registered), "registered for inductor_backend(lowering='rounding')"
    assert not ops & {op._schema.name for op in lowering.lowered_by_default()}
    traced: list[str] = []
    for name in ops:
        real = lowering._DECOMPOSITIONS[registered[name]]
        monkeypatch.setitem(
            lowering._DECOMPOSITIONS,
            registered[name],
            lambda *s, _r=real, _n=name: traced.append(_n) or _r(*s),
        )
    torch._dynamo.reset()
    args = _variant("all")
    _run(g, args, _compiled_call(g, args, "inductor"))
    assert traced == []
