"""A throw-away git repository holding a small generator project, for ``codegen diff``.

The project is one boundary-only op module (``demo/scale.py``, namespace ``demo``) and
its configuration; tests commit it, edit the working tree, and review the edit. Git runs
with a fixed identity and dates and without the user's or the system's configuration,
so commits (and their ids) do not depend on the machine.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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


def git(root: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    result = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, env=env, check=True
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
