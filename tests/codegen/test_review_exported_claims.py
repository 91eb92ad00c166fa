"""What ``codegen diff`` says about exported programs, checked against torch itself.

The review's verdicts for the consumer "exported programs" rest on how
``torch.export.load`` binds a saved op call to the op's schema at load time: by argument
name, a schema argument the program lacks taking its schema default. Here a program is
exported and saved with an op of schema ``(Tensor x, float a)``; the op is then
redefined as a changed schema, and the saved program loaded and run. Each case names
the review rule whose exported-program verdict it grounds.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.library import Library

NAMESPACE = "teops_review_claims"
ORIGINAL = "(Tensor x, float a) -> Tensor[]"


def _define(schema: str, impl: Callable[..., list[torch.Tensor]]) -> Library:
    lib = Library(NAMESPACE, "FRAGMENT")
    lib.define(f"f{schema}")
    lib.impl("f", impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::f", impl, lib=lib)
    return lib


class _CallsTheOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(torch.ops, NAMESPACE).f(x, 3.0)[0]


@pytest.fixture(scope="module")
def saved_program() -> Iterator[bytes]:
    lib = _define(ORIGINAL, lambda x, a: [x * a])
    try:
        program = torch.export.export(_CallsTheOp(), (torch.ones(2),))
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
    finally:
        lib._destroy()
    yield buffer.getvalue()


# rule -> (the changed schema, its kernel, what loading and running the saved program gives:
# the result, or None when it fails)
CASES = {
    "FIELD_ADDED without a schema default (breaking)": (
        "(Tensor x, float a, bool b) -> Tensor[]",
        lambda x, a, b: [x * a],
        None,
    ),
    "SLOT_ADDED with a schema default (compatible)": (
        "(Tensor x, float a, bool b=False) -> Tensor[]",
        lambda x, a, b=False: [x * a],
        3.0,
    ),
    "FIELD_MOVED (compatible: matched by name)": (
        "(float a, Tensor x) -> Tensor[]",
        lambda a, x: [x * a],
        3.0,
    ),
    "FIELD_REMOVED (breaking: the saved value is dropped silently)": (
        "(Tensor x) -> Tensor[]",
        lambda x: [x * 7.0],
        7.0,
    ),
    "FIELD_TYPE_CHANGED (breaking)": (
        "(Tensor x, int a) -> Tensor[]",
        lambda x, a: [x * a],
        None,
    ),
    "FIELD_TYPE_WIDENED (compatible)": (
        "(Tensor x, float? a) -> Tensor[]",
        lambda x, a: [x * a],
        3.0,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_saved_program_loads_against_a_changed_schema_as_the_review_says(
    saved_program: bytes, case: str
) -> None:
    schema, impl, expected = CASES[case]
    lib = _define(schema, impl)
    try:
        try:
            result = torch.export.load(io.BytesIO(saved_program)).module()(torch.ones(2))
        except RuntimeError:
            result = None
    finally:
        lib._destroy()
    if expected is None:
        assert result is None, f"{case}: expected a failure, the program ran"
    else:
        assert result is not None, f"{case}: expected the program to load and run"
        assert result.tolist() == [expected, expected]
