"""TE layout mode: the same bundles in Transformer Engine's own run-time slot layout.

TE 2.20 reflects on each argument dataclass at import (``_parse_arg_type`` in
``transformer_engine/pytorch/dynamo/custom_op.py``) and packs every call by
interpreting that plan. This mode renders the plan at build time instead: for each
bundle, TE's schema string (character for character, the value-bundle type name being
configuration), the TE kind of every field, and straight-line ``pack_*``/``unpack_*``
functions with the interface of TE's ``_ArgPlan.pack``/``unpack`` (slot dict in, slot
dict out), so TE could take a generated plan instead of reflecting at import.

TE's layout, per field in declaration order:

* tensor: one ``Tensor`` / ``Tensor?`` slot;
* tensor-or-quantized: ``Tensor? f, Tensor[] f__tensors, <value bundle> f__meta``;
* process group and every "simple" value: no slot of their own; they ride in ONE
  value bundle, the trailing ``<value bundle> _simple_meta`` slot (present when any
  field needs it);
* unsupported: no slot; only None (or a list/tuple of Nones) may cross.

Our kinds map onto TE's: tensor, tensor-or-quantized, process group and unsupported
as they are; a list of tensors (or of tensor-or-quantized values) is unsupported to TE
(neither a tensor nor simple in its reflection); every other kind of ours (scalars, sizes, fixed
tuples, enums, literals, quantizers, value types) is TE's "simple".
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2

from . import FORMAT_VERSION
from .config import Config
from .emit import snake
from .model import Bundle, Field, SourceModule

TENSOR = "tensor"
TENSOR_OR_QUANTIZED = "tensor_or_quantized"
PROCESS_GROUP = "process_group"
SIMPLE = "simple"
UNSUPPORTED = "unsupported"
# TE's name for the trailing value-bundle slot (``_SIMPLE_META_SLOT``).
VALUE_BUNDLE_SLOT = "_simple_meta"

# Our kind (by its documented name) -> TE's kind; anything else is SIMPLE.
_TE_KIND = {
    "tensor": TENSOR,
    "tensor-or-quantized": TENSOR_OR_QUANTIZED,
    "process group": PROCESS_GROUP,
    "unsupported": UNSUPPORTED,
    "tensor list": UNSUPPORTED,
    # `List[TensorOrQuantized]` is neither a tensor nor simple to TE's reflection.
    "tensor-or-quantized list": UNSUPPORTED,
}


def te_kind(field: Field) -> str:
    """TE's kind for one of our classified fields."""
    return _TE_KIND.get(field.type.kind.value, SIMPLE)


@dataclass(frozen=True)
class TeSlot:
    field: str
    kind: str
    name: str
    type: str


@dataclass(frozen=True)
class TeField:
    name: str
    kind: str
    pack: str  # one statement filling `slots[...]` (or checking an unsupported value)
    unpack: str  # the keyword value of the constructor call
    value: str = ""  # for simple / process-group fields: the value-bundle entry


def te_slots(bundle: Bundle, value_bundle_type: str) -> tuple[TeSlot, ...]:
    """TE's schema slots for a bundle, in TE's order."""
    slots: list[TeSlot] = []
    bundled = False
    for f in bundle.fields:
        kind = te_kind(f)
        if kind == TENSOR:
            slots.append(TeSlot(f.name, kind, f.name, "Tensor?" if f.type.optional else "Tensor"))
        elif kind == TENSOR_OR_QUANTIZED:
            slots.append(TeSlot(f.name, kind, f.name, "Tensor?"))
            slots.append(TeSlot(f.name, kind, f"{f.name}__tensors", "Tensor[]"))
            slots.append(TeSlot(f.name, kind, f"{f.name}__meta", value_bundle_type))
        elif kind in (SIMPLE, PROCESS_GROUP):
            bundled = True
    if bundled:
        slots.append(TeSlot("", "value bundle", VALUE_BUNDLE_SLOT, value_bundle_type))
    return tuple(slots)


def te_schema(bundle: Bundle, value_bundle_type: str) -> str:
    """The schema text TE's ``_parse_arg_type`` derives (no return type, as TE keeps it)."""
    slots = te_slots(bundle, value_bundle_type)
    return "(" + ", ".join(f"{s.type} {s.name}" for s in slots) + ")"


