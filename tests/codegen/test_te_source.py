"""Transformer Engine 2.20.2's own source, read as it ships, against TE's own reflection.

The wheel is fetched with pip into ~/.cache/teops (``codegen.te_wheel``; the test skips,
saying why, only when it cannot be fetched). TE's ``dynamo/custom_op.py`` then runs here
on the CPU, loaded from the wheel with small stand-ins for the two TE modules it imports
(``quantized_tensor``, ``utils``) and, on torch < 2.14, for the two opaque-object
functions it expects under their 2.14 names. TE's four bundle classes are built from the
class statements in TE's files (executed alone: the modules themselves need TE's C++
extension). Nothing imports ``transformer_engine`` from an installation.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
import sys
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from codegen_support import REPO_ROOT, run_main, snapshot

from codegen import te_layout
from codegen.config import load_config
from codegen.emit import snake
from codegen.pipeline import find_bundle, read_all
from codegen.te_wheel import FetchError, ensure_source

EXAMPLE = REPO_ROOT / "examples" / "te_2_20"
LINEAR = "transformer_engine/pytorch/module/linear.py"
BACKENDS = "transformer_engine/pytorch/attention/dot_product_attention/backends.py"
CUSTOM_OP = "transformer_engine.pytorch.dynamo.custom_op"
TENSOR_SPEC = "transformer_engine.pytorch.dynamo.tensor_spec"
# The example's te_layout.value_bundle_type.
VALUE_BUNDLE_TYPE = "transformer_engine.pytorch.dynamo.custom_op.OpaqueValueBundle"
# bundle -> (source, fields, TE slots)
BUNDLES = {
    "LinearFwdArgs": (LINEAR, 46, 9),
    "LinearBwdArgs": (LINEAR, 46, 12),
    "FusedAttnFwdArgs": (BACKENDS, 36, 20),
    "FusedAttnBwdArgs": (BACKENDS, 46, 26),
}


@pytest.fixture(scope="session")
def te_root() -> Path:
    try:
        return ensure_source()
    except FetchError as exc:
        pytest.skip(f"TE 2.20.2's wheel could not be fetched with pip: {exc}")


class _Storage:
    """Stand-in for TE's QuantizedTensorStorage: named inner buffers plus a context."""

    def __init__(self, data: torch.Tensor, scale_inv: torch.Tensor, fp8_dtype: str) -> None:
        self._data, self._scale_inv, self.fp8_dtype = data, scale_inv, fp8_dtype

    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        return ["_data", "_scale_inv"], {"cls": type(self), "fp8_dtype": self.fp8_dtype}

    @staticmethod
    def __tensor_unflatten__(inner: dict, meta: dict, outer_size: Any, outer_stride: Any) -> Any:
        return meta["cls"](inner["_data"], inner["_scale_inv"], meta["fp8_dtype"])


class _Quantizer:
    """Stand-in for TE's abstract Quantizer (quantizer fields are None here)."""


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


