"""The kernel pieces a lowered graph keeps whole (``lowering.exact``): each is an op
whose schema, fake and kernel agree (``opcheck``), computing what the function computes
eagerly; defining one is safe from several threads; names are scoped by the marking
module (one module cannot mark two pieces of one name, two modules can)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

# Importing the ops marks their pieces.
import transformer_engine_ops.ops.l2normalization  # noqa: F401
import transformer_engine_ops.ops.layernorm_mlp  # noqa: F401
import transformer_engine_ops.quantization.gemm  # noqa: F401
from transformer_engine_ops.runtime import lowering


def _t(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=gen).to(dtype)


# clamped_swiglu's (limit, alpha, glu_linear_offset) at TE's defaults, which the other
# activations take and ignore.
_TE_CLAMP = (7.0, 1.702, 1.0)


def _cases() -> list[tuple[str, tuple[Any, ...]]]:
    bf16, f32 = torch.bfloat16, torch.float32
    x, w, b = _t(6, 16), _t(16, seed=1), _t(16, seed=2)
    mu, rsigma = _t(6, dtype=f32, seed=3), _t(6, dtype=f32, seed=4).abs() + 0.5
    return [
        ("bias_grad", (_t(5, 7), bf16)),
        ("bias_grad", (_t(0, 7, dtype=f32), f32)),  # no rows: zeros
        ("addmm", (b, _t(3, 8), _t(8, 16))),
        ("addmm", (_t(1, dtype=f32), _t(1, 1, dtype=f32), _t(1, 1, dtype=f32))),
        ("fp32_gemm", (_t(16, 8), _t(3, 8), b, "TN", bf16)),
        ("fp32_gemm", (_t(3, 16), _t(3, 8), None, "NT", f32)),
        ("fp32_gemm", (_t(8, 16), _t(0, 8), _t(0, 16, seed=8), "NN", bf16)),
        ("norm_forward", (x, w, b, True, 1e-5, False, bf16)),
        ("norm_forward", (_t(0, 16), w, None, True, 1e-5, True, f32)),
        ("norm_forward", (x, w, None, False, 1e-6, True, bf16)),
        ("norm_backward", (x, None, x, w, mu, rsigma, False, True)),
        ("norm_backward", (x, _t(6, 16, seed=5), x, w, None, rsigma, True, False)),
        ("l2_norm_forward", (x, 1e-6)),
        ("l2_norm_forward", (_t(0, 16, dtype=f32), 1e-5)),
        ("l2_norm_backward", (_t(6, 16, seed=5), x, rsigma, 1e-6)),
        ("l2_norm_backward", (_t(6, 16, dtype=f32, seed=5), _t(6, 16, dtype=f32), rsigma, 0.0)),
        ("activation_forward", ("gelu", _t(4, 8), bf16, *_TE_CLAMP)),
        ("activation_forward", ("swiglu", _t(4, 8, dtype=f32), f32, *_TE_CLAMP)),
        ("activation_forward", ("clamped_swiglu", _t(4, 8), bf16, 0.5, 1.5, 0.25)),
        ("activation_backward", ("qgelu", _t(4, 8), _t(4, 8, seed=6), bf16, *_TE_CLAMP)),
        ("activation_backward", ("reglu", _t(4, 4), _t(4, 8, seed=7), bf16, *_TE_CLAMP)),
        (
            "activation_backward",
            ("clamped_swiglu", _t(4, 4), _t(4, 8, seed=9), bf16, 0.5, 1.5, 0.25),
        ),
    ]


def _op_name(name: str) -> str:
    """The op name of the piece ``name`` the package marks (exactly one)."""
    (op_name,) = [
        n
        for n in lowering.exact_pieces()
        if n.split("__", 1)[0] == name and n.split("__", 1)[1].startswith("transformer_engine_ops_")
    ]
    return op_name


def _on(device: str, value: Any) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
_DEVICE_CASES = [("cpu", name, args) for name, args in _cases()] + [
    pytest.param("cuda", name, args, marks=_GPU) for name, args in _cases()
]


@pytest.mark.parametrize(
    ("device", "name", "args"), _DEVICE_CASES, ids=lambda v: v if isinstance(v, str) else ""
)
def test_each_piece_is_an_op_that_computes_its_functions_bits(device, name, args):
    args = tuple(_on(device, a) for a in args)
    op = lowering.exact_op(_op_name(name))
    torch.library.opcheck(op, args)
    _, fn = lowering.exact_pieces()[_op_name(name)]
    want, got = fn(*args), op(*args)
    for w, g in zip(*(v if isinstance(v, tuple) else (v,) for v in (want, got)), strict=True):
        assert torch.equal(w, g)


def test_every_marked_piece_is_covered_here():
    package = {
        name
        for name, module in (n.split("__", 1) for n in lowering.exact_pieces())
        if module.startswith("transformer_engine_ops_")
    }
    assert package == {name for name, _ in _cases()}


def test_each_schema_names_its_functions_parameters_in_order():
    """Keyword calls reach the op by the schema's names: they must be the function's."""
    import inspect

    for name, (_, fn) in lowering.exact_pieces().items():
        op = lowering.exact_op(name)
        in_schema = [a.name for a in op._schema.arguments]
        assert in_schema == list(inspect.signature(fn).parameters), name


def test_a_piece_takes_keyword_arguments_eagerly_and_traced():
    from transformer_engine_ops.ops.linear import _bias_grad

    dy = _t(4, 8)
    want = _bias_grad(dy, torch.bfloat16)
    assert torch.equal(_bias_grad(dy=dy, dtype=torch.bfloat16), want)
    assert torch.equal(lowering.exact_op(_op_name("bias_grad"))(dy=dy, dtype=torch.bfloat16), want)


def test_eagerly_a_piece_is_its_function_without_an_op():
    from transformer_engine_ops.ops.linear import _bias_grad

    dy = _t(4, 8)
    assert torch.equal(_bias_grad(dy, torch.bfloat16), _bias_grad.__wrapped__(dy, torch.bfloat16))
    assert not lowering.tracing()


def test_one_module_cannot_mark_two_pieces_of_one_name():
    def twice(dy, dtype):
        return dy.sum(0).to(dtype)

    lowering.exact("test_twice(Tensor dy, ScalarType dtype) -> Tensor")(twice)
    with pytest.raises(ValueError, match=f"two pieces named 'test_twice' in {__name__}"):
        lowering.exact("test_twice(Tensor dy, ScalarType dtype) -> Tensor")(twice)


def test_two_modules_mark_pieces_of_one_name_each_its_own_op():
    """This module marks a ``bias_grad`` as ``ops/linear.py`` does: both import, and each
    piece's op runs its own function."""

    def doubled(dy, dtype):
        return (dy.sum(0) * 2).to(dtype)

    piece = lowering.exact("bias_grad(Tensor dy, ScalarType dtype) -> Tensor")(doubled)
    ours = lowering.exact_op(lowering.exact_op_name(__name__, "bias_grad"))
    linear = lowering.exact_op(_op_name("bias_grad"))
    assert ours is not linear
    dy = _t(4, 8)
    assert torch.equal(ours(dy, torch.float32), doubled(dy, torch.float32))
    assert torch.equal(piece(dy, torch.float32), doubled(dy, torch.float32))
    assert torch.equal(linear(dy, torch.float32), dy.float().sum(0))


def test_threads_tracing_at_once_define_a_piece_once():
    lowering.exact("test_threaded_piece(Tensor x) -> Tensor")(lambda x: x * 2)
    name = lowering.exact_op_name(__name__, "test_threaded_piece")
    ops: list[Any] = []
    barrier = threading.Barrier(8)

    def define() -> None:
        barrier.wait()
        ops.append(lowering.exact_op(name))

    threads = [threading.Thread(target=define) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ops) == 8 and all(op is ops[0] for op in ops)
    assert torch.equal(ops[0](torch.ones(2)), torch.full((2,), 2.0))
