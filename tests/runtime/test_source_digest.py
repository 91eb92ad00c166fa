"""The compile cache's digest covers every source a lowered kernel can execute: its own
package, and the packages its files import (a lazy import included), transitively; an
installed distribution by its version; the standard library and torch not at all."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from transformer_engine_ops.runtime import source_digest


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``kernels_pkg`` (a lowered kernel) imports ``helper_pkg`` inside a function;
    ``helper_pkg`` imports ``deeper_pkg`` and the standard library and torch."""
    for name, text in {
        "kernels_pkg/__init__.py": "",
        "kernels_pkg/kernel.py": "def kernel(x):\n    from helper_pkg.math import twice\n"
        "    return twice(x)\n",
        "helper_pkg/__init__.py": "",
        "helper_pkg/math.py": "import os, torch\nimport deeper_pkg\n\ndef twice(x):\n"
        "    return 2 * x\n",
        "deeper_pkg.py": "ONE = 1\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("kernels_pkg", "helper_pkg", "deeper_pkg"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_a_helper_package_the_kernel_imports_lazily_is_covered(packages):
    labels = [label for label, _ in source_digest.package_parts(["kernels_pkg"])]
    assert "helper_pkg/math.py" in labels and "deeper_pkg/deeper_pkg.py" in labels
    assert not any(label.startswith(("os", "torch")) for label in labels)
    before = source_digest.fingerprint(["kernels_pkg"])
    assert source_digest.fingerprint(["kernels_pkg"]) == before, "deterministic"
    (packages / "helper_pkg" / "math.py").write_text("def twice(x):\n    return x + x\n")
    edited = source_digest.fingerprint(["kernels_pkg"])
    assert edited != before
    (packages / "deeper_pkg.py").write_text("ONE = 1.0\n")  # no longer imported: not seen
    assert source_digest.fingerprint(["kernels_pkg"]) == edited


def test_a_two_level_import_is_followed(packages):
    before = source_digest.fingerprint(["kernels_pkg"])
    (packages / "deeper_pkg.py").write_text("ONE = 2\n")
    assert source_digest.fingerprint(["kernels_pkg"]) != before


def test_an_installed_distribution_counts_by_its_version(tmp_path, monkeypatch):
    (tmp_path / "uses_jinja.py").write_text("import jinja2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    parts = source_digest.package_parts(["uses_jinja"])
    labels = [label for label, _ in parts]
    assert f"Jinja2=={importlib.metadata.version('Jinja2')}" in labels
    assert not any(label.startswith("jinja2/") for label in labels)


def test_an_import_that_cannot_be_found_is_named_absent(tmp_path, monkeypatch):
    (tmp_path / "optional_user.py").write_text(
        "try:\n    import not_installed_xyz\nexcept ImportError:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert ("not_installed_xyz:absent", b"") in source_digest.package_parts(["optional_user"])


def test_import_statements_are_read_at_any_indentation_relative_ones_not():
    source = (
        "import a.b, c as d\nif x:\n    from e.f import g\nfrom . import h\n"
        "from .i import j\nx = 1  # import k\n"
    )
    assert source_digest.imported_packages(source) == {"a", "c", "e"}
