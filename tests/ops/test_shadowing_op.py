"""Forward fields named like builtins and like the names generated code reads still work.

``call_<op>``, ``<op>_fwd_slots`` and ``<op>_compile_blocker`` take the forward fields as
parameters; a field named ``type``, ``str`` or ``isinstance`` once hid the builtin their
checks call ("'int' object is not callable"), and ``torch``, ``args`` or a generated
function's name were refused. The fixture (tests/ops/fixtures/shadowing_op.py) has a
field of each name those functions read besides their parameters, in any generated
module; its generated module is imported and called eagerly (the plain call and the
impls) and under torch.compile, and compared with plain PyTorch.
"""

from __future__ import annotations

import ast
import dataclasses
import symtable
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the fixtures' namespace package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bundles import fields_by_name  # noqa: E402
from tests.ops import fixture_ops  # noqa: E402
from tests.ops.fixtures import shadowing_op as op  # noqa: E402
from transformer_engine_ops.runtime.fallback import EagerFallbackWarning  # noqa: E402
from transformer_engine_ops.runtime.values import GemmConfig  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
OP = "shadowing_op"


@pytest.fixture(scope="module")
def g() -> ModuleType:
    return fixture_ops.load("shadowing_op")


# --- the names: every one a field-taking function reads is a field of the fixture -------


def _field_functions(text: str) -> list[tuple[str, str, symtable.SymbolTable]]:
    """(op name, function name, its symbol table) of each generated function that takes
    forward fields as parameters."""
    top = symtable.symtable(text, "generated", "exec")
    ops = [name.removeprefix("call_") for name in top.get_identifiers() if name.startswith("call_")]
    found = []
    for child in top.get_children():
        for name in ops:
            if child.get_name() in (f"call_{name}", f"{name}_fwd_slots", f"{name}_compile_blocker"):
                found.append((name, child.get_name(), child))
    return found


def _read_besides_parameters(text: str) -> dict[str, set[str]]:
    """Per field-taking function: the names it reads or binds besides its parameters, with
    the op's name written `<op>`; not `_`-private ones (no field can be) and not the user
    names imported from the op module and the runtime (imported under an alias where a
    field has their name, as the fixture's `GemmConfig` field checks)."""
    users = {
        alias.asname or alias.name
        for node in ast.parse(text).body
        if isinstance(node, ast.ImportFrom) and node.module not in ("__future__", "typing")
        for alias in node.names
    }
    names = {}
    for op_name, function, table in _field_functions(text):
        used = {s.get_name() for s in table.get_symbols() if s.is_referenced() or s.is_assigned()}
        kept = used - set(table.get_parameters()) - users
        names[function] = {n.replace(op_name, "<op>") for n in kept if not n.startswith("_")}
    return names


def _generated_texts() -> dict[str, str]:
    texts = {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted((REPO_ROOT / "transformer_engine_ops" / "generated").glob("*.py"))
    }
    texts["golden every_kind.py"] = (REPO_ROOT / "tests/codegen/golden/every_kind.py").read_text(
        encoding="utf-8"
    )
    for rel, text in fixture_ops.generated().files.items():
        if rel.endswith(".py") and not rel.endswith(f"/{OP}.py"):
            texts[rel] = text
    return texts


def test_the_fixture_has_a_field_of_every_name_a_field_taking_function_reads():
    fields = {f.name.replace(OP, "<op>") for f in dataclasses.fields(op.ShadowingOpFwdArgs)}
    read = set().union(
        *(
            names
            for text in _generated_texts().values()
            for names in _read_besides_parameters(text).values()
        )
    )
    assert {"type", "isinstance", "str", "torch", "reason", "<op>_fwd"} <= read  # it sees them
    assert read - {"keep"} <= fields, sorted(read - {"keep"} - fields)


def test_with_every_name_a_field_the_functions_read_only_private_names_and_keep(g):
    text = Path(g.__file__).read_text(encoding="utf-8")
    names = _read_besides_parameters(text)
    assert set(names) == {f"call_{OP}", f"{OP}_fwd_slots", f"{OP}_compile_blocker"}
    for function, read in names.items():
        assert read <= {"keep"}, (function, read)
    assert g._type is type and g._isinstance is isinstance and g._torch is torch
    assert g._shadowing_op_fwd is g.shadowing_op_fwd  # an alias of the op, bound after it


# --- the op runs --------------------------------------------------------------------

BATCH, K, N = (2, 3), 5, 4


def make_args(seed: int = 0, *, requires_grad: bool = True, **changes: Any) -> Any:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        t = torch.randn(*shape, generator=gen, dtype=torch.float64)
        return t.requires_grad_(requires_grad)

    args = op.ShadowingOpFwdArgs(
        type=rand(*BATCH, K),
        isinstance=rand(N, K),
        getattr=rand(N),
        flat=[torch.randn(N, generator=gen, dtype=torch.float64) for _ in range(2)],
        outputs=(*BATCH, N),
        str="mean",
        int=3,
        float=0.5,
        bool=True,
        torch=None,
        reason=None,
        print=[],
        len=torch.device("cpu"),
        tuple=(1, 2),
        list=[3, 4, 5],
        dict=None,
        GemmConfig=GemmConfig(),
        shadowing_op_fwd=7,
    )
    return dataclasses.replace(args, **changes)


