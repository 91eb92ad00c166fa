"""The grouped fixture op (tests/ops/fixtures/grouped_op.py), generated and run end to end.

It exercises the kinds the first fixture does not: ``List[Tensor]`` and
``List[TensorOrQuantized]`` gradient fields (one gradient per element, quantized wrapper
weights included), ``List[int]``, quantizer lists, tensor-or-quantized lists
holding plain, quantized-storage and quantized-wrapper values, ``Tuple[int, int]``,
optional enum/Literal/value, a None-only ``torch.Generator``, and TE's backward form
``grad_output: Optional[Tensor]``. Round trips (also property-based), opcheck on both
ops, eager autograd against plain PyTorch, compiled equal to eager bit for bit,
repeated backward, and every list element's gradient.
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
from tests.ops.fixtures import grouped_op as op  # noqa: E402
from transformer_engine_ops.quantization import (  # noqa: E402
    Float8CurrentScalingQuantizer,
)
from transformer_engine_ops.quantization.quantizer import QuantizedData  # noqa: E402
from transformer_engine_ops.runtime.values import GemmConfig  # noqa: E402


@pytest.fixture(scope="module")
def g() -> ModuleType:
    return fixture_ops.load("grouped_op")


M_SPLITS, K, N = [2, 3, 1], 8, 4
FP8 = Float8CurrentScalingQuantizer()


def make_args(seed: int = 0, *, requires_grad: bool = True, **changes: Any) -> op.GroupedOpFwdArgs:
    """A bundle; ``weight_workspaces`` may be given as a function of the weights."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).requires_grad_(requires_grad)

    groups = len(changes.get("m_splits", M_SPLITS))
    m = sum(changes.get("m_splits", M_SPLITS))
    args = op.GroupedOpFwdArgs(
        x=rand(m, K),
        weights=[rand(N, K) for _ in range(groups)],
        biases=[rand(N) for _ in range(groups)],
        m_splits=list(M_SPLITS),
        group_scales=None,
        weight_quantizers=[None] * groups,
        input_quantizers=None,
        weight_workspaces=None,
        pad=(0, 0),
        row_pad=None,
        activation=None,
        pad_value=None,
        gemm=None,
        generator=None,
    )
    workspaces = changes.pop("weight_workspaces", None)
    weights = changes.pop("weights") if callable(changes.get("weights")) else None
    args = dataclasses.replace(args, **changes)
    if weights is not None:
        args.weights = weights(args.weights)
    if callable(workspaces):
        workspaces = workspaces([w.detach() for w in args.weights])
    args.weight_workspaces = workspaces
    return args


def _mixed_workspaces(weights: list[torch.Tensor]) -> list[Any]:
    # None (quantize weight 0 with its quantizer), a plain tensor, a quantized storage.
    return [None, weights[1] * 0.5, FP8.with_internal(True).quantize(weights[2] * 2)]


def _wrapper_workspaces(weights: list[torch.Tensor]) -> list[Any]:
    # A quantized wrapper tensor subclass, then no workspace twice.
    return [FP8.with_internal(False).quantize(weights[0]), None, None]


def _quantized_weights(weights: list[torch.Tensor]) -> list[Any]:
    # Quantized wrapper parameters (as quantized_model_init makes), each receiving its
    # gradient, and a plain weight between them.
    def quantized(w: torch.Tensor) -> Any:
        return FP8.with_internal(False).quantize(w.detach()).requires_grad_(w.requires_grad)

    return [quantized(weights[0]), weights[1], quantized(weights[2])]


VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "all": {
        "group_scales": [1, -2, 3],
        "weight_quantizers": [FP8, None, FP8],
        "input_quantizers": [FP8, FP8, FP8],
        "weight_workspaces": _mixed_workspaces,
        "pad": (1, 2),
        "row_pad": (2, 1),
        "activation": op.Activation.TANH,
        "pad_value": "one",
        "gemm": GemmConfig(),
    },
    "square-no-bias": {
        "biases": None,
        "weight_quantizers": [None, FP8, None],
        "input_quantizers": [None, FP8, None],
        "weight_workspaces": _wrapper_workspaces,
        "pad": (0, 3),
        "activation": op.Activation.SQUARE,
        "pad_value": "zero",
    },
    "two-gemms": {"m_splits": [4, 0], "row_pad": (0, 2), "group_scales": [2, 1]},
    "quantized-weights": {
        "weights": _quantized_weights,
        # Weight 0 is already quantized: its quantizer is not applied again.
        "weight_quantizers": [FP8, FP8, None],
        "input_quantizers": [FP8, None, FP8],
        "activation": op.Activation.TANH,
    },
}


def _variant(name: str, seed: int = 0, **kw: Any) -> op.GroupedOpFwdArgs:
    return make_args(seed, **{**VARIANTS[name], **kw})


def _dequantized(value: Any) -> torch.Tensor:
    return value.dequantize(dtype=torch.float32) if isinstance(value, QuantizedData) else value


