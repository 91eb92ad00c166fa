"""The package's public names follow `_EXPORTS`: `__all__`, `dir()`, the lazy attributes,
the typing imports and `modules.__all__` list the same names and resolve to the same objects."""

from __future__ import annotations

import importlib
import subprocess
import sys

import transformer_engine_ops as te


def test_all_and_dir_follow_the_export_list() -> None:
    top = sorted(name for name in te._EXPORTS if "." not in name)
    assert te.__all__ == top
    assert set(te.__all__) <= set(dir(te))
    # "modules.L2Normalization": exported by the subpackage only, as TE has no te.L2Normalization
    assert "L2Normalization" not in te.__all__ and not hasattr(te, "modules.L2Normalization")


def test_each_name_resolves_to_the_object_its_module_defines() -> None:
    for name, module in te._EXPORTS.items():
        if "." in name:
            continue
        if module == ".":
            expected = importlib.import_module(f"transformer_engine_ops.{name}")
        else:
            expected = getattr(importlib.import_module(module, "transformer_engine_ops"), name)
        assert getattr(te, name) is expected, name


def test_typing_imports_and_modules_package_list_the_same_names() -> None:
    typing = importlib.import_module("transformer_engine_ops._exports")
    modules = importlib.import_module("transformer_engine_ops.modules")
    assert typing.__all__ == te.__all__
    for name in typing.__all__:
        assert getattr(typing, name) is getattr(te, name), name
    under = {n.rsplit(".", 1)[-1]: m for n, m in te._EXPORTS.items() if m.startswith(".modules.")}
    assert modules.__all__ == sorted(under)
    for name, module in under.items():
        defined = importlib.import_module(module, "transformer_engine_ops")
        assert getattr(modules, name) is getattr(defined, name), name


def test_importing_the_package_imports_no_module_until_a_name_is_used() -> None:
    code = (
        "import sys, transformer_engine_ops as te\n"
        "assert 'transformer_engine_ops.modules' not in sys.modules\n"
        "assert 'transformer_engine_ops._exports' not in sys.modules\n"
        "te.Linear\n"
        "assert 'transformer_engine_ops.modules.linear' in sys.modules\n"
        "assert 'Linear' in dir(te) and 'recipe' in dir(te)\n"
        "try:\n    te.NotAName\nexcept AttributeError as e:\n    print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "module 'transformer_engine_ops' has no attribute 'NotAName'" in result.stdout