def _field_code(bundle: Bundle, field: Field) -> TeField:
    name, kind = field.name, te_kind(field)
    where = f'"{bundle.name}.{name}"'
    value = f"args.{name}"
    if kind == TENSOR:
        return TeField(name, kind, f'slots["{name}"] = {value}', f'slots["{name}"]')
    if kind == TENSOR_OR_QUANTIZED:
        keys = ", ".join(f'slots["{name}{s}"]' for s in ("", "__tensors", "__meta"))
        return TeField(name, kind, f"{keys} = _pack_tq({value}, {where})", f"_unpack_tq({keys})")
    if kind == PROCESS_GROUP:
        return TeField(name, kind, "", f'_resolve_group(values["{name}"])', f"_group_name({value})")
    if kind == SIMPLE:
        return TeField(name, kind, "", f'values["{name}"]', value)
    return TeField(name, kind, f"_trivial({value}, {where})", "None")


@dataclass(frozen=True)
class TeBundleContext:
    name: str
    role: str
    constant: str  # e.g. LINEAR_FWD_ARGS
    pack_name: str
    unpack_name: str
    schema: str
    slots: tuple[TeSlot, ...]
    fields: tuple[TeField, ...]
    bundled: tuple[TeField, ...]  # simple and process-group fields, in field order


def _bundle_context(bundle: Bundle, role: str, value_bundle_type: str) -> TeBundleContext:
    fields = tuple(_field_code(bundle, f) for f in bundle.fields)
    return TeBundleContext(
        name=bundle.name,
        role=role,
        constant=snake(bundle.name).upper(),
        pack_name=f"pack_{snake(bundle.name)}",
        unpack_name=f"unpack_{snake(bundle.name)}",
        schema=te_schema(bundle, value_bundle_type),
        slots=te_slots(bundle, value_bundle_type),
        fields=fields,
        bundled=tuple(f for f in fields if f.kind in (SIMPLE, PROCESS_GROUP)),
    )


def module_context(source: SourceModule, config: Config) -> dict:
    layout = config.reading.te_layout
    assert layout is not None
    (op,) = source.ops
    # No field can take the value-bundle slot name: the reader refuses names starting `_`.
    bundles = [
        _bundle_context(op.forward, "forward", layout.value_bundle_type),
        _bundle_context(op.backward, "backward", layout.value_bundle_type),
    ]
    runtime_module, _, runtime_name = layout.runtime.rpartition(".")
    names = ", ".join(sorted({op.forward.name, op.backward.name}))
    imports = sorted(
        [
            (source.module, f"from {source.module} import {names}"),
            (runtime_module, f"from {runtime_module} import {runtime_name} as _te"),
        ]
    )
    return {
        "source_path": source.path,
        "format_version": FORMAT_VERSION,
        "op": op,
        "runtime": layout.runtime,
        "value_bundle_type": layout.value_bundle_type,
        "value_bundle_slot": VALUE_BUNDLE_SLOT,
        "imports": [line for _, line in imports],
        "bundles": bundles,
    }


def render_modules(
    modules: tuple[SourceModule, ...], config: Config, env: jinja2.Environment, out: str
) -> list[tuple[SourceModule, str, str]]:
    """``(module, output path, unformatted code)`` of ``te_<module>.py`` for every op module."""
    rendered = []
    for module in modules:
        stem = module.path.rsplit("/", 1)[-1]
        code = env.get_template("te_layout.py.j2").render(module_context(module, config))
        rendered.append((module, f"{out}/te_{stem}", code))
    return rendered


def layout_doc(modules: tuple[SourceModule, ...], config: Config, env: jinja2.Environment) -> str:
    layout = config.reading.te_layout
    assert layout is not None
    sections = []
    for module in modules:
        (op,) = module.ops
        for role, bundle in (("forward", op.forward), ("backward", op.backward)):
            sections.append(
                {
                    "source_path": module.path,
                    "role": role,
                    "name": bundle.name,
                    "fields": [(f.name, f.type.kind.value, te_kind(f)) for f in bundle.fields],
                    "slots": te_slots(bundle, layout.value_bundle_type),
                    "schema": te_schema(bundle, layout.value_bundle_type),
                    "ours": sum(len(f.slots) for f in bundle.fields),
                }
            )
    return env.get_template("te_layout.md.j2").render(
        sections=sections, value_bundle_type=layout.value_bundle_type
    )
