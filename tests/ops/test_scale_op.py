"""An op without ``setup_context`` (tests/ops/fixtures/scale_op.py), generated and run.

Every backward field of the fixture is a copy, so its declaration names no
``setup_context``: the generated code builds the backward bundle from the copies alone.
Checked here: opcheck of both ops, eager gradients against plain PyTorch, compiled
(``fullgraph=True``) equal to eager bit for bit, a forward that saves something refused
by name. The generator's refusal of a missing ``setup_context`` where a backward field
is not a copy is a corpus case (tests/codegen/corpus/setup_context_missing.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the fixtures' namespace package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.ops import fixture_ops  # noqa: E402
from tests.ops.fixtures import scale_op as op  # noqa: E402
from transformer_engine_ops.runtime.declaration import OpDeclaration  # noqa: E402


@pytest.fixture(scope="module")
def g() -> ModuleType:
    return fixture_ops.load("scale_op")


def _input(requires_grad: bool = True) -> torch.Tensor:
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    return x.requires_grad_(requires_grad)


def test_the_generated_module_has_no_setup_context(g):
    text = fixture_ops.generated().files[f"{fixture_ops._OUTPUT_DIR}/scale_op.py"]
    assert "setup_context(" not in text and "SETUP_CONTEXT_FIELDS" not in text
    assert g.COPIED_FIELDS == ("factor", "inp_requires_grad") == op.SCALE_OP.copied_fields
    assert op.SCALE_OP.made_fields == frozenset()


def test_opcheck_forward_and_backward(g):
    args = op.ScaleOpFwdArgs(_input(False), 1.5, True)
    torch.library.opcheck(g.scale_op_fwd, g.flatten_scale_op_fwd_args(args))
    bwd = op.ScaleOpBwdArgs([torch.ones(4, 3)], 1.5, True)
    torch.library.opcheck(g.scale_op_bwd, g.flatten_scale_op_bwd_args(bwd))


@pytest.mark.parametrize("requires_grad", [True, False])
def test_eager_gradients_equal_plain_pytorch(g, requires_grad):
    x = _input(requires_grad)
    (y,) = g.call_scale_op(inp=x, factor=-2.5, inp_requires_grad=requires_grad)
    assert torch.equal(y, x.detach() * -2.5)
    if requires_grad:
        y.backward(torch.ones_like(y))
        assert torch.equal(x.grad, torch.full_like(x, -2.5))
    else:
        assert not y.requires_grad


def test_compiled_equals_eager_bit_for_bit(g):
    def step(x):
        (y,) = g.call_scale_op(inp=x, factor=0.3, inp_requires_grad=x.requires_grad)
        return (y * y).sum()

    x_eager, x_compiled = _input(), _input()
    step(x_eager).backward()
    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(x_compiled)
    loss.backward()
    assert torch.equal(loss, step(_input()).detach())
    assert torch.equal(x_compiled.grad, x_eager.grad)


def test_a_forward_that_saves_values_is_refused_by_name(g, monkeypatch):
    monkeypatch.setattr(g, "scale_op_forward", lambda args: ((args.inp * 2,), (args.inp,)))
    with pytest.raises(TypeError, match=r"op `scale_op`: its forward_impl saved 1 value"):
        g.call_scale_op(inp=_input(), factor=2.0, inp_requires_grad=True)


def test_the_declaration_refuses_a_backward_field_that_is_not_a_copy():
    decl = OpDeclaration("t", op.ScaleOpFwdArgs, op.ScaleOpBwdArgs, ("inp",), derived=("factor",))
    with pytest.raises(TypeError, match=r"declares no setup_context, but ScaleOpBwdArgs has "):
        decl.backward_args(op.ScaleOpFwdArgs(_input(), 1.0, True), (), ())
    copies = OpDeclaration("t", op.ScaleOpFwdArgs, op.ScaleOpBwdArgs, ("inp",))
    with pytest.raises(TypeError, match="saved 1 value"):
        copies.backward_args(op.ScaleOpFwdArgs(_input(), 1.0, True), (), (1,))
    made = copies.backward_args(op.ScaleOpFwdArgs(_input(), 1.0, True), (), ())
    assert made == op.ScaleOpBwdArgs([], 1.0, True)
