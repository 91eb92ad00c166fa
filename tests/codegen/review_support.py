"""A throw-away git repository holding a small generator project, for ``codegen diff``.

The project is one boundary-only op module (``demo/scale.py``, namespace ``demo``) and
its configuration; tests commit it, edit the working tree, and review the edit. Git runs
with a fixed identity and dates and without the user's or the system's configuration,
so commits (and their ids) do not depend on the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from codegen_support import REPO_ROOT

OP_MODULE = "demo/scale.py"
OUTPUT_DIR = "demo/generated"

PYPROJECT = """\
[tool.transformer_engine_ops.codegen]
namespace = "demo"
sources = ["demo/scale.py"]
output_dir = "demo/generated"
meta_type = "str"

[tool.transformer_engine_ops.codegen.kinds]
quantizer = ["demo.types.Quantizer"]
value = ["demo.types.Recipe"]
unsupported = ["typing.Any"]
"""

SCALE = '''\
"""A small op to review: its bundles change from test to test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch

from demo.types import Recipe
from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class ScaleFwdArgs:
    """What the forward reads."""

    inp: torch.Tensor
    factor: float
    mode: Literal["fast", "exact"]
    recipe: Optional[Recipe]
    bias: Optional[torch.Tensor] = None


@dataclass
class ScaleBwdArgs:
    """What the backward reads."""

    grad_outputs: list[torch.Tensor]
    factor: float


SCALE = OpDeclaration(
    name="scale", forward=ScaleFwdArgs, backward=ScaleBwdArgs, grad_fields=("inp",)
)
'''

TYPES = '''\
"""Types the op module names; the configuration says what kind each is."""


class Quantizer:
    pass


class Recipe:
    pass
'''

GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Review Test",
    "GIT_AUTHOR_EMAIL": "review@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "Review Test",
    "GIT_COMMITTER_EMAIL": "review@example.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


def git(root: Path, *args: str, input_text: str | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    result = subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        input=input_text,
    )
    return result.stdout.strip()


def make_project(root: Path, repository: Path | None = None) -> Path:
    """Write the project at ``root`` and commit it on branch ``main`` of a new repository
    at ``repository`` (default: ``root`` itself; else a folder above it)."""
    repository = repository or root
    root.mkdir(parents=True, exist_ok=True)
    (root / "demo").mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT, encoding="utf-8")
    (root / OP_MODULE).write_text(SCALE, encoding="utf-8")
    (root / "demo/types.py").write_text(TYPES, encoding="utf-8")
    (root / "demo/__init__.py").write_text("", encoding="utf-8")
    git(repository, "init", "-q", "-b", "main")
    commit(repository, "the scale op")
    return root


def commit(root: Path, message: str) -> str:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)
    return git(root, "rev-parse", "HEAD")


def edit(root: Path, old: str, new: str, rel: str = OP_MODULE) -> None:
    """Replace the one occurrence of ``old`` in ``rel``."""
    path = root / rel
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {rel}"
    path.write_text(text.replace(old, new), encoding="utf-8")


# A hostile revision must be refused or reported within seconds: a run that takes longer
# fails its test (a hang would otherwise stall the suite).
HOSTILE_TIMEOUT_S = 20


def add_generator(root: Path) -> str:
    """Copy this repository's generator (codegen/, templates/) into the project and commit
    it, so the reviewed repository holds the templates of the generator that runs (as this
    repository does) when :func:`run_diff` runs the project's copy."""
    for folder in ("codegen", "templates"):
        shutil.copytree(
            REPO_ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    return commit(root, "the generator itself")


def run_diff(
    root: Path,
    *argv: str,
    tmpdir: Path,
    own_generator: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m codegen --root ROOT diff ARGV`` in a subprocess, from ``root``, with
    TMPDIR at ``tmpdir`` (where the revision's temporary copy goes); a run that outlives
    HOSTILE_TIMEOUT_S fails the test. ``own_generator``: run the project's copy of the
    generator (:func:`add_generator`) instead of this repository's."""
    generator = root if own_generator else REPO_ROOT
    full_env = {
        **os.environ,
        **GIT_ENV,
        "PYTHONPATH": str(generator),
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": str(tmpdir),
        **(env or {}),
    }
    tmpdir.mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.run(
            [sys.executable, "-m", "codegen", "--root", str(root), "diff", *argv],
            cwd=root,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=HOSTILE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"codegen diff {' '.join(argv)} did not end within {HOSTILE_TIMEOUT_S} s"
        ) from None
