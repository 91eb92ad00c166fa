"""Decode and parse a source file's text, within the bound on what libcst may parse.

Python's own parser looks first (it positions syntax errors as Python does and bounds
the nesting libcst would recurse into); libcst's tree is what the reader walks.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import io
import tokenize
from collections.abc import Iterator

import libcst as cst

from . import nesting
from .errors import CodegenError, Location

_SYNTAX_HINT = "fix the Python syntax; the generator reads this file as text"


def _syntax_error(path: str, text: str, exc: cst.ParserSyntaxError) -> CodegenError:
    """Position a syntax error the way Python does.

    libcst's native parser reports column 0 and often the line after the error, so
    the position and message come from Python's own parser (``ast.parse`` compiles
    nothing and runs nothing); libcst's are kept only when Python accepts the text.
    """
    try:
        ast.parse(text, filename=path)
    except SyntaxError as py:
        if py.lineno:
            return CodegenError(
                Location(path, py.lineno, py.offset or 1), f"syntax error: {py.msg}", _SYNTAX_HINT
            )
    except ValueError:  # e.g. a NUL byte (Python < 3.12 raises ValueError for it)
        pass
    message = str(exc.message).rstrip(".")
    return CodegenError(
        Location(path, exc.raw_line, exc.raw_column + 1), f"syntax error: {message}", _SYNTAX_HINT
    )


def decode_source(path: str, data: bytes) -> str:
    """A source file's text, decoded as Python decodes it (UTF-8 unless a coding cookie
    says otherwise); an undecodable byte is an error at its position."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        raise CodegenError(
            Location(path, 1, 1), f"bad encoding declaration: {exc.msg}", "save it as UTF-8"
        ) from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        where = Location(path, data.count(b"\n", 0, exc.start) + 1, exc.start - line_start + 1)
        raise CodegenError(
            where,
            f"byte 0x{data[exc.start]:02x} is not valid {exc.encoding.upper()}",
            "save the file as UTF-8 (Python reads source as UTF-8 unless a "
            "`# -*- coding: ... -*-` line says otherwise)",
        ) from None


class LibcstBudgetExceeded(CodegenError):
    """A module libcst would parse past the bound :func:`libcst_budget` sets."""


# What libcst may still parse in the current context ([bytes left, the bound]); None:
# no bound. A context variable, so concurrent readings (threads, tasks) never share one.
_LIBCST_BUDGET: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "libcst_budget", default=None
)


@contextlib.contextmanager
def libcst_budget(limit: int) -> Iterator[None]:
    """Bound the bytes libcst parses in the block (op modules and the modules whose type
    aliases they use): libcst takes seconds and hundreds of MiB per MiB of source, so an
    untrusted tree (a revision under review) is read within a bound. A module past it is
    ``LibcstBudgetExceeded`` at its path, never skipped."""
    token = _LIBCST_BUDGET.set([limit, limit])
    try:
        yield
    finally:
        _LIBCST_BUDGET.reset(token)


def _charge_libcst(path: str, text: str) -> None:
    budget = _LIBCST_BUDGET.get()
    if budget is None:
        return
    budget[0] -= len(text.encode("utf-8", "surrogatepass"))
    if budget[0] < 0:
        raise LibcstBudgetExceeded(
            Location(path, 1, 1),
            f"with this module, libcst would parse more than the {budget[1]} bytes it may "
            "parse here",
            "the bound on an untrusted tree (docs/review.md, Bounds)",
        )


def parse_module(path: str, text: str) -> cst.Module:
    """A source text's libcst tree, charged to the context's libcst budget; a syntax error
    or nesting past what the parsers can follow is an error at its position."""
    # Python's parser first: it refuses nesting deeper than it can compile (200 brackets)
    # with a position; then no statement may nest deeper than libcst's recursive tree
    # building and walking, and the reader's, can follow (nesting.py). The text is
    # charged to the context's libcst budget first, before either parser reads it.
    _charge_libcst(path, text)
    tree: ast.Module | None = None
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise CodegenError(
            Location(path, exc.lineno or 1, exc.offset or 1),
            f"syntax error: {exc.msg}",
            _SYNTAX_HINT,
        ) from None
    except (RecursionError, MemoryError):
        pass  # nested beyond what Python's parser builds: measured on its tokens
    except ValueError:  # a NUL byte (Python < 3.12): libcst's report below
        return _parse_libcst(path, text)
    nesting.check_module(path, text, tree)
    return _parse_libcst(path, text)


def _parse_libcst(path: str, text: str) -> cst.Module:
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise _syntax_error(path, text, exc) from None
