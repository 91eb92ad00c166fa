"""The kind records at run time: a generated module using every kind is imported and its
flatten/unflatten round-trip every field; typed schema types round-trip through torch;
strings and names from a bundle reach generated code only as escaped literals or aliases."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from codegen_support import EVERY_KIND, REPO_ROOT

from codegen.config import Config
from codegen.model import Kind, SchemaType
from codegen.pipeline import generate
from codegen.reader import read_source

GOLDEN_MODULE = REPO_ROOT / "tests/codegen/golden/every_kind.py"


# --- the typed schema-type model ----------------------------------------------------

SCHEMA_TYPES = [
    SchemaType("Tensor"),
    SchemaType("Tensor", optional=True),
    SchemaType("Tensor", list=True),
    SchemaType("Tensor", optional=True, list=True, element_optional=True),
    SchemaType("SymInt", list=True, size=2),
    SchemaType("SymInt", optional=True, list=True, size=3),
    SchemaType("SymInt", optional=True, list=True),
    SchemaType("str", list=True, element_optional=True),
    SchemaType("ScalarType", optional=True),
    SchemaType("bool"),
]


@pytest.mark.parametrize("schema_type", SCHEMA_TYPES, ids=str)
def test_schema_type_text_round_trips_through_torch_parse_schema(schema_type: SchemaType) -> None:
    text = f"teops::probe({schema_type} x) -> Tensor"
    assert str(torch._C.parse_schema(text)) == text
    assert SchemaType.parse(str(schema_type)) == schema_type


def test_schema_type_rejects_a_size_without_a_list() -> None:
    with pytest.raises(ValueError, match="fixed size needs a list"):
        SchemaType("SymInt", size=2)


# --- a generated module that uses every kind, at run time ----------------------------


def _import_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def every_kind() -> ModuleType:
    return _import_file(GOLDEN_MODULE, "_every_kind_generated")


@pytest.fixture(scope="module")
def fixture_module() -> ModuleType:
    return importlib.import_module("tests.codegen.fixtures.every_kind")


def _fp8_quantizer(internal: bool):
    from transformer_engine_ops.quantization.float8 import Float8CurrentScalingQuantizer

    return Float8CurrentScalingQuantizer(internal=internal)


def _forward_args(fx: ModuleType):
    from transformer_engine_ops.runtime.values import GemmConfig

    q = _fp8_quantizer(internal=True)
    x = torch.randn(4, 8)
    return fx.EveryKindFwdArgs(
        x=x,
        maybe_x=None,
        aliased=x,
        forward_ref=x,
        pipe_tensor=None,
        xs=[x, x + 1],
        w=x,
        maybe_w=q.quantize(x),
        flag=True,
        maybe_flag=None,
        count=3,
        maybe_count=None,
        scale=0.5,
        maybe_scale=2.0,
        label="l",
        maybe_label=None,
        dtype=torch.bfloat16,
        maybe_dtype=None,
        device=torch.device("cpu"),
        maybe_device=None,
        shape=torch.Size([4, 8]),
        dims=(1, 2),
        alias_shape=(3,),
        maybe_shape=None,
        color=fx.Color.BLUE,
        maybe_color=None,
        mode="exact",
        rounding="stochastic",
        quantizer=q,
        maybe_quantizer=None,
        group=None,
        tp_group=None,
        gemm=GemmConfig(),
        maybe_gemm=None,
        anything=None,
        hook=None,
        window=(2, 5),
        maybe_window=None,
        splits=[1, 2, 3],
        maybe_splits=[],
        weights=[x, q.quantize(x), None, _fp8_quantizer(internal=False).quantize(x)],
        maybe_weights=None,
        quantizers=[q, None],
        maybe_quantizers=None,
        generator=None,
        extra=None,
        type=7,  # named like the builtin the checks call: they read that as `_type`
    )


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and type(a) is torch.Tensor:
        return type(b) is torch.Tensor and torch.equal(a, b)
    if hasattr(a, "dequantize") and hasattr(a, "_quantizer"):
        return (
            type(a) is type(b)
            and a._quantizer == b._quantizer  # type: ignore[attr-defined]
            and torch.equal(a.dequantize(), b.dequantize())  # type: ignore[attr-defined]
        )
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))  # type: ignore[arg-type]
    return type(a) is type(b) and a == b


def test_every_kind_module_imports_and_registers_its_ops(every_kind: ModuleType) -> None:
    assert every_kind.every_kind_fwd is not None
    assert every_kind.every_kind_bwd is not None


def test_every_kind_forward_bundle_round_trips_field_by_field(
    every_kind: ModuleType, fixture_module: ModuleType
) -> None:
    args = _forward_args(fixture_module)
    slots = every_kind.flatten_every_kind_fwd_args(args)
    assert len(slots) == len(every_kind.FORWARD_SLOTS)
    back = every_kind.unflatten_every_kind_fwd_args(*slots)
    for field in dataclasses.fields(args):
        ours, theirs = getattr(args, field.name), getattr(back, field.name)
        if field.name in ("dims", "alias_shape"):
            assert back.dims == torch.Size(args.dims) if field.name == "dims" else True
            continue
        assert _same(ours, theirs), field.name
    assert type(back.window) is tuple and back.window == (2, 5)
    assert type(back.splits) is list and back.splits == [1, 2, 3]


def test_every_kind_fake_view_describes_tensor_lists_with_quantized_and_none_elements(
    every_kind: ModuleType, fixture_module: ModuleType
) -> None:
    args = _forward_args(fixture_module)
    specs = every_kind.spec_every_kind_fwd_args(*every_kind.flatten_every_kind_fwd_args(args))
    kinds = [None if s is None else s.is_quantized for s in specs.weights]
    assert kinds == [False, True, None, True]


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("flag", 1, "EveryKindFwdArgs.flag: expected bool, got int"),
        ("maybe_flag", 0, "EveryKindFwdArgs.maybe_flag: expected bool or None, got int"),
        ("quantizer", None, "EveryKindFwdArgs.quantizer: expected Quantizer, got NoneType"),
        ("maybe_quantizer", "q", "EveryKindFwdArgs.maybe_quantizer: expected Quantizer, got str"),
        ("gemm", 1.0, "EveryKindFwdArgs.gemm: expected GemmConfig, got float"),
        # tensor-or-quantized and Literal fields: the common values pass inline, the
        # rest reaches the runtime's check, which names the field
        ("w", None, "EveryKindFwdArgs.w: expected Tensor or a quantized storage, got NoneType"),
        ("maybe_w", "w", "EveryKindFwdArgs.maybe_w: expected Tensor or a quantized storage"),
        ("mode", "slow", "EveryKindFwdArgs.mode: expected one of 'fast', 'exact', got 'slow'"),
        ("mode", 1, "EveryKindFwdArgs.mode: expected one of 'fast', 'exact', got int"),
        ("rounding", b"nearest", "EveryKindFwdArgs.rounding: expected one of 'nearest'"),
        ("maybe_color", "RED", "EveryKindFwdArgs.maybe_color: expected Color, got str"),
        ("window", (1, 2, 3), "EveryKindFwdArgs.window: expected a tuple of 2 ints"),
        ("window", (1, True), "EveryKindFwdArgs.window: expected a tuple of 2 ints"),
        ("splits", [1.5], "EveryKindFwdArgs.splits: expected a list of ints"),
        ("type", 1.5, "EveryKindFwdArgs.type: expected int or SymInt, got float"),
        ("quantizers", [1], "EveryKindFwdArgs.quantizers: expected a list of Quantizer"),
        ("weights", [1], r"EveryKindFwdArgs.weights\[0\]: expected Tensor"),
        ("generator", torch.Generator(), "EveryKindFwdArgs.generator: this field cannot"),
        ("extra", {"a": 1}, "EveryKindFwdArgs.extra: this field cannot"),
    ],
)
def test_flatten_names_the_field_of_a_wrong_value(
    every_kind: ModuleType, fixture_module: ModuleType, field: str, value: object, message: str
) -> None:
    args = dataclasses.replace(_forward_args(fixture_module), **{field: value})
    # (a str outside a Literal's choices is a ValueError, any other wrong value a TypeError)
    with pytest.raises(
        ValueError if isinstance(value, str) and field == "mode" else TypeError, match=message
    ):
        every_kind.flatten_every_kind_fwd_args(args)


def test_the_generator_reads_the_text_the_codec_caches() -> None:
    from codegen.kinds import CODE_ATTR
    from transformer_engine_ops.runtime import codec

    assert CODE_ATTR == codec.CODE_ATTR


def test_the_generator_writes_the_runtime_descriptions_of_a_tensor_and_none() -> None:
    from codegen.kinds import NONE_META_CODE, TENSOR_META_CODE
    from transformer_engine_ops.runtime import boundary

    assert (TENSOR_META_CODE, NONE_META_CODE) == (boundary._TENSOR_CODE, boundary._NONE_CODE)
    assert boundary.tensor_or_quantized(torch.zeros(1), "X.x")[2] == TENSOR_META_CODE
    assert boundary.optional_tensor_or_quantized(None, "X.x")[2] == NONE_META_CODE


def test_a_tensor_list_field_may_receive_gradients(repo_config: Config) -> None:
    text = (REPO_ROOT / EVERY_KIND).read_text(encoding="utf-8")
    (op,) = read_source(EVERY_KIND, text, repo_config).ops
    assert "xs" in op.grad_fields
    assert op.forward.field("xs").type.kind is Kind.TENSOR_LIST  # type: ignore[union-attr]


# --- strings and names from a bundle reach generated code safely -----------------------

_HOSTILE_SOURCE = """\
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import List, Literal

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


