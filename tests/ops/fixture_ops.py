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
from typing import Any

import torch
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # codegen is a build-time tool; the fixtures a namespace package
    sys.path.insert(0, str(REPO_ROOT))

from codegen.config import load_config  # noqa: E402
from codegen.model import SourceModule  # noqa: E402
from codegen.pipeline import Generated, generate  # noqa: E402
from transformer_engine_ops.quantization import (  # noqa: E402
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from transformer_engine_ops.quantization.quantizer import QuantizedData  # noqa: E402

FIXTURE_DIR = "tests/ops/fixtures"
# Every fixture op module; each has its tests in tests/ops/test_<stem>.py.
FIXTURE_SOURCES = (
    f"{FIXTURE_DIR}/every_kind_op.py",
    f"{FIXTURE_DIR}/grouped_op.py",
    f"{FIXTURE_DIR}/scale_op.py",
    f"{FIXTURE_DIR}/shadowing_op.py",
)
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


# --- helpers the fixture tests share --------------------------------------------------

# One reference quantizer per format (and a usage variant), for quantized bundle values.
QUANTIZERS = {
    "fp8": Float8CurrentScalingQuantizer(),
    "fp8-rowwise": Float8CurrentScalingQuantizer(columnwise_usage=False),
    "mxfp8": MXFP8Quantizer(),
    "nvfp4": NVFP4Quantizer(),
    "fp8-block": Float8BlockQuantizer(block_scaling_dim=1),
}


@st.composite
def tensor_or_quantized(draw: Any, shape: tuple[int, int], none: bool = True) -> Any:
    """None, a plain tensor, or a quantized storage or wrapper of some format."""
    what = draw(st.sampled_from(["none", "tensor", "storage", "wrapper"][0 if none else 1 :]))
    if what == "none":
        return None
    t = torch.randn(shape)
    if what == "tensor":
        return t
    q = QUANTIZERS[draw(st.sampled_from(sorted(QUANTIZERS)))]
    return q.with_internal(what == "storage").quantize(t)


def same(a: Any, b: Any) -> bool:
    """Equal bundle values: tensors the same object (a round trip moves no data),
    quantized values of one class, quantizer and dtype over the same buffers."""
    if isinstance(a, QuantizedData):
        return (
            type(a) is type(b)
            and a._quantizer == b._quantizer
            and a._dtype == b._dtype
            and tuple(a.shape) == tuple(b.shape)
            and a.inner_names() == b.inner_names()
            and all(x is y for x, y in zip(a.inner_tensors(), b.inner_tensors(), strict=True))
        )
    if isinstance(a, torch.Tensor):
        return a is b
    if isinstance(a, list | tuple):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    return type(a) is type(b) and a == b


def same_bundle(a: Any, b: Any) -> None:
    """Assert two bundles hold the same values, field by field (naming the field)."""
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        assert same(getattr(a, f.name), getattr(b, f.name)), f.name
