"""Positioned generator errors: ``path:line:col: error: what; hint: how to fix``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """A position in a source file; ``line`` and ``column`` are 1-based."""

    path: str
    line: int
    column: int

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
