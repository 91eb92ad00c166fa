"""The ``setup_context`` contract: which backward fields the generated code copies.

A backward field whose forward field has the same name and annotation is a copy: the
generated code fills it from the forward bundle. The op's hand-written ``setup_context``
returns ``dict(field=value, ...)`` of every other backward field (saved and derived
values), less the gradient receiver the backward fills. The declaration's ``derived``
names the fields setup_context computes although a forward field has their name and
type. ``runtime/declaration.py`` applies the same rule to the bundle classes.

Where every ``return`` of ``setup_context`` is a ``dict(...)`` call (or a ``{...}``
literal with string keys), its keys are checked here, positioned; otherwise the
generated code checks the returned dict on each call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import libcst as cst

from .errors import CodegenError, Location
from .model import GRAD_OUTPUT_FIELD, GRAD_OUTPUTS_FIELD, Bundle

_RECEIVERS = (GRAD_OUTPUTS_FIELD, GRAD_OUTPUT_FIELD)


def copied_fields(forward: Bundle, backward: Bundle, derived: Sequence[str]) -> tuple[str, ...]:
    """The backward fields copied from the forward bundle, in the backward bundle's order."""
    return tuple(
        f.name
        for f in backward.fields
        if f.name not in _RECEIVERS
        and f.name not in derived
        and (source := forward.field(f.name)) is not None
        and source.source_text == f.source_text
    )


def made_fields(backward: Bundle, copied: Sequence[str]) -> tuple[str, ...]:
    """The backward fields ``setup_context`` returns."""
    return tuple(
        f.name for f in backward.fields if f.name not in copied and f.name not in _RECEIVERS
    )


def check_derived(
    forward: Bundle,
    backward: Bundle,
    derived: Sequence[str],
    locations: Sequence[Location],
    key: str,
) -> None:
    """Each ``derived`` name must be a backward field that would otherwise be a copy."""
    would_copy = copied_fields(forward, backward, ())
    for name, where in zip(derived, locations, strict=True):
        if backward.field(name) is None:
            raise CodegenError(
                where,
                f"`{key}` names `{name}`, which is not a field of {backward.name}",
                f"name fields of {backward.name}, or drop `{name}`",
            )
        if name not in would_copy:
            raise CodegenError(
                where,
                f"`{key}` names `{backward.name}.{name}`, which is not a copy (no "
                f"{forward.name} field has its name and type): setup_context returns it anyway",
                f"drop `{name}` from {key}",
            )


def _returns(body: cst.CSTNode) -> Iterator[cst.Return]:
    """The ``return`` statements of a function body, not of functions nested in it."""
    found: list[cst.Return] = []

    class Visitor(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            found.append(node)

    body.visit(Visitor())
    yield from found


def _keys(value: cst.BaseExpression | None) -> list[tuple[str, cst.CSTNode]] | None:
    """The keys of ``dict(a=..., ...)`` or ``{"a": ..., ...}`` with their nodes; None
    where they are not all written out."""
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Name)
        and value.func.value == "dict"
        and all(a.keyword is not None and not a.star for a in value.args)
    ):
        return [(a.keyword.value, a.keyword) for a in value.args]  # type: ignore[union-attr]
    if isinstance(value, cst.Dict):
        keys = []
        for element in value.elements:
            if not isinstance(element, cst.DictElement) or not isinstance(
                element.key, cst.SimpleString
            ):
                return None
            keys.append((str(element.key.evaluated_value), element.key))
        return keys
    return None


def check_returns(
    fn: cst.FunctionDef,
    forward: Bundle,
    backward: Bundle,
    copied: Sequence[str],
    made: Sequence[str],
    loc: object,
) -> None:
    """Check every ``return`` of ``setup_context`` whose keys are written out; raise at
    a return of the whole backward bundle (the form before copies were generated)."""
    name = fn.name.value
    hint_made = ", ".join(made) or "none, dict()"
    for ret in _returns(fn.body):
        value = ret.value
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Name)
            and value.func.value == backward.name
        ):
            raise CodegenError(
                loc(value),  # type: ignore[operator]
                f"`{name}` returns the whole backward bundle {backward.name}; the generated "
                f"code copies its fields from {forward.name} and builds it",
                f"return dict(...) of the fields that are not copies: {hint_made}",
            )
        keys = _keys(value)
        if keys is None:
            continue  # checked on each call by the generated code
        seen: set[str] = set()
        for key, node in keys:
            if key in copied:
                raise CodegenError(
                    loc(node),  # type: ignore[operator]
                    f"`{name}` returns `{backward.name}.{key}`, which the generated code "
                    f"copies from `{forward.name}.{key}` (same name and type)",
                    f"drop `{key}` from the dict, or name it in the declaration's "
                    "`derived` to compute it",
                )
            if key not in made:
                raise CodegenError(
                    loc(node),  # type: ignore[operator]
                    f"`{name}` returns `{key}`, which is not a field of {backward.name} "
                    "that setup_context fills",
                    f"return only: {hint_made}",
                )
            seen.add(key)
        missing = [m for m in made if m not in seen]
        if missing:
            raise CodegenError(
                loc(ret),  # type: ignore[operator]
                f"`{name}` returns no `{backward.name}.{missing[0]}`"
                + (f" (nor {', '.join(missing[1:])})" if len(missing) > 1 else "")
                + f": no {forward.name} field has its name and type, so it is not copied",
                f"add {missing[0]}=... to the returned dict",
            )
