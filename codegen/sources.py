"""Which op modules a run reads: ``sources`` entries, patterns expanded, none missed.

An entry of ``sources`` is a path or a glob pattern relative to the source root
(``transformer_engine_ops/ops/*.py``). A pattern selects the matched modules that
declare an op (``reader.declaration_position``), so a helper beside them
(``ops/_fused.py``) is fine, and a pattern that selects none is an error. A module that
declares an op in the folder of a source but is matched by no entry is an error too: a
new op module no one listed would otherwise generate nothing, silently.
"""

from __future__ import annotations

from pathlib import Path

from . import safety
from .config import Config
from .errors import CodegenError, Location
from .reader import declaration_position

_GLOB = frozenset("*?[")


def is_pattern(entry: str) -> bool:
    return any(c in _GLOB for c in entry)


def select(config: Config, given: list[str] | None = None) -> list[str]:
    """The sorted source paths of a run: ``given`` (``--source``) or the configured ones;
    the configured set is also checked for op modules it misses (:func:`check_listed`)."""
    entries = list(given if given is not None else config.sources)
    root = config.reading.source_root or config.root
    selected: set[str] = set()
    for entry in entries:
        if not is_pattern(entry):
            selected.add(_normalize(config, entry))
            continue
        found = [rel for rel in _matches(config, root, entry) if _declares(config, root, rel)]
        if not found:
            raise CodegenError(
                Location(entry, 1, 1),
                "this pattern in `sources` matches no module that declares an op",
                "fix the pattern, relative to "
                + ("the project root" if root == config.root else f"source_root {root}"),
            )
        selected.update(_normalize(config, rel) for rel in found)
    paths = sorted(selected)
    if given is None:
        check_listed(config, root, entries, paths)
    return paths


def check_listed(config: Config, root: Path, entries: list[str], paths: list[str]) -> None:
    """Refuse an op module beside a source (in its folder, or a pattern's) that no entry
    selects, at the position of its declaration."""
    folders = {(root / rel).parent for rel in paths}
    for entry in entries:
        if is_pattern(entry):
            literal = [p for p in Path(entry).parent.parts if not is_pattern(p)]
            folders.add(root.joinpath(*literal))
    listed = set(paths)
    for folder in sorted(folders):
        for path in sorted(folder.glob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in listed or _skipped(config, path):
                continue
            position = _declares(config, root, rel)
            if position is not None:
                raise CodegenError(
                    Location(rel, *position),
                    "this module declares an op, but no entry of `sources` selects it, so "
                    "nothing would be generated for it",
                    "add it to `sources` in [tool.transformer_engine_ops.codegen], or list "
                    f'its folder as a pattern: "{Path(rel).parent.as_posix()}/*.py"',
                )


def _normalize(config: Config, entry: str) -> str:
    return safety.normalize_source(
        config.root, entry, config.output_dir, config.reading.source_root
    )


def _skipped(config: Config, path: Path) -> bool:
    """Never an op module: a package ``__init__``, a hidden file, generated output."""
    out = (config.root / config.output_dir).resolve()
    return (
        path.name == "__init__.py"
        or path.name.startswith(".")
        or not path.is_file()
        or path.resolve().is_relative_to(out)
    )


def _matches(config: Config, root: Path, pattern: str) -> list[str]:
    if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
        raise CodegenError(
            Location(pattern, 1, 1),
            "a pattern in `sources` must stay inside the project root",
            "write it relative to the root, without `..`",
        )
    return sorted(
        p.relative_to(root).as_posix() for p in root.glob(pattern) if not _skipped(config, p)
    )


def _declares(config: Config, root: Path, rel: str) -> tuple[int, int] | None:
    """The declaration's position; an unreadable file counts as an op module (the full
    read reports why)."""
    try:
        text = (root / rel).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return (1, 1)
    return declaration_position(rel, text, config, root)
