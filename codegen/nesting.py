"""How deeply the source the generator reads may nest, measured before libcst parses it.

libcst builds, walks (positions, ``code_for_node``) and prints its trees recursively,
three Python frames or so a level, and so does the reader's annotation walk: a 3000-way
``None | ... | torch.Tensor`` union overflowed Python's stack (a RecursionError after
~10 s of parsing) and a 10000-way one crashes libcst's native parser outright. Python's
own parser stops at 200 nested brackets, but not at a long chain of operators, ``or``s,
attribute dots or implicitly concatenated strings (flat in Python's tree, a chain in
libcst's). So every text is measured first, on its tokens, and one that nests deeper
than :data:`MAX_LEVELS` is an error at the token where it does.

The measure follows libcst's tree, from above: within one logical line, each operator,
``.``, ``:``, ``=``, unary ``not``, ``and``/``or``, ``if``/``else``, ``lambda``,
``await``, ``yield``, a comprehension's ``for`` and each string that continues a string
is one level; an open bracket is four (``x[`` is Subscript, SubscriptElement, Index);
a comma or ``;`` ends a sibling, so it takes back the levels its sibling added (not
those of a ``lambda`` or ``for`` whose parameters or targets it separates); a
comparison operator is none (libcst keeps a comparison chain flat); each enclosing
block is three, and each ``elif`` of an ``if`` one more (libcst nests it in the
``if``'s ``orelse``).

Real code stays far below the bound: this project's op modules reach 44 (a 30-term
``or`` chain), its whole tree 65, TE 2.20's ``transformer_engine/pytorch`` 43.
Tokenizing a whole module costs a sixth of a generator run (0.17 s for the op
modules), so a module Python parsed is measured per statement from its tree: a
statement whose characters alone cannot reach the bound (``_line_weight``) is not
tokenized (17 ms for the op modules).
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from itertools import accumulate

from .errors import CodegenError, Location

# At three frames a libcst level, 150 levels stay within Python's default recursion
# limit of 1000 with room for the caller's own frames (a test runner's ~100).
MAX_LEVELS = 150
BLOCK = 3  # levels of each enclosing block (If -> IndentedBlock -> statement line)
BRACKET = 4  # levels of an open bracket, its own token included

HINT = (
    "write it flatter: a union names each type once (`X | None`), and a long "
    "expression reads better split into named parts"
)

_OPEN = frozenset("([{")
_CLOSE = frozenset(")]}")
_SEPARATORS = frozenset({",", ";"})
_COMPARISONS = frozenset({"<", ">", "==", "!=", "<=", ">=", "<>"})
_KEYWORDS = frozenset(
    {"and", "or", "not", "if", "else", "lambda", "await", "yield", "for", "async", "from"}
)
# Keywords whose level a comma inside their parameters or targets does not end.
_STICKY = frozenset({"lambda", "for"})
_SKIP = frozenset(
    {tokenize.NL, tokenize.COMMENT, tokenize.ENCODING, getattr(tokenize, "FSTRING_MIDDLE", -1)}
)
_STRINGS = frozenset({tokenize.STRING, getattr(tokenize, "FSTRING_START", -1)})
# Python < 3.12 tokenizes an f-string as one STRING token; libcst parses its fields.
_WHOLE_FSTRINGS = sys.version_info < (3, 12)
_FSTRING_PREFIX = re.compile(r"[A-Za-z]*[fF][A-Za-z]*(?=['\"])")


class _Overflow(Exception):
    def __init__(self, row: int, col: int) -> None:
        super().__init__(row, col)
        self.row, self.col = row, col


def _fstring_fields(token: str) -> Iterator[str]:
    """The replacement-field expressions of an f-string token, each with its format spec."""
    quote = len(_FSTRING_PREFIX.match(token)[0])  # type: ignore[index]
    width = 3 if token[quote : quote + 3] in ('"""', "'''") else 1
    end = len(token) - width
    i = quote + width
    while i < end:
        if token[i] != "{":
            i += 1
            continue
        if token[i + 1] == "{":
            i += 2
            continue
        depth, j, inner = 1, i + 1, ""
        while j < end and depth:
            c = token[j]
            if inner:
                inner = "" if c == inner else inner
            elif c in "'\"":
                inner = c
            elif c in _OPEN:
                depth += 1
            elif c in _CLOSE:
                depth -= 1
            j += 1
        yield token[i + 1 : j - 1]
        i = j


