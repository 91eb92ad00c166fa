"""The fixture ops that are generated, imported and executed use every field kind.

``codegen/kinds.py`` holds one record per kind; a kind that no executed fixture uses
is a kind whose generated code never runs in the test suite. These tests compare the
kinds table with the fields of the fixture ops' bundles (as the generator classified
them), so adding a kind record without exercising it fails here.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the fixtures' namespace package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from codegen.kinds import KINDS, Gradient  # noqa: E402
from codegen.model import Kind  # noqa: E402
from tests.ops import fixture_ops  # noqa: E402

# Kinds without a non-optional use in the fixtures, and why.
_ONLY_OPTIONAL = {
    # Always optional: the value must be None at call time.
    Kind.UNSUPPORTED: "a None-only field is optional by definition",
    # A non-optional group needs an initialised process group; tests/distributed runs that.
    Kind.PROCESS_GROUP: "a set group needs torch.distributed initialised (tests/distributed)",
    # No reference quantizer is an identity, so an always-set quantizer would make the
    # fixtures' plain-PyTorch references quantize too; Optional[Quantizer] is exercised
    # set and None, and List[Quantizer] elements are always set.
    Kind.QUANTIZER: "exercised as Optional[Quantizer], set and None",
}


def _uses() -> set[tuple[Kind, bool]]:
    return {
        (f.type.kind, f.type.optional)
        for module in fixture_ops.source_modules()
        for op in module.ops
        for bundle in (op.forward, op.backward)
        for f in bundle.fields
    }


def test_every_fixture_op_module_is_generated_and_has_its_tests():
    here = Path(__file__).resolve().parent
    on_disk = {f"{fixture_ops.FIXTURE_DIR}/{p.name}" for p in (here / "fixtures").glob("*.py")}
    assert set(fixture_ops.FIXTURE_SOURCES) == on_disk
    for source in fixture_ops.FIXTURE_SOURCES:
        stem = Path(source).stem
        test_file = here / f"test_{stem}.py"
        assert test_file.is_file(), f"{source} has no tests ({test_file.name})"
        assert f'fixture_ops.load("{stem}")' in test_file.read_text(encoding="utf-8"), (
            f"{test_file.name} does not import the generated module of {source}"
        )


def test_every_kind_record_is_used_by_an_executed_fixture_op():
    used = {kind for kind, _ in _uses()}
    unused = [r.name for r in KINDS if r.kind not in used]
    assert not unused, f"kind records no fixture op exercises at run time: {unused}"


def test_every_kind_is_used_as_an_optional_field():
    used = {kind for kind, optional in _uses() if optional}
    missing = [r.name for r in KINDS if r.kind not in used]
    assert not missing, f"kinds no fixture op uses as Optional[...]: {missing}"


def test_every_kind_is_used_as_a_required_field_or_is_listed_why_not():
    used = {kind for kind, optional in _uses() if not optional}
    missing = {r.kind for r in KINDS if r.kind not in used}
    assert missing == set(_ONLY_OPTIONAL), (
        f"required uses missing for {sorted(k.value for k in missing - set(_ONLY_OPTIONAL))}; "
        f"now used, drop from _ONLY_OPTIONAL: {sorted(k.value for k in set(_ONLY_OPTIONAL) - missing)}"
    )


def test_both_backward_gradient_forms_are_exercised():
    forms = {
        f.name
        for module in fixture_ops.source_modules()
        for op in module.ops
        for f in op.backward.fields
        if f.name in ("grad_outputs", "grad_output")
    }
    assert forms == {"grad_outputs", "grad_output"}


def test_every_kind_that_may_receive_a_gradient_receives_one_in_an_executed_fixture_op():
    """Each kind whose record carries gradients (one, or one per list element: tensor,
    tensor list, tensor-or-quantized, tensor-or-quantized list) is a gradient field of a
    fixture op, so its autograd glue runs."""
    grad_kinds = {
        op.forward.field(g).type.kind
        for module in fixture_ops.source_modules()
        for op in module.ops
        for g in op.grad_fields
    }
    carrying = {r.kind for r in KINDS if r.gradient is not Gradient.NONE}
    assert {Kind.TENSOR_LIST, Kind.TENSOR_OR_QUANTIZED_LIST} <= carrying
    missing = sorted(k.value for k in carrying - grad_kinds)
    assert not missing, f"no fixture op declares a gradient field of kind {missing}"
