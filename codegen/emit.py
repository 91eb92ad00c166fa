"""Emitters: IR -> template contexts. Decisions live here; templates only lay out text."""

from __future__ import annotations

import ast
import builtins
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from . import FORMAT_VERSION, kinds
from .config import Config
from .errors import CodegenError
from .model import (
    GRAD_OUTPUT_FIELD,
    GRAD_OUTPUTS_FIELD,
    Bundle,
    Field,
    Impls,
    Kind,
    Op,
    SourceModule,
)


@dataclass(frozen=True)
class FieldCode:
    name: str
    kind: str
    pack: str  # one element (or a starred group) of the flatten tuple
    unpack: str  # one keyword value of the unflatten constructor call
    pack_local: str  # ``pack`` reading the field from a local of its name


@dataclass(frozen=True)
class SpecField:
    """A tensor-carrying field and the runtime helper that describes it as TensorSpec(s)."""

    name: str
    spec_fn: str


@dataclass(frozen=True)
class BundleContext:
    name: str
    role: str  # "forward" or "backward"
    op_qualname: str
    schema_name: str
    slots_name: str
    flatten_name: str
    unflatten_name: str
    slot_rows: tuple[tuple[str, ...], ...]  # field, kind, slot, type as Python literals
    doc_rows: tuple[tuple[str, str, str, str], ...]  # field, kind, slot, type as text
    fields: tuple[FieldCode, ...]
    schema: str
    spec_name: str
    tensor_fields: tuple[SpecField, ...]