def _measure(text: str, base: int, first: int = 1, shift: list[int] | None = None) -> None:
    """Raise ``_Overflow`` at the first token of ``text`` deeper than MAX_LEVELS.

    ``base`` is the levels ``text`` starts at and ``first`` the line it starts on;
    ``shift[i]`` is the indentation stripped from its line ``i`` (moved back into the
    reported column), None where the text keeps its own indentation (then INDENT and
    DEDENT tokens open and close blocks).
    """
    runs = [0]  # per open bracket: the levels its current sibling added
    sticky = [0]  # per open bracket: the levels of its `lambda`s and `for`s
    chains = [0]  # per indentation: the `elif`s of the `if` statement at it
    total = indent = base
    previous = ""  # the previous token's text ("" at a line start)
    last_type = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        kind, string = tok.type, tok.string
        if kind in _SKIP:
            continue
        if kind in (tokenize.NEWLINE, tokenize.ENDMARKER):
            runs, sticky, total, previous, last_type = [0], [0], indent, "", kind
            continue
        if kind == tokenize.INDENT:
            chains.append(0)
            indent += BLOCK
            total = indent
            continue
        if kind == tokenize.DEDENT:
            indent -= BLOCK + chains.pop() if len(chains) > 1 else 0
            total = indent
            continue
        if shift is None and not previous and string != "else":  # a line's first token
            # An `elif` is an If in its `if`'s orelse: one level down in libcst's tree.
            step = 1 if string == "elif" else -chains[-1]
            chains[-1] += step
            indent += step
            total = indent
        add = 0
        if kind == tokenize.OP:
            if string in _SEPARATORS:
                total -= runs[-1]
                runs[-1] = 0
            elif string in _CLOSE:
                if len(runs) > 1:
                    total -= runs.pop() + sticky.pop() + BRACKET - 1
            elif string in _OPEN:
                runs[-1] += 1
                runs.append(0)
                sticky.append(0)
                add = BRACKET
            elif string not in _COMPARISONS:
                add = 1
                runs[-1] += 1
        elif kind == tokenize.NAME and string in _KEYWORDS:
            if not (string == "not" and previous == "is"):
                add = 1
                if string in _STICKY:
                    sticky[-1] += 1
                else:
                    runs[-1] += 1
        elif kind in _STRINGS:
            if last_type in _STRINGS or last_type == getattr(tokenize, "FSTRING_END", -2):
                add = 1
                runs[-1] += 1
            if _WHOLE_FSTRINGS and kind == tokenize.STRING and _FSTRING_PREFIX.match(string):
                for field in _fstring_fields(string):
                    try:  # the parentheses stand for the field's braces
                        _measure(f"({field})", total + add)
                    except _Overflow:
                        raise _Overflow(*_position(tok.start, first, shift)) from None
                    except (tokenize.TokenError, SyntaxError):
                        pass  # not an expression Python accepts: libcst reports it
        total += add
        if total > MAX_LEVELS:
            raise _Overflow(*_position(tok.start, first, shift))
        previous, last_type = string, kind


def _position(start: tuple[int, int], first: int, shift: list[int] | None) -> tuple[int, int]:
    row, col = start
    if shift is not None and row <= len(shift):
        col += shift[row - 1]
    return first + row - 1, col + 1


def _error(where: Location, what: str) -> CodegenError:
    return CodegenError(
        where,
        f"{what} nests deeper than {MAX_LEVELS} levels of brackets, operators and "
        "attribute dots, more than the generator's recursive parser (libcst) can follow",
        HINT,
    )


# The characters and words that can make a level (see `_measure`); an open bracket
# counts BRACKET. A line's weight bounds the levels its tokens add, whatever it holds.
_ONE_LEVEL = re.compile(r"[-+*/%@|&^~<>=!:.'\"]|\b(?:" + "|".join(sorted(_KEYWORDS)) + r")\b")


