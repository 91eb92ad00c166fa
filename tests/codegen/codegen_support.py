"""Helpers shared by the generator's tests (imported by name: `conftest` is not unique).

The generator is run two ways: in-process through ``codegen.cli.main`` (fast, output
captured with ``capsys``) and as ``python -m codegen`` in a subprocess where exit codes,
environment (``PYTHONHASHSEED``) or blocked imports matter. Tests that write run on a
temporary copy of the repository's essentials (pyproject.toml, the op module, generated/),
never on the real tree.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # `codegen` is a build-time tool, not an installed package
    sys.path.insert(0, str(REPO_ROOT))

from codegen.cli import main  # noqa: E402

LINEAR = "transformer_engine_ops/ops/linear.py"
EVERY_KIND = "tests/codegen/fixtures/every_kind.py"
CORPUS = "tests/codegen/corpus"
OUTPUT_DIR = "transformer_engine_ops/generated"
# Every configured op module lives here (and may import another: the folder is copied).
OPS_DIR = "transformer_engine_ops/ops"
# The export list (`exports.source`) and the files the generator writes from it.
EXPORTS_SOURCE = "transformer_engine_ops/__init__.py"
EXPORT_FILES = (
    EXPORTS_SOURCE,
    "transformer_engine_ops/_exports.py",
    "transformer_engine_ops/modules/__init__.py",
)


@dataclass(frozen=True)
class CliResult:
    rc: int
    out: str
    err: str


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` by relative path: a file's sha256, ``dir``, or a symlink's
    target (never followed); ``{}`` if it is missing. ``__pycache__`` folders are skipped."""
    if not folder.exists():
        return {}
    entries: dict[str, str] = {}
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in (*dirs, *sorted(files)):
            path = Path(top, name)
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                entries[rel] = f"symlink -> {os.readlink(path)}"
            elif path.is_dir():
                entries[rel] = "dir"
            else:
                entries[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return dict(sorted(entries.items()))


def copy_essentials(dst: Path, extra: tuple[str, ...] = ()) -> Path:
    """Copy pyproject.toml, the op modules, generated/, the export files and ``extra``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    dst.mkdir(parents=True, exist_ok=True)
    for rel in ("pyproject.toml", OPS_DIR, OUTPUT_DIR, *EXPORT_FILES, *extra):
        src, target = REPO_ROOT / rel, dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, ignore=ignore)
        else:
            shutil.copy2(src, target)
    return dst


def run_main(*argv: str) -> CliResult:
    """``codegen.cli.main`` in-process, capturing its output without pytest fixtures."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return CliResult(rc, out.getvalue(), err.getvalue())


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def run_codegen(
    root: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m codegen --root ROOT ARGS...`` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "codegen", "--root", str(root), *args],
        cwd=root,
        capture_output=True,
        text=True,
        env=env or subprocess_env(),
        timeout=120,
    )


def add_field(root: Path, after: str, line: str, rel: str = LINEAR) -> None:
    """Insert a bundle field line right after the first line equal to ``after``."""
    path = root / rel
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    index = next(i for i, text in enumerate(lines) if text.strip() == after)
    lines.insert(index + 1, f"    {line}\n")
    path.write_text("".join(lines), encoding="utf-8")
