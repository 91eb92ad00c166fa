"""The ``setup_context`` contract: the generated code copies every backward field whose
forward field has the same name and annotation; ``setup_context`` returns the others.
The generator and ``OpDeclaration`` apply one rule, and a wrong dict is refused by name."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import pytest
import torch

from transformer_engine_ops.generated import MODULES
from transformer_engine_ops.runtime.declaration import OpDeclaration, check_setup_context


def _declarations() -> list[tuple[str, OpDeclaration]]:
    found = []
    for name in MODULES:
        ops = importlib.import_module(f"transformer_engine_ops.ops.{name}")
        for value in vars(ops).values():
            if isinstance(value, OpDeclaration) and value.forward.__module__ == ops.__name__:
                found.append((name, value))
    return found


@pytest.mark.parametrize(("module", "decl"), _declarations(), ids=lambda v: getattr(v, "name", v))
def test_generated_copies_are_the_declarations(module: str, decl: OpDeclaration) -> None:
    generated = importlib.import_module(f"transformer_engine_ops.generated.{module}")
    assert generated.COPIED_FIELDS == decl.copied_fields
    assert generated.SETUP_CONTEXT_FIELDS == decl.made_fields


@dataclass
class _Fwd:
    inp: torch.Tensor
    scale: float
    name: str


@dataclass
class _Bwd:
    grad_outputs: list[torch.Tensor]
    scale: float
    name: str
    shape: list[int]


def _decl(setup, derived=()):
    return OpDeclaration("t", _Fwd, _Bwd, ("inp",), setup_context=setup, derived=derived)


def _args() -> _Fwd:
    return _Fwd(torch.ones(2, 3), 0.5, "n")


def test_backward_args_copies_and_adds_what_setup_context_made() -> None:
    decl = _decl(lambda a, o, s: dict(shape=list(a.inp.shape)))
    assert decl.copied_fields == ("scale", "name")
    assert decl.backward_args(_args(), (), ()) == _Bwd([], 0.5, "n", [2, 3])


def test_derived_field_comes_from_setup_context() -> None:
    decl = _decl(lambda a, o, s: dict(shape=[1], scale=2.0), derived=("scale",))
    assert decl.copied_fields == ("name",)
    assert decl.backward_args(_args(), (), ()).scale == 2.0


@pytest.mark.parametrize(
    ("made", "message"),
    [
        (dict(shape=[1], scale=1.0), r"_Bwd\.scale: s returned it, but the generated code copies"),
        (dict(), r"_Bwd\.shape: s returned no value for it"),
        (dict(shape=[1], other=1), r"_Bwd\.other: s returned it, but _Bwd has no such field"),
        (_Bwd([], 0.5, "n", [1]), r"s returned _Bwd, not a dict: return dict\(field=value"),
    ],
)
def test_wrong_dict_is_refused_naming_the_field(made: object, message: str) -> None:
    def s(args, outputs, saved):
        return made

    with pytest.raises(TypeError, match=message):
        _decl(s).backward_args(_args(), (), ())


def test_check_accepts_exactly_the_expected_fields() -> None:
    check_setup_context({"a": 1}, frozenset({"a"}), ("b",), "B", "s")
    with pytest.raises(TypeError, match=r"B\.b: s returned it"):
        check_setup_context({"a": 1, "b": 2}, frozenset({"a"}), ("b",), "B", "s")
