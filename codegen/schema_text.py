"""Op schema text read back into arguments, without torch (the generator never imports it).

``codegen diff`` compares schemas as each side's templates wrote them, so a template or
configuration change that alters a schema is seen as the arguments it changes.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class SchemaArg:
    type: str
    name: str
    default: str | None = None

    def __str__(self) -> str:
        return f"{self.type} {self.name}" + ("" if self.default is None else f"={self.default}")


@dataclass(frozen=True)
class Schema:
    """One op's registered name and schema text (``(Tensor x, ...) -> Tensor[]``)."""

    qualname: str
    text: str

    @functools.cached_property
    def _parsed(self) -> tuple[tuple[SchemaArg, ...], str]:
        return parse_schema(self.text)

    @property
    def args(self) -> tuple[SchemaArg, ...]:
        return self._parsed[0]

    @property
    def returns(self) -> str:
        return self._parsed[1]


_SCHEMA = re.compile(r"\((?P<args>.*)\)\s*->\s*(?P<returns>.+)", re.DOTALL)


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_schema(text: str) -> tuple[tuple[SchemaArg, ...], str]:
    """``(Tensor x, SymInt[2] y=[1, 1]) -> Tensor[]`` -> its arguments and return type.

    The generator must not import torch, so this reads the subset of the schema grammar
    that generated schemas use (``*`` marks keyword-only arguments and is skipped: the
    consumers here bind by position or by name either way).
    """
    match = _SCHEMA.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not an op schema: {text!r}")
    args = []
    for part in _split_top_level(match["args"]):
        if part == "*":
            continue
        decl, eq, default = part.partition("=")
        pieces = decl.split()
        if len(pieces) != 2:
            raise ValueError(f"schema argument {part!r} is not `Type name[=default]`")
        args.append(SchemaArg(pieces[0], pieces[1], default.strip() if eq else None))
    return tuple(args), match["returns"].strip()