def plain_pytorch(args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    x, w, b = args.type, args.isinstance, args.getattr
    y = (torch.nn.functional.linear(x, w, b) * args.float + sum(args.flat)).reshape(args.outputs)
    z = x.sum(-1) if args.str == "sum" else x.mean(-1)
    z = (-z if args.bool else z) + (args.int or 0)
    dtype = args.torch or x.dtype
    return y.to(dtype), z.to(dtype)


def _loss(outputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    y, z = outputs
    return (y * y).sum() + (z * torch.arange(z.numel(), dtype=z.dtype).view(z.shape)).sum()


def _grads(args: Any) -> list[torch.Tensor | None]:
    out = []
    for t in (args.type, args.isinstance, args.getattr):
        out.append(None if t is None or t.grad is None else t.grad.clone())
        if t is not None:
            t.grad = None
    return out


# name -> (field changes, whether the eager call runs the impls: the plain call declines)
VARIANTS = {
    "plain call": ({}, False),
    "impls": ({"args": "a note"}, True),
    "sum, float32, no bias": (
        {"str": "sum", "torch": torch.float32, "getattr": None, "int": None},
        False,
    ),
}


def _variant(name: str) -> Any:
    return make_args(**VARIANTS[name][0])


def test_the_bundle_round_trips(g):
    args = make_args(dict=(2, 2), tuple=(0, 9))
    back = g.unflatten_shadowing_op_fwd_args(*g.flatten_shadowing_op_fwd_args(args))
    fixture_ops.same_bundle(
        back, dataclasses.replace(args, outputs=torch.Size(args.outputs), dict=torch.Size((2, 2)))
    )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_eager_call_equals_plain_pytorch(g, name, monkeypatch):
    calls = []
    real = op.shadowing_op_forward
    monkeypatch.setattr(g, "shadowing_op_forward", lambda a: calls.append(a) or real(a))
    args, ref = _variant(name), _variant(name)
    out = g.call_shadowing_op(**fields_by_name(args))
    assert len(calls) == VARIANTS[name][1], "the path the call took"
    want = plain_pytorch(ref)
    for o, w in zip(out, want, strict=True):
        torch.testing.assert_close(o, w)
    _loss(out).backward()
    _loss(want).backward()
    for a, b in zip(_grads(args), _grads(ref), strict=True):
        torch.testing.assert_close(a, b)


def _compiled_call(g: ModuleType, template: Any) -> Any:
    def f(x, w, b):
        return g.call_shadowing_op(
            **fields_by_name(dataclasses.replace(template, type=x, isinstance=w, getattr=b))
        )

    return torch.compile(f, fullgraph=True, backend="aot_eager")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_compiled_call_equals_eager_bit_for_bit(g, name):
    torch._dynamo.reset()
    eager_args, comp_args = _variant(name), _variant(name)
    eager = g.call_shadowing_op(**fields_by_name(eager_args))
    _loss(eager).backward()
    compiled = _compiled_call(g, comp_args)(comp_args.type, comp_args.isinstance, comp_args.getattr)
    _loss(compiled).backward()
    for a, b in zip([*eager, *_grads(eager_args)], [*compiled, *_grads(comp_args)], strict=True):
        assert (a is None and b is None) or torch.equal(a.detach(), b.detach())


def test_a_bad_field_value_is_named(g):
    """The checks of the generic path (the plain call declines: `args` is set)."""
    with pytest.raises(ValueError, match="ShadowingOpFwdArgs.str: expected one of"):
        g.call_shadowing_op(**fields_by_name(make_args(str="max", args="generic")))
    with pytest.raises(TypeError, match="ShadowingOpFwdArgs.int"):
        g.call_shadowing_op(**fields_by_name(make_args(int="3", args="generic")))
    with pytest.raises(TypeError, match="ShadowingOpFwdArgs.torch"):
        g.shadowing_op_fwd_slots(*fields_by_name(make_args(torch="float32")).values())


def test_the_declared_eager_reason_reads_its_fields(g):
    """`quantized(isinstance) and bool` under torch.compile: the blocker's `isinstance`
    test (the builtin, through its alias) on the field `isinstance`."""
    weight = fixture_ops.QUANTIZERS["fp8"].quantize(torch.randn(N, K, dtype=torch.float32))
    args = make_args(
        requires_grad=False, isinstance=weight, type=torch.randn(*BATCH, K), getattr=None
    )
    assert (
        g.shadowing_op_compile_blocker(weight, True, None, [])
        == "a quantized weight with a negated z"
    )
    assert g.shadowing_op_compile_blocker(weight, False, None, []) is None
    assert g.shadowing_op_compile_blocker(args.type, True, None, []) is None
    torch._dynamo.reset()
    compiled = torch.compile(lambda **kw: g.call_shadowing_op(**kw), backend="aot_eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = compiled(**fields_by_name(args))
    reasons = [str(w.message) for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert any("a quantized weight with a negated z" in r for r in reasons), reasons
    for a, b in zip(got, op.shadowing_op_forward(args)[0], strict=True):
        torch.testing.assert_close(a, b)