@pytest.fixture(scope="module")
def te_runtime(te_root: Path) -> Iterator[types.ModuleType]:
    """TE's own dynamo/custom_op.py from the wheel, loaded under its real module name."""
    api = importlib.import_module("torch._library.opaque_object")
    patched = {}
    if not hasattr(api, "register_custom_class"):  # torch < 2.14 names these differently
        patched = {
            "register_custom_class": lambda cls, typ: api.register_opaque_type(cls, typ="value"),
            "is_opaque_constant_type": api.is_opaque_value_type,
        }
    for name, value in patched.items():
        setattr(api, name, value)
    disabled: list[str] = []
    stand_ins = {
        "transformer_engine": _module("transformer_engine", __path__=[]),
        "transformer_engine.pytorch": _module("transformer_engine.pytorch", __path__=[]),
        "transformer_engine.pytorch.dynamo": _module(
            "transformer_engine.pytorch.dynamo", __path__=[]
        ),
        "transformer_engine.pytorch.quantized_tensor": _module(
            "transformer_engine.pytorch.quantized_tensor",
            QuantizedTensorStorage=_Storage,
            QuantizedTensor=type("QuantizedTensor", (torch.Tensor,), {}),
            Quantizer=_Quantizer,
            _quantized_tensor_passthrough_ops=set(),
            prepare_for_saving=lambda *tensors: (list(tensors), []),
        ),
        "transformer_engine.pytorch.utils": _module(
            "transformer_engine.pytorch.utils", record_compile_disabled=disabled.append
        ),
    }
    loaded = [*stand_ins, TENSOR_SPEC, CUSTOM_OP]
    assert not any(name in sys.modules for name in loaded), "transformer_engine is imported"
    sys.modules.update(stand_ins)
    try:
        for name in (TENSOR_SPEC, CUSTOM_OP):
            path = te_root / (name.replace(".", "/") + ".py")
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        runtime = sys.modules[CUSTOM_OP]
        if runtime._OPAQUE_VALUE_BUNDLE_TYPE_NAME is None:
            pytest.skip(f"TE 2.20.2 cannot register its value bundle on this torch: {disabled}")
        yield runtime
    finally:
        for name in loaded:
            sys.modules.pop(name, None)
        for name in patched:
            delattr(api, name)


@pytest.fixture(scope="module")
def te_classes(te_root: Path, te_runtime: types.ModuleType) -> Iterator[dict[str, type]]:
    """TE's four bundle classes, built from their class statements in TE's own files."""
    import dataclasses
    import typing

    # The names TE's class statements use, bound as TE's modules bind them (typing's
    # own generics: TE's annotations are evaluated, not read as text).
    namespace_base = {
        "dataclass": dataclasses.dataclass,
        **{n: getattr(typing, n) for n in ("Any", "Callable", "Dict", "List", "Optional")},
        **{n: getattr(typing, n) for n in ("Tuple", "Union")},
        "torch": torch,
        "TensorOrQuantized": te_runtime.TensorOrQuantized,
        "Quantizer": _Quantizer,
        "dist_group_type": torch.distributed.ProcessGroup,  # pytorch/constants.py
        "_2X_ACC_DGRAD": True,  # module/base.py
        "_2X_ACC_WGRAD": True,
    }
    classes: dict[str, type] = {}
    for source in (LINEAR, BACKENDS):
        module_name = source.removesuffix(".py").replace("/", ".")
        text = (te_root / source).read_text(encoding="utf-8")
        module = _module(module_name, **namespace_base)
        sys.modules[module_name] = module  # @dataclass looks its module up
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef) and node.name in BUNDLES:
                start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                lines = text.splitlines()[start - 1 : node.end_lineno]
                code = compile("\n".join(lines), str(te_root / source), "exec")
                exec(code, module.__dict__)
                classes[node.name] = module.__dict__[node.name]
    assert set(classes) == set(BUNDLES)
    yield classes
    for source in (LINEAR, BACKENDS):
        sys.modules.pop(source.removesuffix(".py").replace("/", "."), None)


@pytest.fixture(scope="module")
def ours(te_root: Path) -> dict[str, Any]:
    """Our reading of TE's two files, through the example's configuration."""
    config = load_config(EXAMPLE)
    assert config.reading.source_root == te_root.resolve()
    modules = read_all(config)
    return {name: find_bundle(modules, name) for name in BUNDLES} | {"_config": config}


@pytest.mark.parametrize("name", list(BUNDLES))
def test_te_layout_schema_equals_the_one_tes_reflection_derives(
    name: str, ours: dict[str, Any], te_classes: dict[str, type], te_runtime: types.ModuleType
) -> None:
    plan = te_runtime._parse_arg_type(te_classes[name])
    bundle_type = ours["_config"].reading.te_layout.value_bundle_type
    schema = te_layout.te_schema(ours[name], bundle_type)
    expected = plan.schema_str.replace(te_runtime._OPAQUE_VALUE_BUNDLE_TYPE_NAME, bundle_type)
    assert schema == expected
    _, fields, slots = BUNDLES[name]
    assert len(plan.slot_names) == slots == len(te_layout.te_slots(ours[name], bundle_type))
    assert len(ours[name].fields) == fields