def _straight_through(t: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` in the forward, gradient straight through to ``t``."""
    return t + (value - t).detach()


def plain_pytorch(args: op.GroupedOpFwdArgs) -> torch.Tensor:
    """The op's meaning in plain PyTorch autograd."""
    x = args.x
    if args.activation is op.Activation.TANH:
        h = torch.tanh(x)
    elif args.activation is op.Activation.SQUARE:
        h = x * x
    else:
        h = x
    blocks = []
    for i, h_i in enumerate(torch.split(h, args.m_splits)):
        q_in = None if args.input_quantizers is None else args.input_quantizers[i]
        if q_in is not None:
            h_i = _straight_through(h_i, q_in.quantize(h_i.detach()).dequantize())
        w = args.weights[i]
        workspace = None if args.weight_workspaces is None else args.weight_workspaces[i]
        if workspace is not None:
            w = _straight_through(w, _dequantized(workspace))
        elif isinstance(w, QuantizedData):
            w = w.dequantize(dtype=torch.float32)  # differentiable: the wrapper gets its grad
        elif args.weight_quantizers[i] is not None:
            w = _straight_through(w, args.weight_quantizers[i].quantize(w.detach()).dequantize())
        b = None if args.biases is None else args.biases[i]
        scale = 1 if args.group_scales is None else args.group_scales[i]
        blocks.append(torch.nn.functional.linear(h_i, w, b) * scale)
    top, bottom = args.row_pad or (0, 0)
    value = 1.0 if args.pad_value == "one" else 0.0
    return torch.nn.functional.pad(torch.cat(blocks), (*args.pad, top, bottom), value=value)


def _leaves(args: op.GroupedOpFwdArgs) -> list[torch.Tensor]:
    return [args.x, *args.weights, *(args.biases or [])]


def _grads(args: op.GroupedOpFwdArgs) -> list[torch.Tensor | None]:
    out = []
    for t in _leaves(args):
        out.append(None if t.grad is None else t.grad.clone())
        t.grad = None
    return out


def _loss(y: torch.Tensor) -> torch.Tensor:
    weights = torch.arange(y.numel(), dtype=y.dtype).view(y.shape) / y.numel()
    return (y * y).sum() + (y * weights).sum()


def _backward_bundle(args: op.GroupedOpFwdArgs) -> op.GroupedOpBwdArgs:
    outputs, saved = op.grouped_op_forward(args)
    bwd = op.GROUPED_OP.backward_args(args, outputs, saved)
    bwd.grad_output = torch.ones_like(outputs[0]).detach()
    return bwd


# --- the boundary -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(VARIANTS))
def test_forward_bundle_round_trips(g, name):
    args = _variant(name)
    back = g.unflatten_grouped_op_fwd_args(*g.flatten_grouped_op_fwd_args(args))
    fixture_ops.same_bundle(back, args)
    assert isinstance(back.pad, tuple) and isinstance(back.m_splits, list)
    assert back.row_pad is None or isinstance(back.row_pad, tuple)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_backward_bundle_round_trips_with_its_quantized_values(g, name):
    bwd = _backward_bundle(_variant(name, requires_grad=False))
    back = g.unflatten_grouped_op_bwd_args(*g.flatten_grouped_op_bwd_args(bwd))
    fixture_ops.same_bundle(back, bwd)
    if name == "all":
        assert isinstance(back.weights[0], QuantizedData)
        assert all(isinstance(v, QuantizedData) for v in back.inputs)


def test_a_generator_must_be_none(g):
    # torch.Generator is configured None-only (pyproject.toml): no slot, refused if set.
    assert "generator" not in {row.field for row in g.FORWARD_SLOTS}
    with pytest.raises(TypeError, match="GroupedOpFwdArgs.generator: this field cannot cross"):
        g.call_grouped_op(**fields_by_name(make_args(generator=torch.Generator())))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pad": (1, 2, 3)}, r"GroupedOpFwdArgs.pad: expected a tuple of 2 ints"),
        ({"row_pad": (1, True)}, r"GroupedOpFwdArgs.row_pad: expected a tuple of 2 ints"),
        ({"m_splits": [2, 3, True]}, r"GroupedOpFwdArgs.m_splits: expected a list of ints"),
        ({"weight_quantizers": [FP8, "fp8", None]}, r"GroupedOpFwdArgs.weight_quantizers"),
        ({"weight_workspaces": [None, 1.0, None]}, r"GroupedOpFwdArgs.weight_workspaces\[1\]"),
        ({"weights": [torch.ones(N, K), 1.0, torch.ones(N, K)]}, r"GroupedOpFwdArgs.weights\[1\]"),
    ],
)
def test_a_bad_field_is_named(g, changes, message):
    with pytest.raises(TypeError, match=message):
        g.call_grouped_op(**fields_by_name(make_args(**changes)))


@st.composite
def _bundles(draw: Any) -> tuple[op.GroupedOpFwdArgs, op.GroupedOpBwdArgs]:
    groups = draw(st.integers(1, 3))
    m_splits = draw(st.lists(st.integers(0, 3), min_size=groups, max_size=groups))
    ints = st.integers(-(2**40), 2**40)
    pair = st.tuples(ints, ints)
    quantizer = st.sampled_from(sorted(fixture_ops.QUANTIZERS)).map(
        fixture_ops.QUANTIZERS.__getitem__
    )
    shape = (32, 32)  # every format's block size divides it
    maybe = st.none().__or__
    fwd = op.GroupedOpFwdArgs(
        x=torch.randn(sum(m_splits), K),
        weights=[torch.randn(N, K) for _ in range(groups)],
        biases=draw(maybe(st.just([torch.randn(N) for _ in range(groups)]))),
        m_splits=m_splits,
        group_scales=draw(maybe(st.lists(ints, max_size=4))),
        weight_quantizers=draw(st.lists(maybe(quantizer), max_size=4)),
        input_quantizers=draw(maybe(st.lists(quantizer, max_size=4))),
        weight_workspaces=draw(maybe(st.lists(fixture_ops.tensor_or_quantized(shape), max_size=4))),
        pad=draw(pair),
        row_pad=draw(maybe(pair)),
        activation=draw(maybe(st.sampled_from(op.Activation))),
        pad_value=draw(maybe(st.sampled_from(["zero", "one"]))),
        gemm=draw(maybe(st.builds(GemmConfig, st.booleans()))),
        generator=None,
    )
    bwd = op.GroupedOpBwdArgs(
        grad_output=draw(maybe(st.just(torch.randn(3, 3)))),
        x=torch.randn(2, 2),
        inputs=draw(st.lists(fixture_ops.tensor_or_quantized(shape), max_size=4)),
        weights=draw(st.lists(fixture_ops.tensor_or_quantized(shape), max_size=4)),
        m_splits=draw(st.lists(ints, max_size=4)),
        group_scales=draw(maybe(st.lists(ints, max_size=4))),
        pad=draw(pair),
        row_pad=draw(maybe(pair)),
        activation=draw(maybe(st.sampled_from(op.Activation))),
        has_bias=draw(st.booleans()),
    )
    return fwd, bwd


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(bundles=_bundles())
def test_any_bundle_values_round_trip(g, bundles):
    fwd, bwd = bundles
    fixture_ops.same_bundle(
        g.unflatten_grouped_op_fwd_args(*g.flatten_grouped_op_fwd_args(fwd)), fwd
    )
    fixture_ops.same_bundle(
        g.unflatten_grouped_op_bwd_args(*g.flatten_grouped_op_bwd_args(bwd)), bwd
    )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(bundles=_bundles())
def test_any_bundle_values_cross_the_spec_view_as_specs(g, bundles):
    # What fake kernels see: every tensor (also a list element, also quantized) as a
    # TensorSpec with its shape, dtype and quantizer.
    fwd, bwd = bundles
    spec = g.spec_grouped_op_bwd_args(*g.flatten_grouped_op_bwd_args(bwd))
    for got, value in zip(spec.weights + spec.inputs, bwd.weights + bwd.inputs, strict=True):
        if value is None:
            assert got is None
        else:
            assert tuple(got.shape) == tuple(value.shape)
            assert got.quantizer == getattr(value, "_quantizer", None)
    spec = g.spec_grouped_op_fwd_args(*g.flatten_grouped_op_fwd_args(fwd))
    assert [tuple(s.shape) for s in spec.weights] == [tuple(w.shape) for w in fwd.weights]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_opcheck_forward_and_backward(g, name):
    args = _variant(name)
    torch.library.opcheck(g.grouped_op_fwd, g.flatten_grouped_op_fwd_args(args))
    bwd = _backward_bundle(_variant(name, requires_grad=False))
    torch.library.opcheck(g.grouped_op_bwd, g.flatten_grouped_op_bwd_args(bwd))


# --- autograd: eager, compiled, repeated ----------------------------------------------


def _check_against_plain_pytorch(args: op.GroupedOpFwdArgs, ref: op.GroupedOpFwdArgs, y) -> None:
    want = plain_pytorch(ref)
    torch.testing.assert_close(y, want)
    _loss(y).backward()
    _loss(want).backward()
    got, expected = _grads(args), _grads(ref)
    assert all(t is not None for t in expected)  # every list element gets its gradient
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_eager_autograd_equals_plain_pytorch_per_list_element(g, name):
    args, ref = _variant(name), _variant(name)
    (y,) = g.call_grouped_op(**fields_by_name(args))
    assert y.grad_fn is not None
    _check_against_plain_pytorch(args, ref, y)


def _compiled_call(g: ModuleType, template: op.GroupedOpFwdArgs, backend: str) -> Any:
    def f(x, weights, biases):
        return g.call_grouped_op(
            **fields_by_name(dataclasses.replace(template, x=x, weights=weights, biases=biases))
        )

    return torch.compile(f, fullgraph=True, backend=backend)


def _run_compiled(
    g: ModuleType, args: op.GroupedOpFwdArgs, backend: str, *, warm: bool = True
) -> torch.Tensor:
    if warm:
        # Flatten once eagerly, as a module that built its workspaces eagerly has: a
        # quantized storage first described under torch.compile fails today (see
        # test_a_quantized_storage_first_described_under_compile_crosses).
        g.flatten_grouped_op_fwd_args(args)
    (y,) = _compiled_call(g, args, backend)(args.x, args.weights, args.biases)
    return y


@pytest.mark.xfail(
    # torch 2.14's dynamo can look an equal description up in the code cache, so there
    # it passes when an earlier test described an equal storage; only a new one fails.
    strict=torch.__version__ < (2, 14),
    reason="boundary.meta_code encodes a new description with json.dumps, which dynamo "
    "cannot trace: a quantized storage never flattened eagerly fails under torch.compile",
)
def test_a_quantized_storage_first_described_under_compile_crosses(g):
    torch._dynamo.reset()
    args, ref = _variant("all"), _variant("all")
    _check_against_plain_pytorch(args, ref, _run_compiled(g, args, "aot_eager", warm=False))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_compiled_autograd_equals_plain_pytorch_per_list_element(g, name):
    torch._dynamo.reset()
    args, ref = _variant(name), _variant(name)
    _check_against_plain_pytorch(args, ref, _run_compiled(g, args, "aot_eager"))


@pytest.mark.parametrize(
    ("name", "backend"),
    [(n, "aot_eager") for n in VARIANTS] + [("all", "inductor")],
)
def test_compiled_equals_eager_bit_for_bit(g, name, backend):
    torch._dynamo.reset()
    eager_args, comp_args = _variant(name), _variant(name)
    (eager_y,) = g.call_grouped_op(**fields_by_name(eager_args))
    comp_y = _run_compiled(g, comp_args, backend)
    assert torch.equal(eager_y.detach(), comp_y.detach())
    _loss(eager_y).backward()
    _loss(comp_y).backward()
    for a, b in zip(_grads(eager_args), _grads(comp_args), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_two_backward_passes_with_retain_graph(g, compiled):
    torch._dynamo.reset()
    args, ref = _variant("all"), _variant("all")
    y = (
        _run_compiled(g, args, "aot_eager")
        if compiled
        else g.call_grouped_op(**fields_by_name(args))[0]
    )
    want = plain_pytorch(ref)
    for out in (y, want):
        _loss(out).backward(retain_graph=True)
        (out[:, :2] * 3).sum().backward()
    for a, b in zip(_grads(args), _grads(ref), strict=True):
        torch.testing.assert_close(a, b)


def test_list_element_gradients_by_autograd_grad(g):
    # torch.autograd.grad on some list elements only: each gets its own gradient.
    args, ref = _variant("all"), _variant("all")
    (y,) = g.call_grouped_op(**fields_by_name(args))
    got = torch.autograd.grad(_loss(y), [args.weights[2], args.biases[0]])
    want = torch.autograd.grad(_loss(plain_pytorch(ref)), [ref.weights[2], ref.biases[0]])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_only_some_list_elements_require_grad(g, compiled):
    torch._dynamo.reset()
    args, ref = _variant("all"), _variant("all")
    for a in (args, ref):
        a.weights[1].requires_grad_(False)
        a.biases[2].requires_grad_(False)
    y = (
        _run_compiled(g, args, "aot_eager")
        if compiled
        else g.call_grouped_op(**fields_by_name(args))[0]
    )
    want = plain_pytorch(ref)
    _loss(y).backward()
    _loss(want).backward()
    for a, b in zip(_grads(args), _grads(ref), strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)


def test_eager_path_saves_every_backward_tensor_through_save_for_backward(g):
    # The per-GEMM lists of the backward bundle (quantized inputs and weights) too: a
    # quantized value as its inner buffers.
    args = _variant("all")
    packed: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        (y,), saved = g.grouped_op_eager(args)
    bwd = op.GROUPED_OP.backward_args(args, (y,), saved)
    expected = [args.x]
    for value in (*bwd.inputs, *bwd.weights):
        if isinstance(value, QuantizedData):
            expected += value.inner_tensors()
        elif value is not None:
            expected.append(value)
    for t in expected:
        assert any(p is t for p in packed), "a backward tensor bypassed save_for_backward"


def test_without_grad_the_forward_impl_runs_directly(g):
    args = _variant("all", requires_grad=False)
    (y,), saved = g.grouped_op_eager(args)
    assert y.grad_fn is None
    assert isinstance(saved[0], QuantizedData)  # weight 0 quantized here (no workspace)
