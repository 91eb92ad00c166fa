"""Every op lowered by default is checked bitwise against eager, found by itself.

The check (``runtime/lowering_check.py``) runs on every generated module whose op is
declared ``lowers=True``, on the examples its op module declares, for every recipe:
a new op module is covered without a test of its own. Two fixture ops prove it can
fail: the same math with its reductions unmarked (reported) and marked (passes).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import tempfile
import typing
from pathlib import Path
from types import ModuleType

import pytest
import torch

from transformer_engine_ops.runtime import lowering, lowering_check

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = (
    "tests/runtime/fixtures/unmarked_reduction_op.py",
    "tests/runtime/fixtures/marked_reduction_op.py",
)


_LOADED: dict[str, ModuleType] = {}


def _fixture(stem: str) -> str:
    """The generated module of fixture ``stem`` (written by the generator into a
    temporary folder), imported once; its name."""
    if stem not in _LOADED:
        if str(REPO_ROOT) not in sys.path:
            sys.path.insert(0, str(REPO_ROOT))
        from codegen.config import load_config
        from codegen.pipeline import generate

        config = dataclasses.replace(load_config(REPO_ROOT), output_dir="lowering_check_out")
        result = generate(config, list(FIXTURES))
        folder = Path(tempfile.mkdtemp(prefix="lowering_check_"))
        name = f"lowering_check_generated_{stem}"
        path = folder / f"{name}.py"
        path.write_text(result.files[f"lowering_check_out/{stem}.py"], encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dynamo looks traced functions up by module
        spec.loader.exec_module(module)
        _LOADED[stem] = module
    return _LOADED[stem].__name__


@pytest.mark.slow
def test_an_unmarked_reduction_is_reported():
    """Defined after Inductor has compiled in this process (where it is not yet): an op
    module imported late is lowered like the others (Inductor's cached table too)."""
    torch.compile(lambda t: t + 1, backend="inductor")(torch.ones(2))
    problems = lowering_check.check(_fixture("unmarked_reduction_op"))
    assert problems, "the unmarked sums were not caught"
    assert all("not eager's bits" in p and "(no recipe)" in p for p in problems), problems
    assert any("output 0" in p for p in problems), "the forward's row sum"
    assert any("gradient of example 0's w" in p for p in problems), "the backward's column sum"


@pytest.mark.slow
def test_the_same_reductions_marked_pass():
    assert lowering_check.check(_fixture("marked_reduction_op")) == []


def test_the_fixtures_are_lowered_by_default_like_any_op():
    assert {_fixture("unmarked_reduction_op"), _fixture("marked_reduction_op")} <= set(
        lowering.lowered_modules()
    )


def test_an_op_without_examples_is_reported(monkeypatch):
    module = sys.modules[_fixture("marked_reduction_op")]
    bundle = typing.get_type_hints(module._GLUE.unflatten)["return"]
    monkeypatch.delitem(lowering._EXAMPLES, bundle)
    (problem,) = lowering_check.check(module.__name__)
    assert (
        "teops::marked_reduction_fwd" in problem and "@lowering.examples(MarkedFwdArgs)" in problem
    )


def test_examples_that_never_lower_are_reported(monkeypatch):
    """An example the lowering declines (here: every call kept as its node) checks
    nothing, so it is no pass."""
    module = sys.modules[_fixture("unmarked_reduction_op")]
    monkeypatch.setattr(lowering, "_autotuning_gemms", lambda: True)  # declines every call
    problems = lowering_check.check(module.__name__)
    assert len(problems) == 2 and all("no example call was lowered" in p for p in problems)
