"""The pre-commit hooks of .pre-commit-hooks.yaml, and `make review`'s command, run as
pre-commit and make run them, on a throw-away project.

pre-commit runs a ``language: system`` hook with ``pass_filenames: false`` as
``shlex.split(entry) + args`` in the repository's root, with the environment's PATH,
when a staged file matches ``files``. The tests do exactly that: ``python`` on PATH is
this venv's, and PYTHONPATH names this checkout (the generator is not an installed
package; the hooks' comment says so).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # libcst depends on PyYAML, so the generator's environment has it
from codegen_support import REPO_ROOT, run_main
from review_support import GIT_ENV, OP_MODULE, OUTPUT_DIR, commit, edit, git, make_project

HOOKS = {h["id"]: h for h in yaml.safe_load((REPO_ROOT / ".pre-commit-hooks.yaml").read_text())}


def _environment() -> dict[str, str]:
    env = {**os.environ, **GIT_ENV}
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def run_hook(hook_id: str, root: Path) -> subprocess.CompletedProcess[str]:
    hook = HOOKS[hook_id]
    assert hook["language"] == "system" and hook["pass_filenames"] is False
    argv = [*shlex.split(hook["entry"]), *hook.get("args", [])]
    env = _environment()
    assert shutil.which(argv[0], path=env["PATH"]) is not None
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    """The review project with its generated code committed, its upstream `origin/main`."""
    root = make_project(tmp_path / "project")
    assert run_main("--root", str(root)).rc == 0
    commit(root, "generated code")
    git(root, "update-ref", "refs/remotes/origin/main", "HEAD")
    git(root, "checkout", "-q", "-b", "feature")
    return root


@pytest.mark.parametrize("hook_id", sorted(HOOKS))
def test_each_hook_runs_when_an_op_module_its_output_or_the_configuration_changes(
    hook_id: str,
) -> None:
    files = re.compile(HOOKS[hook_id]["files"])
    for path in (OP_MODULE, f"{OUTPUT_DIR}/scale.py", "pyproject.toml", "templates/_schema.j2"):
        assert files.search(path), path
    assert not files.search("README.md")


def test_the_check_hook_fails_on_a_stale_checkout_and_passes_on_a_fresh_one(fresh: Path) -> None:
    assert run_hook("codegen-check", fresh).returncode == 0

    edit(fresh, "    factor: float\n    mode", "    factor: float\n    steps: int\n    mode")
    stale = run_hook("codegen-check", fresh)
    assert stale.returncode == 1
    assert "+++ b/demo/generated/SCHEMAS.md" in stale.stdout
    assert "+        steps=slot()," in stale.stdout
    assert "generated code is stale: run `make codegen`" in stale.stderr

    assert run_main("--root", str(fresh)).rc == 0
    assert run_hook("codegen-check", fresh).returncode == 0


def test_the_breaking_hook_passes_a_compatible_change_and_fails_a_breaking_one(
    fresh: Path,
) -> None:
    edit(fresh, 'Literal["fast", "exact"]', 'Literal["fast", "exact", "fused"]')
    compatible = run_hook("codegen-breaking", fresh)
    assert compatible.returncode == 0, compatible.stderr
    assert "FIELD_CHOICES_ADDED" in compatible.stdout

    edit(fresh, "    factor: float\n    mode", "    mode")
    breaking = run_hook("codegen-breaking", fresh)
    assert breaking.returncode == 1
    assert "FIELD_REMOVED ScaleFwdArgs.factor" in breaking.stdout
    assert breaking.stderr.startswith("codegen diff: breaking changes for keyword callers")


def _make_review_command(base: str) -> list[str]:
    """The `review` target's recipe with make's variables filled in (make is not run here:
    its venv stamp would reinstall the shared environment)."""
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^review: .*\n\t(.+)$", makefile, re.MULTILINE)
    assert recipe is not None
    line = recipe[1].replace("$(PY)", "python").replace("$(REVIEW_BASE)", base)
    return shlex.split(line.replace("$(REVIEW_ARGS)", ""))


def test_make_review_says_clearly_when_the_upstream_ref_is_missing(fresh: Path) -> None:
    assert re.search(r"^REVIEW_BASE \?= origin/main$", (REPO_ROOT / "Makefile").read_text(), re.M)
    git(fresh, "update-ref", "-d", "refs/remotes/origin/main")

    result = subprocess.run(
        _make_review_command("origin/main"),
        cwd=fresh,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: no ref `origin/main` to review against (fetch it, or name the upstream branch: "
        "`--merge-base BRANCH`, or `make review REVIEW_BASE=BRANCH`)"
    )
    assert "Traceback" not in result.stderr


def test_make_review_compares_with_the_merge_base(fresh: Path) -> None:
    edit(fresh, "    factor: float\n    mode", "    mode")

    result = subprocess.run(
        _make_review_command("main"),
        cwd=fresh,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "codegen diff: bundle changes against the merge base of HEAD and main"
    )
