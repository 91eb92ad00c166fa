"""Generate every fixture op module (tests/ops/fixtures/*.py) and import the result.

The generator writes the fixtures' modules into a temporary folder, once per test
session; importing them registers their custom ops and runs their calling side, so
the generated glue, the boundary helpers and the registration all execute for ops
other than Linear. ``tests/ops/test_fixture_kinds.py`` checks that these fixtures,
together, use every field kind the generator knows.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # codegen is a build-time tool; the fixtures a namespace package
    sys.path.insert(0, str(REPO_ROOT))

from codegen.config import load_config  # noqa: E402
from codegen.model import SourceModule  # noqa: E402
from codegen.pipeline import Generated, generate  # noqa: E402

FIXTURE_DIR = "tests/ops/fixtures"
# Every fixture op module; each has its tests in tests/ops/test_<stem>.py.
FIXTURE_SOURCES = (f"{FIXTURE_DIR}/every_kind_op.py", f"{FIXTURE_DIR}/grouped_op.py")
_OUTPUT_DIR = "fixture_ops_out"

_STATE: dict[str, object] = {}


def generated() -> Generated:
    """The generator's result for all fixture sources (read, rendered, formatted)."""
    if "generated" not in _STATE:
        config = dataclasses.replace(load_config(REPO_ROOT), output_dir=_OUTPUT_DIR)
        _STATE["generated"] = generate(config, list(FIXTURE_SOURCES))
    return _STATE["generated"]  # type: ignore[return-value]


def source_modules() -> tuple[SourceModule, ...]:
    return generated().modules


def load(stem: str) -> ModuleType:
    """The generated module of fixture ``stem``, imported (its ops registered) once."""
    name = f"fixture_ops_generated_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    if "dir" not in _STATE:
        _STATE["dir"] = tempfile.TemporaryDirectory(prefix="fixture_ops_")
    folder = Path(_STATE["dir"].name)  # type: ignore[attr-defined]
    path = folder / f"{name}.py"
    path.write_text(generated().files[f"{_OUTPUT_DIR}/{stem}.py"], encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dynamo looks traced functions up by module
    spec.loader.exec_module(module)
    return module
