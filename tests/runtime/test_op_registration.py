"""Registration of generated ops: torch's real argument limit, and failures never silent.

The generator refuses a bundle with more schema arguments than
``codegen.bundle_reader.MAX_SCHEMA_ARGUMENTS``; these tests pin that number to the installed
torch's dispatcher, and show that a schema torch refuses anyway stops the generated
module's import with the reason, while a missing torch capability after the definition
keeps the documented eager fallback.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from codegen.bundle_reader import MAX_SCHEMA_ARGUMENTS
from transformer_engine_ops.runtime import custom_ops
from transformer_engine_ops.runtime.custom_ops import OpRegistrationError, define_op

_NAMESPACES = itertools.count()


def _namespace() -> str:
    """A fresh namespace per op, so no test sees another's definitions."""
    return f"teops_registration_test_{next(_NAMESPACES)}"


def _schema(count: int) -> str:
    return "(" + ", ".join(f"Tensor? a{i}" for i in range(count)) + ") -> Tensor[]"


def _kernel(*slots: object) -> list[torch.Tensor]:
    return [torch.zeros(1)]


def test_the_dispatcher_takes_exactly_the_generators_limit() -> None:
    """N arguments define and run; N + 1 are refused by the dispatcher's argument bitset."""
    lib = torch.library.Library(_namespace(), "FRAGMENT")
    lib.define("at_limit" + _schema(MAX_SCHEMA_ARGUMENTS))
    lib.impl("at_limit", _kernel, "CompositeExplicitAutograd")
    op = getattr(torch.ops, lib.ns).at_limit.default
    assert op(*[None] * MAX_SCHEMA_ARGUMENTS)[0].shape == (1,)

    with pytest.raises(RuntimeError, match=rf"only supports {MAX_SCHEMA_ARGUMENTS}\b"):
        lib.define("over_limit" + _schema(MAX_SCHEMA_ARGUMENTS + 1))


def test_a_schema_torch_refuses_raises_with_the_reason() -> None:
    qualname = f"{_namespace()}::too_wide"
    with pytest.raises(OpRegistrationError) as raised:
        define_op(qualname, _schema(MAX_SCHEMA_ARGUMENTS + 1), _kernel, _kernel, ())
    message = str(raised.value)
    assert qualname in message and torch.__version__ in message
    assert f"{MAX_SCHEMA_ARGUMENTS + 1} arguments" in message


def test_an_op_defined_twice_raises_instead_of_returning_none() -> None:
    qualname = f"{_namespace()}::twice"
    assert define_op(qualname, _schema(1), _kernel, _kernel, ()) is not None
    with pytest.raises(OpRegistrationError, match="twice"):
        define_op(qualname, _schema(1), _kernel, _kernel, ())


def test_a_missing_torch_capability_keeps_the_eager_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the definition, a failure is recorded for modules/_call.py and None returned."""
    recorded: list[str] = []
    monkeypatch.setattr(custom_ops, "_REGISTRATION_ERRORS", recorded)

    def missing(*args: object, **kwargs: object) -> None:
        raise AttributeError("register_fake is not available")

    monkeypatch.setattr(torch.library, "register_fake", missing)
    qualname = f"{_namespace()}::no_fake"

    assert define_op(qualname, _schema(1), _kernel, _kernel, ()) is None
    assert custom_ops.registration_error() == recorded[0]
    assert qualname in recorded[0] and "register_fake is not available" in recorded[0]
