"""What a lowered kernel can execute, as one digest for the compile cache's key.

Inductor's and AOTAutograd's caches key on the graph Dynamo captured, where an op call
is a name: the code a decomposition traces in its place is not in their key. The digest
here covers that code: every ``.py`` file of the kernels' own packages, and of every
package those files import (statically: each ``import`` statement, wherever it sits, so
a lazy import inside a function counts), transitively. A package installed from a
distribution (under ``site-packages``) contributes its name and version instead of its
files (an upgrade changes the version); the standard library and torch contribute
nothing (the caches already key on the Python and torch versions). A module imported
by a computed name (``importlib.import_module(name)``) is not seen; a kernel must not
do that.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = ["fingerprint", "imported_packages", "package_parts"]

# Top-level names whose version the compile caches already key on.
_KEYED_BY_TORCH = frozenset(("torch", "functorch", "torchgen"))
_INSTALLED_DIRS = frozenset(("site-packages", "dist-packages"))


def _files(name: str) -> list[tuple[Path, Path]] | None:
    """(folder, file) of every ``.py`` file of the top-level package or module ``name``,
    or None where it cannot be found."""
    module = sys.modules.get(name)
    folders: list[str] = list(getattr(module, "__path__", None) or ())
    single = getattr(module, "__file__", None) if module is not None and not folders else None
    if module is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return None
        folders = list(spec.submodule_search_locations or ())
        single = spec.origin if not folders else None
    files = [(Path(f), p) for f in folders for p in sorted(Path(f).rglob("*.py"))]
    if single and single.endswith(".py"):
        files.append((Path(single).parent, Path(single)))
    return files


# An import statement at the start of a line, at any indentation (a lazy import inside a
# function counts): ``import a.b, c as d`` or ``from a.b import x`` (not ``from .x``).
_IMPORT = re.compile(
    r"^[ \t]*(?:import[ \t]+([\w., \t]+)|from[ \t]+(\w+)[\w.]*[ \t]+import\b)", re.M
)


def imported_packages(source: str) -> set[str]:
    """The top-level names of every absolute import statement in ``source``. Read by
    pattern, not parsed (parsing every file cost ~0.3 s a compile): a line of a
    docstring that reads like an import adds a name, which only makes the digest cover
    more."""
    names: set[str] = set()
    for plain, origin in _IMPORT.findall(source):
        if origin:
            names.add(origin)
        for item in plain.split(","):
            name = item.strip().split(" ", 1)[0].split(".", 1)[0]
            if name.isidentifier():
                names.add(name)
    return names


def _installed_version(name: str, files: list[tuple[Path, Path]]) -> str | None:
    if not any(_INSTALLED_DIRS & set(path.parts) for _, path in files[:1]):
        return None
    for dist in importlib.metadata.packages_distributions().get(name, ()):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def package_parts(roots: Iterable[str]) -> list[tuple[str, bytes]]:
    """(label, content) of everything the digest covers, in a fixed order: each source
    file of ``roots`` and of the local packages they import (transitively) as
    ``name/relative/path.py`` with its bytes, each installed package as
    ``name==version``, each import that cannot be found as ``name:absent``."""
    parts: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    queue = sorted(set(roots))
    roots = frozenset(queue)
    while queue:
        name = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if name not in roots and (name in sys.stdlib_module_names or name in _KEYED_BY_TORCH):
            continue
        files = _files(name)
        if files is None:
            parts.append((f"{name}:absent", b""))
            continue
        version = None if name in roots else _installed_version(name, files)
        if version is not None:
            parts.append((version, b""))
            continue
        imports: set[str] = set()
        for folder, path in files:
            source = path.read_bytes()
            parts.append((f"{name}/{path.relative_to(folder).as_posix()}", source))
            imports |= imported_packages(source.decode("utf-8", errors="replace"))
        queue += sorted(imports - seen)
    return parts


def fingerprint(roots: Iterable[str]) -> str:
    """A 16-hex-digit digest of :func:`package_parts`."""
    digest = hashlib.sha256()
    for label, content in package_parts(roots):
        digest.update(label.encode() + b"\0")
        digest.update(content)
    return digest.hexdigest()[:16]
