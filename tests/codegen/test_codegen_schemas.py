"""Emitted schemas are valid torch schemas and agree with torch's own type rules."""

from __future__ import annotations

import ast
from typing import List, Optional  # noqa: UP035 - the spellings bundles use

import pytest
import torch
from codegen_support import EVERY_KIND, LINEAR, OUTPUT_DIR, REPO_ROOT

from codegen.config import Config
from codegen.model import Bundle
from codegen.pipeline import generate
from codegen.reader import read_source


@pytest.fixture(scope="module")
def emitted(repo_config: Config) -> dict[str, str]:
    """Freshly generated op modules (linear and every_kind), path -> text."""
    files = generate(repo_config, [LINEAR, EVERY_KIND]).files
    return {rel: text for rel, text in files.items() if rel.endswith(".py")}


def _constants(text: str) -> dict[str, object]:
    """Module-level NAME = <literal> assignments and SlotRow tables of a generated file."""
    values: dict[str, object] = {}
    for node in ast.parse(text).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if name.endswith("_SLOTS") and isinstance(node.value, ast.Tuple):
            values[name] = [
                tuple(ast.literal_eval(a) for a in row.args)
                for row in node.value.elts
                if isinstance(row, ast.Call)
            ]
            continue
        try:
            values[name] = ast.literal_eval(node.value)
        except ValueError:
            pass
    return values


def _schemas(files: dict[str, str]) -> list[tuple[str, str, str, list]]:
    found = []
    for rel, text in sorted(files.items()):
        values = _constants(text)
        for role in ("FORWARD", "BACKWARD"):
            if f"{role}_SCHEMA" in values:
                found.append(
                    (
                        rel,
                        values[f"{role}_OP"],
                        values[f"{role}_SCHEMA"],
                        values[f"{role}_SLOTS"],
                    )
                )
    return found


def test_generated_files_declare_both_schemas(emitted: dict[str, str]) -> None:
    ops = {(rel, op) for rel, op, _, _ in _schemas(emitted)}
    assert ops == {
        ("transformer_engine_ops/generated/every_kind.py", "teops::every_kind_fwd"),
        ("transformer_engine_ops/generated/every_kind.py", "teops::every_kind_bwd"),
        ("transformer_engine_ops/generated/linear.py", "teops::linear_fwd"),
        ("transformer_engine_ops/generated/linear.py", "teops::linear_bwd"),
    }


def test_every_emitted_schema_parses_and_matches_its_slot_table(emitted: dict[str, str]) -> None:
    checked_in = (REPO_ROOT / OUTPUT_DIR / "linear.py").read_text(encoding="utf-8")
    schemas = _schemas(
        {**emitted, "checked-in transformer_engine_ops/generated/linear.py": checked_in}
    )
    assert len(schemas) == 6
    for rel, op, schema, slots in schemas:
        parsed = torch._C.parse_schema(op + schema)
        assert parsed.name == op, rel
        assert [str(r.type) for r in parsed.returns] == ["List[Tensor]"], (rel, op)
        assert [a.name for a in parsed.arguments] == [row[2] for row in slots], (rel, op)
        # The slot table and the schema text spell each slot's type identically.
        assert schema == "(" + ", ".join(f"{row[3]} {row[2]}" for row in slots) + ") -> Tensor[]"


# Annotation as a bundle writes it -> the same annotation as a Python object.
INFERABLE = {
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "torch.dtype": torch.dtype,
    "torch.device": torch.device,
    "Optional[bool]": Optional[bool],
    "Optional[int]": Optional[int],
    "Optional[float]": Optional[float],
    "Optional[str]": Optional[str],
    "Optional[torch.dtype]": Optional[torch.dtype],
    "Optional[torch.device]": Optional[torch.device],
    "int | None": Optional[int],
    "torch.Tensor": torch.Tensor,
    "Optional[torch.Tensor]": Optional[torch.Tensor],
    "List[torch.Tensor]": List[torch.Tensor],  # noqa: UP006
    "list[torch.Tensor]": list[torch.Tensor],
}


@pytest.fixture(scope="module")
def inferable_bundle(repo_config: Config) -> Bundle:
    fields = "\n".join(f"    f{i}: {a}" for i, a in enumerate(INFERABLE))
    text = (
        "from dataclasses import dataclass\n"
        "from typing import List, Optional\n\n"
        "import torch\n\n"
        "from transformer_engine_ops.runtime.declaration import OpDeclaration\n\n\n"
        f"@dataclass\nclass Fwd:\n{fields}\n\n\n"
        "@dataclass\nclass Bwd:\n    grad_outputs: List[torch.Tensor]\n\n\n"
        'OP = OpDeclaration(name="infer", forward=Fwd, backward=Bwd, grad_fields=())\n'
    )
    (op,) = read_source("ops/infer.py", text, repo_config).ops
    return op.forward


def _inferred_slot_types(annotation: object) -> list[str]:
    def prototype(x):  # annotated below, with the annotation object itself
        raise NotImplementedError

    prototype.__annotations__ = {"x": annotation, "return": torch.Tensor}
    schema = torch.library.infer_schema(prototype, mutates_args=())
    arguments = schema[1 : schema.index(") ->")]
    return [arg.rsplit(" ", 1)[0] for arg in arguments.split(", ")]


@pytest.mark.parametrize("index,annotation", list(enumerate(INFERABLE)), ids=list(INFERABLE))
def test_slot_type_agrees_with_torch_infer_schema(
    inferable_bundle: Bundle, index: int, annotation: str
) -> None:
    field = inferable_bundle.field(f"f{index}")
    assert field is not None
    ours = [slot.type for slot in field.slots]
    assert ours == _inferred_slot_types(INFERABLE[annotation])


def test_emitted_schema_parses_like_an_inferred_one(inferable_bundle: Bundle) -> None:
    from codegen.emit import schema_string

    ours = torch._C.parse_schema("teops::infer_fwd" + schema_string(inferable_bundle))
    types = [str(a.type) for a in ours.arguments]
    for index, annotation in enumerate(INFERABLE):
        (theirs,) = _inferred_slot_types(INFERABLE[annotation])
        parsed = torch._C.parse_schema(f"teops::one({theirs} x) -> Tensor")
        assert types[index] == str(parsed.arguments[0].type), annotation
