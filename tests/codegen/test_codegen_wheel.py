"""The wheel ships the generated glue inside the package and no build-time tools."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from codegen_support import REPO_ROOT

# What a source checkout holds that the build reads (codegen/ and templates/ included,
# to prove they are left out). Built from a copy: an in-tree build writes build/.
BUILD_INPUTS = ("pyproject.toml", "transformer_engine_ops", "codegen", "templates")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("wheel-src")
    for rel in BUILD_INPUTS:
        if (REPO_ROOT / rel).is_dir():
            shutil.copytree(
                REPO_ROOT / rel, src / rel, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(REPO_ROOT / rel, src / rel)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["--disable-pip-version-check", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("transformer_engine_ops-*.whl")
    return built


@pytest.mark.slow
def test_wheel_holds_generated_code_under_the_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "transformer_engine_ops/generated/linear.py" in names
    assert "transformer_engine_ops/generated/__init__.py" in names
    assert "transformer_engine_ops/generated/SCHEMAS.md" in names
    top_level = {name.split("/")[0] for name in names}
    for tool in ("generated", "codegen", "templates", "tests"):
        assert tool not in top_level, sorted(top_level)


@pytest.mark.slow
def test_installed_wheel_imports_generated_code(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q"]
        + ["--disable-pip-version-check", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # -S: no site processing, so the editable install's finder (a .pth hook) is not
    # loaded; torch's own folder goes on PYTHONPATH explicitly, after the wheel's.
    torch_site = str(Path(torch.__file__).resolve().parent.parent)
    code = (
        "import transformer_engine_ops, transformer_engine_ops.generated.linear as g; "
        "print(transformer_engine_ops.__file__); print(g.__file__); print(g.FORWARD_OP)"
    )
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    result = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{target}:{torch_site}", "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    package_file, generated_file, op = result.stdout.split()
    assert Path(package_file).is_relative_to(target)
    assert Path(generated_file) == target / "transformer_engine_ops/generated/linear.py"
    assert op == "teops::linear_fwd"