class slot(enum.Enum):
    A = 1


@dataclass
class torch_args:
    inp: torch.Tensor
    choice: Literal[{choices}]
    which: slot


@dataclass
class Bwd:
    grad_outputs: List[torch.Tensor]


def _b(args):
    raise NotImplementedError


def Any(args):
    raise NotImplementedError


def fwd_spec(args):
    raise NotImplementedError


def bwd_spec(args):
    raise NotImplementedError


def setup(args, outputs, saved):
    raise NotImplementedError


OP = OpDeclaration(
    name="{name}",
    forward=torch_args,
    backward=Bwd,
    grad_fields=("inp",),
    forward_impl=_b,
    backward_impl=Any,
    forward_spec=fwd_spec,
    backward_spec=bwd_spec,
    setup_context=setup,
)
"""

# (source spelling of the Literal choices, the strings they mean)
_HOSTILE_LITERALS = {
    "injection": (
        """'a", __import__("os").system("touch M"), "b'""",
        'a", __import__("os").system("touch M"), "b',
    ),
    "backslash": ("'a\\\\b'", "a\\b"),
    "newline": ("'x\\ny', 'quote\\'s'", "x\ny"),
}


@pytest.mark.parametrize("case", list(_HOSTILE_LITERALS))
def test_literal_strings_and_shadowing_names_generate_inert_working_code(
    case: str, repo_config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spelling, meant = _HOSTILE_LITERALS[case]
    package = f"hostile_{case}"
    source = f"{package}/ops.py"
    (tmp_path / package).mkdir()
    (tmp_path / source).write_text(
        _HOSTILE_SOURCE.format(choices=spelling, name=f"hostile_{case}"), encoding="utf-8"
    )
    config = dataclasses.replace(
        repo_config,
        root=tmp_path,
        sources=(source,),
        output_dir=f"{package}/generated",
        exports=None,
    )
    files = generate(config, [source]).files
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    generated = importlib.import_module(f"{package}.generated.ops")
    ops = importlib.import_module(f"{package}.ops")
    assert not (tmp_path / "M").exists(), "a Literal value ran as code"

    args = ops.torch_args(inp=torch.ones(2), choice=meant, which=ops.slot.A)
    slots = generated.flatten_torch_args(args)
    assert slots[1] == meant
    back = generated.unflatten_torch_args(*slots)
    assert back.choice == meant and back.which is ops.slot.A
    for near_miss in (meant + "x", meant[:-1], "a"):
        bad = dataclasses.replace(args, choice=near_miss)
        with pytest.raises(ValueError, match="torch_args.choice: expected one of"):
            generated.flatten_torch_args(bad)
    assert not (tmp_path / "M").exists(), "a Literal value ran as code"
    # The user's `_b`/`Any` impls and `slot` enum were imported under aliases; the
    # generated module's own `_b` is still the boundary runtime.
    assert generated._b.__name__ == "transformer_engine_ops.runtime.boundary"
    assert generated.Any is not ops.Any
