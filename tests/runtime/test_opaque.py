"""The opaque-object compatibility module: registration, names, failures recorded."""

from __future__ import annotations

import dataclasses

import torch

from transformer_engine_ops.runtime import opaque
from transformer_engine_ops.runtime.quantizer import Quantizer


@dataclasses.dataclass(frozen=True)
class _Point(opaque.OpaqueBase):
    x: int = 0

    def __fx_repr__(self):
        return f"_Point(x={self.x!r})", {"_Point": _Point}


class _Child(_Point):
    pass


class _NoEquality(opaque.OpaqueBase):
    """torch refuses a value type with identity equality."""

    def __fx_repr__(self):
        return "_NoEquality()", {"_NoEquality": _NoEquality}


def test_a_registered_value_type_and_its_subclasses_share_one_schema_name():
    opaque.register_value_type(_Point)
    opaque.register_value_type(_Point)  # idempotent
    name = f"{__name__}._Point"
    assert opaque.opaque_type_name(_Point) == name
    assert opaque.opaque_type_name(_Child) == name
    assert opaque.is_value_type(_Point(1)) and opaque.is_value_type(_Child)


def test_the_quantizer_base_is_the_schema_type_of_every_quantizer():
    assert (
        opaque.opaque_type_name(Quantizer) == "transformer_engine_ops.runtime.quantizer.Quantizer"
    )


def test_registration_failure_is_recorded_not_raised():
    before = list(opaque._ERRORS)
    try:
        opaque.register_value_type(_NoEquality)
        assert not opaque.is_value_type(_NoEquality())
        reason = opaque.value_type_registration_error()
        assert reason is not None and "_NoEquality" in reason and "__eq__" in reason
    finally:
        opaque._ERRORS[:] = before
    assert opaque.value_type_registration_error() == (before[0] if before else None)


def test_unregistered_classes_are_not_value_types_and_have_no_name():
    class Loose:
        pass

    assert not opaque.is_value_type(Loose)
    try:
        opaque.opaque_type_name(Loose)
    except TypeError as exc:
        assert "not a registered value-opaque type" in str(exc)
    else:
        raise AssertionError("expected TypeError")


def test_opt_out_by_class_attribute_is_respected():
    class Stateful(_Point):
        value_opaque = False

    assert not opaque.is_value_type(Stateful)


def test_opaque_base_is_torchs_where_it_exists():
    base = getattr(getattr(torch, "_opaque_base", None), "OpaqueBase", None)
    if base is not None:
        assert opaque.OpaqueBase is base
    assert issubclass(Quantizer, opaque.OpaqueBase)


def test_only_the_compat_module_touches_the_private_api():
    import pathlib

    root = pathlib.Path(opaque.__file__).parents[1]
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "opaque.py"
        and ("_library.opaque_object" in p.read_text() or "_opaque_base" in p.read_text())
    ]
    assert offenders == []