def _line_weight(line: str) -> int:
    brackets = line.count("(") + line.count("[") + line.count("{")
    return BRACKET * brackets + len(_ONE_LEVEL.findall(line))


def _statement_starts(tree: ast.Module, lines: list[str]) -> list[tuple[int, int]]:
    """(line, levels of its blocks) of each line a logical line of statements starts on,
    the levels as ``_measure`` counts them on the whole text.

    A statement, handler, case or decorator first on its line starts one; a statement
    after a `;` or after a one-line compound header does not (the logical line it is
    part of may have begun lines above), so it stays in the span before it.
    """
    starts: dict[int, int] = {}
    stack: list[tuple[ast.AST, int]] = [(tree, -BLOCK)]
    while stack:
        node, levels = stack.pop()
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, name, None)
            if not isinstance(children, list):
                continue
            for child in children:
                if isinstance(child, ast.expr):
                    continue
                inner = levels if name == "handlers" else levels + BLOCK  # `except` at `try`'s
                if name == "orelse" and isinstance(child, ast.If):
                    if lines[child.lineno - 1].lstrip().startswith("elif"):
                        inner = levels + 1  # see `_measure`
                stack.append((child, inner))
                for decorator in getattr(child, "decorator_list", ()):
                    starts[decorator.lineno] = max(starts.get(decorator.lineno, 0), inner)
                if isinstance(child, ast.match_case):
                    line = child.pattern.lineno
                else:
                    line = child.lineno  # type: ignore[attr-defined]
                    text = lines[line - 1]
                    if child.col_offset != len(text) - len(text.lstrip(" \t\f")):  # type: ignore[attr-defined]
                        continue
                starts[line] = max(starts.get(line, 0), inner)
    return sorted(starts.items())


def _measure_statements(text: str, tree: ast.Module) -> None:
    """``_measure`` on each statement whose characters could reach the bound."""
    # The lines as Python counts them (`str.splitlines` also splits at a form feed).
    lines = [line + "\n" for line in text.split("\n")]
    weights = [0, *accumulate(_line_weight(line) for line in lines)]
    starts = _statement_starts(tree, lines)
    for i, (first, levels) in enumerate(starts):
        last = starts[i + 1][0] - 1 if i + 1 < len(starts) else len(lines)
        if levels + weights[last] - weights[first - 1] <= MAX_LEVELS:
            continue
        chunk = lines[first - 1 : last]
        stripped = [line.lstrip(" \t\f") for line in chunk]
        shift = [len(a) - len(b) for a, b in zip(chunk, stripped, strict=True)]
        try:
            _measure("".join(stripped), levels, first, shift)
        except (tokenize.TokenError, SyntaxError):
            _measure(text, 0)  # not whole logical lines after all: measure everything
            return


def check_module(path: str, text: str, tree: ast.Module | None) -> None:
    """Raise ``CodegenError`` at the first place ``text`` nests deeper than MAX_LEVELS.

    ``tree`` is Python's tree of ``text``, or None where Python's parser gave up (it
    stops at depths far beyond the bound): then the whole text is tokenized.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # one newline character
    try:
        if tree is None:
            _measure(text, 0)
        else:
            _measure_statements(text, tree)
    except _Overflow as at:
        raise _error(Location(path, at.row, at.col), "this statement") from None
    except (tokenize.TokenError, SyntaxError):
        pass  # text Python cannot tokenize: libcst's parser reports it
    if tree is None:
        raise CodegenError(
            Location(path, 1, 1),
            "Python's parser gives up on this file: it nests too deeply",
            HINT,
        )


def check_annotation(text: str, where: Location) -> None:
    """A string annotation (parsed on its own) nests at most MAX_LEVELS deep."""
    try:
        _measure(f"({text})", 0)
    except _Overflow:
        raise _error(where, "the string annotation") from None
    except (tokenize.TokenError, SyntaxError):
        pass  # not an expression: the parse reports it