def snake(name: str) -> str:
    """``LinearFwdArgs`` -> ``linear_fwd_args``; an acronym stays one word
    (``LayerNormMLPFwdArgs`` -> ``layer_norm_mlp_fwd_args``)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


class Spelling:
    """How the generated functions that take the forward fields as parameters
    (``call_<op>``, ``<op>_fwd_slots``, ``<op>_compile_blocker``) spell every other name
    they read.

    A field hides a builtin, a module-level name or a local of its name in those
    functions: a field named ``type`` made ``type(v) is str`` call the field's value
    ("'int' object is not callable"). No field starts with ``_`` (the reader refuses
    it), so where a field has a name the functions read, they read it as ``_<name>``: a
    local is named so, and a builtin or module-level name is bound to it once at module
    level (``_type = type``). Every other name is spelled as is, so an op whose fields
    hide nothing keeps its generated code, and the Dynamo guards of a compiled call
    (each global a compiled call reads is one) stay as they are.
    """

    def __init__(self, fields: frozenset[str]) -> None:
        self._fields = fields
        self._aliases: dict[str, str] = {}

    def __call__(self, dotted: str) -> str:
        """A builtin or module-level name (``torch.Tensor``: by its first part)."""
        head, dot, rest = dotted.partition(".")
        if head not in self._fields:
            return dotted
        self._aliases[f"_{head}"] = head
        return f"_{head}{dot}{rest}"

    def local(self, name: str) -> str:
        """A local variable of those functions."""
        return f"_{name}" if name in self._fields else name

    @property
    def aliases(self) -> list[tuple[str, str]]:
        """``(alias, name)`` of each module-level alias a spelled name needs, sorted."""
        return sorted(self._aliases.items())


class _Imports:
    """``from module import Name`` lines, sorted, with deterministic aliases on clashes."""

    def __init__(self, reserved: frozenset[str] = frozenset()) -> None:
        self._local: dict[str, str] = {}  # qualified name -> local name
        self._modules: dict[str, list[str]] = {"transformer_engine_ops.runtime": ["boundary as _b"]}
        # Names the generated module itself defines or uses: an imported user name equal
        # to one (an enum named `slot`, an impl named `_b`) is imported under an alias.
        self._reserved = reserved

    def use_module(self, package: str, module: str, alias: str) -> None:
        self._modules.setdefault(package, []).append(f"{module} as {alias}")

    def use(self, qualname: str) -> str:
        if qualname not in self._local:
            short = qualname.rsplit(".", 1)[-1]
            taken = set(self._local.values()) | self._reserved
            local = short
            n = 2
            while local in taken:
                local, n = f"{short}_{n}", n + 1
            self._local[qualname] = local
        return self._local[qualname]

    def lines(self) -> list[str]:
        by_module: dict[str, list[str]] = {k: list(v) for k, v in self._modules.items()}
        for qualname, local in self._local.items():
            module, short = qualname.rsplit(".", 1)
            by_module.setdefault(module, []).append(
                short if short == local else f"{short} as {local}"
            )
        # One line per module for plain names, one line per `name as alias` (isort's
        # default, which `ruff check` enforces on generated/), ordered by first name.
        lines = []
        for module, names in sorted(by_module.items()):
            plain = sorted(n for n in names if " as " not in n)
            groups = [plain] if plain else []
            groups += [[n] for n in names if " as " in n]
            for group in sorted(groups):
                lines.append(f"from {module} import {', '.join(group)}")
        return lines


def _tuple_literal(items: tuple[str, ...]) -> str:
    """A one-line tuple of escaped string literals (no magic trailing comma)."""
    return kinds.pyrepr(tuple(items))


def _field_code(bundle: Bundle, field: Field, imports: _Imports, spell: Spelling) -> FieldCode:
    rec = kinds.record(field.type.kind)
    where = kinds.pyrepr(f"{bundle.name}.{field.name}")
    bundled = kinds.CodeInput(f"args.{field.name}", where, field.type, imports.use)
    local = kinds.CodeInput(field.name, where, field.type, imports.use, spell)
    return FieldCode(field.name, rec.name, rec.pack(bundled), rec.unpack(bundled), rec.pack(local))


def schema_string(bundle: Bundle) -> str:
    slots = ", ".join(f"{s.type} {s.name}" for f in bundle.fields for s in f.slots)
    return f"({slots}) -> Tensor[]"


def _bundle_context(
    op: Op, bundle: Bundle, role: str, config: Config, imports: _Imports, spell: Spelling
) -> BundleContext:
    suffix = "fwd" if role == "forward" else "bwd"
    prefix = role.upper()
    return BundleContext(
        name=imports.use(bundle.qualname),
        role=role,
        op_qualname=f"{config.namespace}::{op.name}_{suffix}",
        schema_name=f"{prefix}_SCHEMA",
        slots_name=f"{prefix}_SLOTS",
        flatten_name=f"flatten_{snake(bundle.name)}",
        unflatten_name=f"unflatten_{snake(bundle.name)}",
        slot_rows=tuple(
            tuple(kinds.pyrepr(x) for x in (f.name, f.type.kind.value, s.name, s.type))
            for f in bundle.fields
            for s in f.slots
        ),
        doc_rows=tuple(
            (f.name, f.type.kind.value, s.name, s.type) for f in bundle.fields for s in f.slots
        ),
        fields=tuple(_field_code(bundle, f, imports, spell) for f in bundle.fields),
        schema=schema_string(bundle),
        spec_name=f"spec_{snake(bundle.name)}",
        tensor_fields=tuple(
            SpecField(f.name, kinds.record(f.type.kind).spec)  # type: ignore[arg-type]
            for f in bundle.fields
            if kinds.record(f.type.kind).spec is not None
        ),
    )


def slot_index(bundle: Bundle, field_name: str) -> int:
    """Index of a field's first slot in its bundle's schema."""
    index = 0
    for f in bundle.fields:
        if f.name == field_name:
            return index
        index += len(f.slots)
    raise KeyError(field_name)


def _code_tuple(items: list[str]) -> str:
    """A one-line tuple display of code items (no magic trailing comma)."""
    inner = ", ".join(items)
    return f"({inner},)" if len(items) == 1 else f"({inner})"


def _int_tuple(items: list[int]) -> str:
    return _code_tuple([str(i) for i in items])


def _quantized_slots(bundle: Bundle) -> str:
    return _int_tuple(
        [
            slot_index(bundle, f.name)
            for f in bundle.fields
            if f.type.kind in (Kind.TENSOR_OR_QUANTIZED, Kind.TENSOR_OR_QUANTIZED_LIST)
        ]
    )


_CARRIES_TENSORS = (
    Kind.TENSOR,
    Kind.TENSOR_LIST,
    Kind.TENSOR_OR_QUANTIZED,
    Kind.TENSOR_OR_QUANTIZED_LIST,
)


@dataclass(frozen=True)
class BackwardValue:
    """One keyword of the backward bundle the generated autograd Functions rebuild."""

    name: str
    value: str


def _spread(value: str, is_list: bool) -> str:
    """An ``autograd.Function`` input: a gradient field's value, or its elements."""
    return f"*({value} or ())" if is_list else value


def _lengths(values: list[str], lists: list[bool]) -> str:
    """Each gradient field's element count (None for a single value), as code."""
    return _code_tuple(
        [f"_r.length({v})" if is_list else "None" for v, is_list in zip(values, lists, strict=True)]
    )


@dataclass(frozen=True)
class EagerReason:
    """One ``if condition: return reason`` line of the generated compile blocker."""

    condition: str
    reason: str  # an escaped Python literal