@pytest.mark.parametrize("name", list(BUNDLES))
def test_every_field_has_the_kind_tes_reflection_gives_it(
    name: str, ours: dict[str, Any], te_classes: dict[str, type], te_runtime: types.ModuleType
) -> None:
    plan = te_runtime._parse_arg_type(te_classes[name])
    theirs = {f.name: f.kind.value for f in plan.fields}
    mine = {f.name: te_layout.te_kind(f) for f in ours[name].fields}
    assert list(mine) == list(theirs)  # every field, in order
    assert mine == theirs


def _linear_args(classes: dict[str, type], storage: bool) -> tuple[Any, Any]:
    fwd_cls, bwd_cls = classes["LinearFwdArgs"], classes["LinearBwdArgs"]
    names = fwd_cls.__dataclass_fields__
    values: dict[str, Any] = {n: None for n in names}
    values.update({n: False for n, f in names.items() if f.type is bool})
    weight = _Storage(torch.ones(4, 8, dtype=torch.uint8), torch.ones(1), "e4m3")
    values.update(
        weight=weight if storage else torch.randn(4, 8),
        inp=torch.randn(2, 8),
        bias=torch.randn(4),
        activation_dtype=torch.bfloat16,
        tp_size=1,
        parallel_mode="column",
        input_requires_grad=True,
    )
    fwd = fwd_cls(**values)
    bwd = bwd_cls(grad_output=torch.randn(2, 4), inp_shape=torch.Size([2, 8]), tp_size=2)
    return fwd, bwd


def _generated(name: str) -> types.ModuleType:
    path = EXAMPLE / "generated" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_te_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


