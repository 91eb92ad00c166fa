"""Fixtures for the generator's tests; the helpers they use live in codegen_support."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from codegen_support import REPO_ROOT, CliResult, copy_essentials, run_main

from codegen.cli import main
from codegen.config import Config, load_config


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run ``codegen.cli.main(argv)`` in-process; returns exit code, stdout, stderr."""

    def run(*argv: str) -> CliResult:
        capsys.readouterr()
        rc = main(list(argv))
        out, err = capsys.readouterr()
        return CliResult(rc, out, err)

    return run


@pytest.fixture(scope="session")
def pristine_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repo essentials, regenerated once so generated/ matches its source."""
    root = copy_essentials(tmp_path_factory.mktemp("pristine"))
    result = run_main("--root", str(root))
    assert result.rc == 0, result.err
    return root


@pytest.fixture
def repo(tmp_path: Path, pristine_root: Path) -> Path:
    """A private, up-to-date copy of the repo essentials that a test may edit."""
    dst = tmp_path / "repo"
    shutil.copytree(pristine_root, dst)
    return dst


@pytest.fixture(scope="session")
def repo_config() -> Config:
    return load_config(REPO_ROOT)