def _eager_reasons(op: Op, spell: Spelling) -> list[EagerReason]:
    reasons = []
    for entry in op.eager_when:
        terms = [
            f"{spell('isinstance')}({name}, _r.QuantizedData)" if quantized else name
            for name, quantized in entry.terms
        ]
        reasons.append(EagerReason(" and ".join(terms), kinds.pyrepr(entry.reason)))
    return reasons


def _quantizer_values(bundle: Bundle) -> list[tuple[str, bool]]:
    """Every quantizer field of a forward bundle, in order: its name and whether it is a
    list (one quantizer per GEMM)."""
    return [
        (f.name, f.type.kind is Kind.QUANTIZER_LIST)
        for f in bundle.fields
        if f.type.kind in (Kind.QUANTIZER, Kind.QUANTIZER_LIST)
    ]


def _blocker_fields(op: Op) -> list[str]:
    """The forward fields the compile blocker reads, in bundle order."""
    read = {name for entry in op.eager_when for name, _ in entry.terms}
    quantizers = (Kind.QUANTIZER, Kind.QUANTIZER_LIST)
    return [f.name for f in op.forward.fields if f.name in read or f.type.kind in quantizers]


@dataclass(frozen=True)
class EntryParam:
    """One keyword-only parameter of ``call_<op>``: a forward field and its default."""

    name: str
    default: str | None  # a literal's source text, or None (the caller passes it)


def _literal_default(field: Field) -> str | None:
    """The field's default where it is a literal (``None``, ``False``, ``(1, 2)``); a
    computed default (``field(default_factory=list)``) leaves the keyword required."""
    if field.default is None:
        return None
    try:
        ast.literal_eval(field.default)
    except (ValueError, SyntaxError):
        return None
    return field.default


# `call_<op>`'s own keyword beside the fields.
KEEP = "keep"


def _check_entry_fields(op: Op) -> None:
    """Any field name works (see Spelling) but the one `call_<op>` has a keyword of."""
    keep = op.forward.field(KEEP)
    if keep is not None:
        raise CodegenError(
            keep.location,
            f"field `{KEEP}` of {op.forward.name} is named like the `{KEEP}` keyword of the "
            f"generated `call_{op.name}`, which takes every forward field as a keyword "
            f"beside it (`{KEEP}`: the saved values a module keeps across calls)",
            "rename the field",
        )


def _spelled_names(op: Op, spell: Spelling) -> dict[str, str]:
    """The names the calling-side templates read besides the fields, as they spell them."""
    return {
        "torch": spell("torch"),
        "getattr": spell("getattr"),
        "fwd_op": spell(f"{op.name}_fwd"),
        "bwd_op": spell(f"{op.name}_bwd"),
        "blocker": spell(f"{op.name}_compile_blocker"),
        **{name: spell.local(name) for name in ("reason", "flat", "outputs", "args")},
    }


def calling_side_context(op: Op, spell: Spelling) -> dict:
    """What the generated autograd Functions and calling side need, field by field."""
    grad_name = (
        GRAD_OUTPUTS_FIELD
        if op.backward.field(GRAD_OUTPUTS_FIELD) is not None
        else GRAD_OUTPUT_FIELD
    )
    grad_kinds = [op.forward.field(g).type.kind for g in op.grad_fields]  # type: ignore[union-attr]
    lists = [kinds.gradient_per_element(k) for k in grad_kinds]
    saved = [
        f.name
        for f in op.backward.fields
        if f.type.kind in _CARRIES_TENSORS and f.name != grad_name
    ]
    arg_values = [f"args.{g}" for g in op.grad_fields]
    slot_values = [f"slots[{slot_index(op.forward, g)}]" for g in op.grad_fields]
    grads = "grads[0]" if grad_name == GRAD_OUTPUT_FIELD else "list(grads)"
    backward_values = []
    for f in op.backward.fields:
        if f.name == grad_name:
            value = grads
        elif f.name in saved:
            value = f"values[{saved.index(f.name)}]"
        else:
            value = f"kept.{f.name}"
        backward_values.append(BackwardValue(f.name, value))
    return {
        "grad_outputs_field": grad_name,
        "grad_output_only": grad_name == GRAD_OUTPUT_FIELD,
        "grad_inputs": [_spread(v, is_list) for v, is_list in zip(arg_values, lists, strict=True)],
        "grad_slot_inputs": [
            _spread(v, is_list) for v, is_list in zip(slot_values, lists, strict=True)
        ],
        "grad_values": ", ".join(arg_values),
        "has_grad_lists": any(lists),
        "eager_lengths": _lengths(arg_values, lists),
        "slot_lengths": _lengths(slot_values, lists),
        "saved_fields": tuple(saved),
        "backward_values": backward_values,
        "receiver": (grad_name, "None" if grad_name == GRAD_OUTPUT_FIELD else "[]"),
        "copied_fields": _tuple_literal(op.copied),
        "made_fields": (
            f"frozenset({{{', '.join(kinds.pyrepr(m) for m in op.made)}}})"
            if op.made
            else "frozenset()"
        ),
        "copied": op.copied,
        "eager_reasons": _eager_reasons(op, spell),
        "n": _spelled_names(op, spell),
        "cudagraph_unsafe": (
            None if op.cudagraph_unsafe is None else kinds.pyrepr(op.cudagraph_unsafe)
        ),
        "quantizer_values": _quantizer_values(op.forward),
        "blocker_fields": _blocker_fields(op),
        "entry_params": [EntryParam(f.name, _literal_default(f)) for f in op.forward.fields],
        "plain_fields": op.plain_fields,
        "group_fields": [
            (f.name, kinds.pyrepr(f"{op.forward.name}.{f.name}"))
            for f in op.forward.fields
            if f.type.kind is Kind.PROCESS_GROUP
        ],
    }


_TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.cache
def _template_names() -> frozenset[str]:
    """Every identifier in the templates: a superset of the names generated code uses."""
    names: set[str] = set(dir(builtins))
    for path in sorted(_TEMPLATE_DIR.glob("*.j2")):
        names.update(_IDENTIFIER.findall(path.read_text(encoding="utf-8")))
    return frozenset(names)


def _generated_names(op: Op) -> frozenset[str]:
    """The module-level names a generated op module defines for its op."""
    generated = {f"{op.name}_fwd", f"{op.name}_bwd", f"{op.name}_fwd_slots"}
    generated |= {f"call_{op.name}", f"{op.name}_eager", f"{op.name}_compiled"}
    generated |= {f"{op.name}_compile_blocker"}
    for bundle in (op.forward, op.backward):
        s = snake(bundle.name)
        generated |= {f"flatten_{s}", f"unflatten_{s}", f"spec_{s}"}
    return frozenset(generated)


def _reserved_names(op: Op) -> frozenset[str]:
    # The forward fields too: `call_<op>` and the slot function take them as locals; and
    # `_<field>`, the alias or local a name such a field hides is read by (Spelling).
    fields = {f.name for f in op.forward.fields}
    aliases = {f"_{name}" for name in fields}
    return _template_names() | _generated_names(op) | fields | aliases


def op_module_context(source: SourceModule, config: Config) -> dict:
    (op,) = source.ops  # the reader allows exactly one op per module
    imports = _Imports(_reserved_names(op))
    spell = Spelling(frozenset(f.name for f in op.forward.fields))
    for bundle in (op.forward, op.backward):
        imports.use(bundle.qualname)
    registration: dict = {"impls": op.impls}
    if op.impls is not None:
        _check_entry_fields(op)
        if op.plain_problem is not None:
            p = op.plain_problem
            raise CodegenError(p.location, p.message, p.hint)
        registration["impls"] = Impls(
            **{
                key: imports.use(f"{source.module}.{name}")
                for key, name in vars(op.impls).items()
                if name is not None
            }
        )
        imports.use_module("transformer_engine_ops.runtime", "custom_ops", "_r")
        plain_call = op.plain_call and imports.use(f"{source.module}.{op.plain_call}")
        registration.update(
            plain_call=plain_call,
            forward_quantized_slots=_quantized_slots(op.forward),
            backward_quantized_slots=_quantized_slots(op.backward),
            **calling_side_context(op, spell),
        )
    bundles = [
        _bundle_context(op, op.forward, "forward", config, imports, spell),
        # No backward field is a parameter of a generated function.
        _bundle_context(op, op.backward, "backward", config, imports, Spelling(frozenset())),
    ]
    registration["aliases"] = spell.aliases  # every name is spelled by now
    return {
        "source_path": source.path,
        "format_version": FORMAT_VERSION,
        "op": op,
        "namespace": config.namespace,
        "bundles": bundles,
        "imports": imports.lines(),
        "grad_fields": _tuple_literal(op.grad_fields),
        "fwd": bundles[0],
        "bwd": bundles[1],
        **registration,
    }


def schemas_doc_context(modules: list[tuple[SourceModule, dict]]) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "modules": [
            {"source_path": s.path, "op": ctx["op"], "bundles": ctx["bundles"]}
            for s, ctx in modules
        ],
    }