def _same_slots(mine: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert list(mine) == list(theirs)
    for key, value in theirs.items():
        if isinstance(value, list):
            assert len(mine[key]) == len(value) and all(
                a is b for a, b in zip(mine[key], value, strict=True)
            ), key
        elif isinstance(value, torch.Tensor) or value is None:
            assert mine[key] is value, key
        else:
            assert mine[key] == value, key


@pytest.mark.parametrize("storage", [False, True], ids=["tensor-weight", "storage-weight"])
def test_generated_te_pack_and_unpack_equal_tes_own(
    storage: bool, te_classes: dict[str, type], te_runtime: types.ModuleType
) -> None:
    generated = _generated("te_linear")
    fwd, bwd = _linear_args(te_classes, storage)
    for args, pack, unpack in (
        (fwd, generated.pack_linear_fwd_args, generated.unpack_linear_fwd_args),
        (bwd, generated.pack_linear_bwd_args, generated.unpack_linear_bwd_args),
    ):
        plan = te_runtime._parse_arg_type(type(args))
        mine, theirs = pack(args), plan.pack(args)
        _same_slots(mine, theirs)
        back, their_back = unpack(mine), plan.unpack(theirs)
        for name in type(args).__dataclass_fields__:
            a, b = getattr(back, name), getattr(their_back, name)
            if isinstance(b, _Storage):
                assert isinstance(a, _Storage) and a._data is b._data, name
            else:
                assert a is b or a == b, name
    for name in ("LinearFwdArgs", "LinearBwdArgs"):
        schema = te_runtime._parse_arg_type(te_classes[name]).schema_str
        expected = schema.replace(te_runtime._OPAQUE_VALUE_BUNDLE_TYPE_NAME, VALUE_BUNDLE_TYPE)
        assert getattr(generated, f"{snake(name).upper()}_SCHEMA") == expected


def test_generated_te_pack_refuses_a_value_for_an_unsupported_field(
    te_classes: dict[str, type],
) -> None:
    generated = _generated("te_linear")
    fwd, _ = _linear_args(te_classes, storage=False)
    fwd = replace(fwd, fsdp_group=object())
    with pytest.raises(TypeError, match="LinearFwdArgs.fsdp_group"):
        generated.pack_linear_fwd_args(fwd)


def test_te_boundary_example_is_up_to_date(te_root: Path) -> None:
    result = run_main("--root", str(EXAMPLE), "--check")
    assert result.rc == 0, result.out + result.err


def test_explain_prints_every_field_of_tes_linear_forward_bundle(te_root: Path) -> None:
    result = run_main("--root", str(EXAMPLE), "explain", "LinearFwdArgs")
    assert result.rc == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith(f"LinearFwdArgs ({LINEAR}:")
    assert lines[1].split() == ["field", "annotation", "kind", "slots"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert len(rows) == 46
    assert "tensor-or-quantized" in rows["weight"] and "Tensor[] weight__inner" in rows["weight"]
    assert "process group" in rows["tp_group"] and "str? tp_group" in rows["tp_group"]
    assert "(none: must be None)" in rows["fsdp_group"]


@pytest.mark.slow
def test_a_planted_mixed_union_in_tes_file_is_positioned_and_writes_nothing(
    te_root: Path, tmp_path: Path
) -> None:
    source = tmp_path / "te"
    shutil.copytree(te_root / "transformer_engine", source / "transformer_engine")
    linear = source / LINEAR
    text = linear.read_text(encoding="utf-8")
    planted = text.replace("    inp: torch.Tensor\n", "    inp: Union[torch.Tensor, int]\n", 1)
    assert planted != text
    linear.write_text(planted, encoding="utf-8")
    line = planted[: planted.index("Union[torch.Tensor, int]")].count("\n") + 1
    project = tmp_path / "project"
    project.mkdir()
    config = (EXAMPLE / "pyproject.toml").read_text(encoding="utf-8")
    config = config.replace(
        '"${TEOPS_CACHE:-~/.cache/teops}/transformer_engine-2.20.2"', f'"{source}"'
    )
    (project / "pyproject.toml").write_text(config, encoding="utf-8")
    before = snapshot(tmp_path)
    for mode in ((), ("--check",), ("--diff",)):
        result = run_main("--root", str(project), "--source", LINEAR, *mode)
        assert result.rc == 1, result.out + result.err
        assert "Traceback" not in result.out + result.err
        assert f"{LINEAR}:{line}:10: error: mixed union of Tensor, int" in result.err
        assert snapshot(tmp_path) == before
    assert not (project / "generated").exists()


@pytest.mark.slow
def test_te_boundary_writes_only_inside_the_examples_output_folder(
    te_root: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    (project / "generated" / "te_linear.py").unlink()
    schemas = project / "generated" / "SCHEMAS.md"
    schemas.write_text(schemas.read_text(encoding="utf-8") + "stale\n", encoding="utf-8")
    source_before, outside_before = snapshot(te_root), snapshot(tmp_path)

    result = run_main("--root", str(project))

    assert result.rc == 0, result.err
    assert sorted(result.out.splitlines()[:-1]) == [
        "wrote generated/SCHEMAS.md",
        "wrote generated/te_linear.py",
    ]
    assert snapshot(te_root) == source_before
    changed = {k for k, v in snapshot(tmp_path).items() if outside_before.get(k) != v}
    assert changed == {"project/generated/SCHEMAS.md", "project/generated/te_linear.py"}
    assert snapshot(project / "generated") == snapshot(EXAMPLE / "generated")


def test_generated_te_pack_of_the_attention_backward_bundle_equals_tes(
    te_classes: dict[str, type], te_runtime: types.ModuleType
) -> None:
    generated = _generated("te_backends")
    args = te_classes["FusedAttnBwdArgs"](
        grad_output=torch.randn(2, 3),
        q_fp8=torch.randn(2, 3),
        q=torch.randn(2, 3),
        window_size=(-1, 0),
        max_seqlen_q=128,
        nominal_dtype=torch.bfloat16,
        qkv_layout="bshd_bshd_bshd",
    )
    plan = te_runtime._parse_arg_type(type(args))
    mine, theirs = generated.pack_fused_attn_bwd_args(args), plan.pack(args)
    _same_slots(mine, theirs)
    back = generated.unpack_fused_attn_bwd_args(mine)
    assert back.window_size == (-1, 0) and back.q_fp8 is args.q_fp8 and back.out_fp8 is None
