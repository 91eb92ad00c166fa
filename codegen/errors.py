"""Positioned generator errors: ``path:line:col: error: what; hint: how to fix``."""

from __future__ import annotations

from collections.abc import Callable


class Location:
    """A position in a source file; ``line`` and ``column`` are 1-based.

    A location may be *deferred*: built from a callable that computes ``(line, column)``
    on first use. The reader positions every entity, but positions are needed only when
    an error or ``explain`` prints one, and computing them for a whole module (libcst's
    PositionProvider renders it) is most of a generator run's time.
    """

    __slots__ = ("_pos", "_resolve", "path")

    def __init__(
        self,
        path: str,
        line: int = 0,
        column: int = 0,
        resolve: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.path = path
        self._pos = None if resolve is not None else (line, column)
        self._resolve = resolve

    def _position(self) -> tuple[int, int]:
        if self._pos is None:
            assert self._resolve is not None
            self._pos, self._resolve = self._resolve(), None
        return self._pos

    @property
    def line(self) -> int:
        return self._position()[0]

    @property
    def column(self) -> int:
        return self._position()[1]

    def _key(self) -> tuple[str, int, int]:
        return (self.path, *self._position())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Location({self})"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


class CodegenError(Exception):
    """A problem in a bundle source, reported with its position and a fix."""

    def __init__(self, location: Location, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.location = location
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.location}: error: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class ConfigError(Exception):
    """A problem in the generator's configuration (pyproject.toml)."""


class OutputError(ConfigError):
    """The output folder cannot be written safely (a symlink, a hand-written file in the way)."""


class PartialWriteError(Exception):
    """A write failed after some generated files were replaced (named in the message)."""
