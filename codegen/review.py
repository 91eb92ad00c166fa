"""What a bundle change breaks, and for whom: the classification behind ``codegen diff``.

Two sides of a review (a git revision and the working tree), each read by the
generator's own reader into the IR and rendered into its schemas, are compared op by
op. Every difference is a :class:`Finding` under a named rule (``RULES``, documented
in docs/review.md), with a verdict for each :class:`Consumer` of an op's contract,
as ``buf breaking`` classifies a protobuf change per compatibility level:

* code that builds a bundle by keyword or positionally sees the dataclass (fields,
  their order, types and defaults);
* a saved compiled graph calls the op with its schema slots *by position*;
* an exported program's op arguments are matched to the schema *by name* on load,
  and a schema argument the program lacks needs a schema default.

Nothing here reads files, runs git or imports torch: the inputs are IR records and
schema strings.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .model import Bundle, Field, FieldType, Kind, Op
from .schema_text import Schema, SchemaArg


class Consumer(enum.Enum):
    """Who depends on an op's contract; ``value`` is the ``--consumers`` name."""

    KEYWORD = "keyword"
    POSITIONAL = "positional"
    COMPILED = "compiled"
    EXPORTED = "exported"

    @property
    def title(self) -> str:
        return _CONSUMER_TITLES[self]


_CONSUMER_TITLES = {
    Consumer.KEYWORD: "keyword callers",
    Consumer.POSITIONAL: "positional callers",
    Consumer.COMPILED: "saved compiled graphs",
    Consumer.EXPORTED: "exported programs",
}

# Every rule a finding can carry, with what it means: the table of docs/review.md.
RULES = {
    "OP_ADDED": "a new op",
    "OP_REMOVED": "an op's declaration is gone",
    "OP_QUALNAME_CHANGED": "the op's registered name changed (the configured namespace)",
    "OP_GRAD_FIELDS_CHANGED": "the forward fields that receive gradients changed",
    "BUNDLE_RENAMED": "a bundle class has a new name",
    "FIELD_ADDED": "a bundle field was added",
    "FIELD_REMOVED": "a bundle field was removed (a rename is a removal and an addition)",
    "FIELD_TYPE_CHANGED": "a field's type or kind changed (also by the configured kinds)",
    "FIELD_TYPE_WIDENED": "a field became Optional, nothing else changed",
    "FIELD_CHOICES_ADDED": "a Literal field accepts more strings",
    "FIELD_CHOICES_REMOVED": "a Literal field accepts fewer strings",
    "FIELD_MOVED": "a field changed its place among the fields both sides have",
    "FIELD_DEFAULT_ADDED": "a field without a default got one",
    "FIELD_DEFAULT_REMOVED": "a field lost its default",
    "FIELD_DEFAULT_CHANGED": "a field's default value changed",
    "SLOT_ADDED": "a schema slot appeared with no field change (configuration or templates)",
    "SLOT_REMOVED": "a schema slot disappeared with no field change",
    "SLOT_TYPE_CHANGED": "a slot's schema type changed with no field change",
    "SLOT_MOVED": "a slot changed its place with no field change",
    "SLOT_DEFAULT_CHANGED": "a slot's schema default was added, removed or changed",
    "SCHEMA_RETURNS_CHANGED": "the schema's return type changed",
    "SCHEMA_TEXT_CHANGED": "the schema text changed but parses to the same arguments",
}


@dataclass(frozen=True)
class Verdict:
    breaking: bool
    reason: str


@dataclass(frozen=True)
class Finding:
    rule: str
    subject: str  # `LinearFwdArgs.bias`, `teops::linear_fwd`, `linear`
    summary: str
    verdicts: tuple[tuple[Consumer, Verdict], ...]  # every consumer, in Consumer order

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown rule {self.rule}")
        if tuple(c for c, _ in self.verdicts) != tuple(Consumer):
            raise ValueError(f"{self.rule}: a verdict for every consumer, in order")

    def verdict(self, consumer: Consumer) -> Verdict:
        return dict(self.verdicts)[consumer]

    def breaks(self, consumers: Iterable[Consumer] = tuple(Consumer)) -> bool:
        return any(self.verdict(c).breaking for c in consumers)


# --- The sides of a review -------------------------------------------------------------


@dataclass(frozen=True)
class OpSide:
    """One op as one side of the review sees it: the IR and the schemas its templates write."""

    op: Op
    source: str
    forward: Schema
    backward: Schema


@dataclass(frozen=True)
class SchemaChange:
    role: str  # forward / backward
    before: Schema | None
    after: Schema | None


@dataclass(frozen=True)
class OpReview:
    name: str
    source: str
    findings: tuple[Finding, ...]
    schemas: tuple[SchemaChange, ...]

    def breaks(self, consumers: Iterable[Consumer] = tuple(Consumer)) -> bool:
        consumers = tuple(consumers)
        return any(f.breaks(consumers) for f in self.findings)


def compare(before: dict[str, OpSide], after: dict[str, OpSide]) -> tuple[OpReview, ...]:
    """Every op whose contract differs, by op name; an op with no finding is left out."""
    reviews = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old is None:
            assert new is not None
            findings = (_op_added(new),)
        elif new is None:
            findings = (_op_removed(old),)
        else:
            findings = _op_findings(old, new)
        if not findings:
            continue
        schemas = tuple(
            SchemaChange(role, getattr(old, role, None), getattr(new, role, None))
            for role in ("forward", "backward")
            if getattr(old, role, None) != getattr(new, role, None)
        )
        reviews.append(OpReview(name, (new or old).source, findings, schemas))  # type: ignore[union-attr]
    return tuple(reviews)


# --- Verdicts --------------------------------------------------------------------------


def _verdicts(
    keyword: Verdict, positional: Verdict, compiled: Verdict, exported: Verdict
) -> tuple[tuple[Consumer, Verdict], ...]:
    return tuple(zip(Consumer, (keyword, positional, compiled, exported), strict=True))


def _ok(reason: str) -> Verdict:
    return Verdict(False, reason)


def _breaks(reason: str) -> Verdict:
    return Verdict(True, reason)


_BUNDLE_UNCHANGED = _ok("the bundle's fields are unchanged")
_NO_SLOT_CHANGE = _ok("no schema slot changed: a graph holds every value it was traced with")


def _names(args: Sequence[SchemaArg] | Sequence[Field]) -> str:
    return ", ".join(f"`{a.name}`" for a in args)


def _slots_text(args: Sequence[SchemaArg]) -> str:
    return ", ".join(f"`{a}`" for a in args) if args else "no slot"


def _op_added(new: OpSide) -> Finding:
    ok = _ok("a new op: nothing depends on it yet")
    return Finding(
        "OP_ADDED",
        new.op.name,
        f"new op `{new.forward.qualname}` / `{new.backward.qualname}` "
        f"({new.op.forward.name}, {new.op.backward.name})",
        _verdicts(ok, ok, ok, ok),
    )


def _op_removed(old: OpSide) -> Finding:
    callers = _breaks(
        f"`{old.op.forward.name}` / `{old.op.backward.name}` no longer belong to an op "
        f"(`call_{old.op.name}` is gone)"
    )
    saved = _breaks(f"they call `{old.forward.qualname}`, which is no longer registered")
    return Finding(
        "OP_REMOVED",
        old.op.name,
        f"op `{old.forward.qualname}` / `{old.backward.qualname}` removed",
        _verdicts(callers, callers, saved, saved),
    )


def _op_findings(old: OpSide, new: OpSide) -> tuple[Finding, ...]:
    findings: list[Finding] = []
    renamed = [
        (getattr(old, r).qualname, getattr(new, r).qualname)
        for r in ("forward", "backward")
        if getattr(old, r).qualname != getattr(new, r).qualname
    ]
    if renamed:
        gone = ", ".join(f"`{b}`" for b, _ in renamed)
        findings.append(
            Finding(
                "OP_QUALNAME_CHANGED",
                new.op.name,
                "; ".join(f"`{b}` -> `{a}`" for b, a in renamed),
                _verdicts(
                    _ok("bundles and `call_` functions keep their names"),
                    _ok("bundles keep their fields"),
                    _breaks(f"saved graphs call {gone}, which is no longer registered"),
                    _breaks(f"saved programs name {gone}, which is no longer registered"),
                ),
            )
        )
    if old.op.grad_fields != new.op.grad_fields:
        findings.append(
            Finding(
                "OP_GRAD_FIELDS_CHANGED",
                new.op.name,
                f"grad_fields {old.op.grad_fields} -> {new.op.grad_fields}",
                _verdicts(
                    *[_ok("a bundle does not say which of its fields get gradients")] * 2,
                    _breaks(
                        "a saved graph's backward maps the backward op's gradients to the old "
                        "fields"
                    ),
                    _ok("an exported program holds the forward op call, not its backward"),
                ),
            )
        )
    for role in ("forward", "backward"):
        findings += _BundleComparison(
            getattr(old.op, role), getattr(new.op, role), getattr(old, role), getattr(new, role)
        ).findings()
    return tuple(findings)


# --- Fields ---------------------------------------------------------------------------


def _field_call(node: ast.expr) -> ast.Call | None:
    """``field(...)`` / ``dataclasses.field(...)``, or None."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name == "field":
            return node
    return None


def default_value(field: Field) -> str | None:
    """The field's default as normalized source (``field(default=x)`` is ``x``), or None
    when a caller may not leave it out (no ``=``, or ``field()`` without a default)."""
    if field.default is None:
        return None
    try:
        node = ast.parse(field.default, mode="eval").body
    except SyntaxError:
        return " ".join(field.default.split())
    call = _field_call(node)
    if call is None:
        return ast.unparse(node)
    given = {k.arg: k.value for k in call.keywords}
    if "default" in given:
        return ast.unparse(given["default"])
    if "default_factory" in given:
        return f"{ast.unparse(given['default_factory'])}()"
    return None


def _default_text(field: Field) -> str:
    return f" = {field.default}" if field.default is not None else ""


def _longest_common_order(before: Sequence[str], after: Sequence[str]) -> set[str]:
    """The largest set of names that keep their relative order (an LCS); the rest moved."""
    n, m = len(before), len(after)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            table[i][j] = (
                table[i + 1][j + 1] + 1
                if before[i] == after[j]
                else max(table[i + 1][j], table[i][j + 1])
            )
    kept, i, j = set(), 0, 0
    while i < n and j < m:
        if before[i] == after[j]:
            kept.add(before[i])
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return kept


def _type_rule(old: FieldType, new: FieldType) -> str | None:
    if old == new:
        return None
    if old.kind == new.kind == Kind.LITERAL and old.optional == new.optional:
        if set(new.choices) > set(old.choices):
            return "FIELD_CHOICES_ADDED"
        if set(new.choices) < set(old.choices):
            return "FIELD_CHOICES_REMOVED"
    if not old.optional and new.optional and old == FieldType(**{**vars(new), "optional": False}):
        return "FIELD_TYPE_WIDENED"
    return "FIELD_TYPE_CHANGED"


def _widens(old: SchemaArg, new: SchemaArg) -> bool:
    """``T`` -> ``T?``: every value the old slot took, the new one takes."""
    return old.name == new.name and new.type == old.type + "?" and new.default == old.default


class _BundleComparison:
    """One bundle on both sides: field findings first, then slot changes they leave unexplained."""

    def __init__(self, old: Bundle, new: Bundle, old_schema: Schema, new_schema: Schema) -> None:
        self.old, self.new = old, new
        self.old_schema, self.new_schema = old_schema, new_schema
        self.old_args = {a.name: a for a in old_schema.args}
        self.new_args = {a.name: a for a in new_schema.args}
        self.old_names = [f.name for f in old.fields]
        self.new_names = [f.name for f in new.fields]
        # Fields whose slot changes a field finding explains.
        self.explained: set[str] = set()

    # The schema arguments a field owns (the IR names its slots), as each side wrote them.
    def _old_slots(self, name: str) -> list[SchemaArg]:
        field = self.old.field(name)
        slots = [s.name for s in field.slots] if field else []
        return [self.old_args[s] for s in slots if s in self.old_args]

    def _new_slots(self, name: str) -> list[SchemaArg]:
        field = self.new.field(name)
        slots = [s.name for s in field.slots] if field else []
        return [self.new_args[s] for s in slots if s in self.new_args]

    def _subject(self, name: str) -> str:
        return f"{self.new.name}.{name}"

    @staticmethod
    def _placed(slots: list[SchemaArg], schema: Schema, other: dict[str, SchemaArg]) -> str:
        """Where ``slots`` sit in ``schema`` and how many slots of the other side follow."""
        names = [a.name for a in schema.args]
        first = names.index(slots[0].name)
        shifted = sum(1 for n in names[first + len(slots) :] if n in other)
        where = f"at slot index {first}"
        return where + (f", shifting the {shifted} slot(s) after it" if shifted else ", last")

    def findings(self) -> list[Finding]:
        found: list[Finding] = []
        if self.old.name != self.new.name:
            found.append(self._renamed())
        common = [n for n in self.new_names if n in self.old_names]
        kept = _longest_common_order([n for n in self.old_names if n in common], common)
        for name in self.old_names:
            if name not in self.new_names:
                found.append(self._removed(name))
        for name in self.new_names:
            if name not in self.old_names:
                found.append(self._added(name))
        for name in common:
            old, new = self.old.field(name), self.new.field(name)
            assert old is not None and new is not None
            rule = _type_rule(old.type, new.type)
            if rule is not None:
                found.append(self._retyped(rule, old, new))
            if name not in kept:
                found.append(self._moved(name))
            default = self._default(old, new)
            if default is not None:
                found.append(default)
        return found + self._unexplained_slots()

    def _renamed(self) -> Finding:
        gone = _breaks(f"code naming `{self.old.name}` finds no such class")
        return Finding(
            "BUNDLE_RENAMED",
            self.new.qualname,
            f"`{self.old.name}` -> `{self.new.name}`",
            _verdicts(gone, gone, *[_ok("schemas do not name the bundle")] * 2),
        )

    def _position(self, names: list[str], name: str) -> str:
        return f"position {names.index(name) + 1} of {len(names)}"

    def _added(self, name: str) -> Finding:
        field = self.new.field(name)
        assert field is not None
        self.explained.add(name)
        default = default_value(field)
        defaulted = default is not None
        index = self.new_names.index(name)
        later_old = [n for n in self.new_names[index + 1 :] if n in self.old_names]
        if not defaulted:
            keyword = _breaks(f"no default: `{self.new.name}(...)` without `{name}=` raises")
        else:
            keyword = _ok(f"it has a default (`{default}`)")
        if later_old:
            positional = _breaks(
                f"inserted before `{later_old[0]}`: positional arguments from there on fill "
                "the wrong fields"
            )
        elif not defaulted:
            positional = _breaks("appended without a default: the old positional calls lack it")
        else:
            positional = _ok("appended after every existing field, with a default")
        slots = self._new_slots(name)
        if not slots:
            compiled = exported = _ok("it adds no schema slot (its value must be None)")
        else:
            compiled = _breaks(
                f"new slot(s) {_slots_text(slots)} "
                f"{self._placed(slots, self.new_schema, self.old_args)}: a saved graph passes "
                "the old slot list by position"
            )
            missing = [a for a in slots if a.default is None]
            exported = (
                _breaks(
                    f"no schema default for {_names(missing)}: loading a saved program "
                    "finds no value for it"
                )
                if missing
                else _ok("every new slot has a schema default, which loading fills in")
            )
        return Finding(
            "FIELD_ADDED",
            self._subject(name),
            f"`{name}: {field.annotation}{_default_text(field)}` added at "
            f"{self._position(self.new_names, name)}",
            _verdicts(keyword, positional, compiled, exported),
        )

    def _removed(self, name: str) -> Finding:
        field = self.old.field(name)
        assert field is not None
        self.explained.add(name)
        index = self.old_names.index(name)
        later = [n for n in self.old_names[index + 1 :] if n in self.new_names]
        keyword = _breaks(f"`{self.new.name}({name}=...)` raises (no such field)")
        positional = _breaks(
            f"positional arguments from `{later[0]}` on fill the wrong fields"
            if later
            else "a positional call that passes it has one argument too many"
        )
        slots = self._old_slots(name)
        if not slots:
            compiled = exported = _ok("it had no schema slot")
        else:
            compiled = _breaks(
                f"slot(s) {_slots_text(slots)} removed from "
                f"{self._placed(slots, self.old_schema, self.new_args).removeprefix('at ')}: "
                "a saved graph passes the old slot list by position"
            )
            exported = _breaks(
                f"loading a saved program drops its {_names(slots)} silently: the op runs "
                "without what it was traced with"
            )
        return Finding(
            "FIELD_REMOVED",
            f"{self.new.name}.{name}",
            f"`{name}: {field.annotation}` removed from {self._position(self.old_names, name)}",
            _verdicts(keyword, positional, compiled, exported),
        )

    def _retyped(self, rule: str, old: Field, new: Field) -> Finding:
        self.explained.add(new.name)
        before, after = self._old_slots(old.name), self._new_slots(new.name)
        kinds = (
            f"kind {old.type.kind.value} -> {new.type.kind.value}"
            if old.type.kind != new.type.kind
            else f"kind {new.type.kind.value}"
        )
        summary = f"`{old.annotation}` -> `{new.annotation}` ({kinds})"
        if old.annotation == new.annotation:
            summary = (
                f"`{new.annotation}`: {kinds}, from the configuration (the annotation is unchanged)"
            )
        if rule == "FIELD_CHOICES_ADDED":
            extra = sorted(set(new.type.choices) - set(old.type.choices))
            summary = f"`{new.annotation}` also accepts {', '.join(map(repr, extra))}"
            ok = _ok("every choice valid before still is")
            return Finding(rule, self._subject(new.name), summary, _verdicts(ok, ok, ok, ok))
        if rule == "FIELD_CHOICES_REMOVED":
            gone = ", ".join(map(repr, sorted(set(old.type.choices) - set(new.type.choices))))
            summary = f"`{new.annotation}` no longer accepts {gone}"
            callers = _breaks(f"a caller passing {gone} is refused")
            refused = f"traced with {gone} holds it as a constant, which the op now refuses"
            return Finding(
                rule,
                self._subject(new.name),
                summary,
                _verdicts(
                    callers, callers, _breaks(f"a graph {refused}"), _breaks(f"a program {refused}")
                ),
            )
        if rule == "FIELD_TYPE_WIDENED":
            callers = _ok("every value valid before is still valid")
        else:
            callers = _breaks("values built for the old type are refused or mean something else")
        if before == after:
            slot_verdict = (
                _ok("its slots are unchanged")
                if rule == "FIELD_TYPE_WIDENED"
                else _breaks(
                    f"its slots still read {_slots_text(after)}, but a value of the old type "
                    "fails the new field's check"
                )
            )
            compiled = exported = slot_verdict
        elif len(before) == len(after) and all(map(_widens, before, after)):
            compiled = exported = _ok(
                f"{_slots_text(before)} -> {_slots_text(after)}: the op still takes what was "
                "passed before"
            )
        else:
            change = f"{_slots_text(before)} -> {_slots_text(after)}"
            compiled = _breaks(f"{change}: a saved graph passes the old slots by position")
            exported = _breaks(f"{change}: a saved program's arguments no longer fit")
        return Finding(
            rule, self._subject(new.name), summary, _verdicts(callers, callers, compiled, exported)
        )

    def _moved(self, name: str) -> Finding:
        self.explained.add(name)
        slots = self._new_slots(name)
        if slots:
            first = slots[0].name
            was = next((i for i, a in enumerate(self.old_schema.args) if a.name == first), None)
            now = [a.name for a in self.new_schema.args].index(first)
            place = f" from slot index {was} to {now}" if was is not None else ""
            compiled = _breaks(
                f"{_names(slots)} moved{place}: a saved graph passes slots by position, so "
                "values land in the wrong slots"
            )
            exported = _ok("a saved program's arguments are matched by name on load")
        else:
            compiled = exported = _ok("it has no schema slot")
        return Finding(
            "FIELD_MOVED",
            self._subject(name),
            f"`{name}` moved from {self._position(self.old_names, name)} to "
            f"{self._position(self.new_names, name)}",
            _verdicts(
                _ok("keywords do not depend on order"),
                _breaks("positional arguments fill the wrong fields"),
                compiled,
                exported,
            ),
        )

    def _default(self, old: Field, new: Field) -> Finding | None:
        was, now = default_value(old), default_value(new)
        if was == now:
            return None
        if was is None:
            rule, summary = "FIELD_DEFAULT_ADDED", f"`{new.name}` now defaults to `{now}`"
            callers = _ok("every caller passed it before")
        elif now is None:
            rule, summary = "FIELD_DEFAULT_REMOVED", f"`{new.name}` lost its default `{was}`"
            callers = _breaks(f"a caller that leaves `{new.name}` out now raises")
        else:
            rule = "FIELD_DEFAULT_CHANGED"
            summary = f"`{new.name}` defaults to `{now}`, was `{was}`"
            callers = _breaks(f"a caller that leaves `{new.name}` out now gets `{now}`, silently")
        return Finding(
            rule,
            self._subject(new.name),
            summary,
            _verdicts(callers, callers, *[_NO_SLOT_CHANGE] * 2),
        )

    def _owner(self, slot: str) -> str | None:
        for bundle in (self.new, self.old):
            for field in bundle.fields:
                if any(s.name == slot for s in field.slots):
                    return field.name
        return None

    def _unexplained_slots(self) -> list[Finding]:
        """Slot changes no field finding explains: the configuration's or the templates'."""
        found: list[Finding] = []
        old_order = [a.name for a in self.old_schema.args]
        new_order = [a.name for a in self.new_schema.args]
        common = [n for n in new_order if n in self.old_args]
        kept = _longest_common_order([n for n in old_order if n in common], common)
        schema = self.new_schema.qualname

        def slot_finding(rule: str, slot: str, summary: str, compiled: Verdict, exported: Verdict):
            owner = self._owner(slot)
            where = f" (field `{owner}`)" if owner else ""
            found.append(
                Finding(
                    rule,
                    f"{schema}: {slot}",
                    summary + where,
                    _verdicts(_BUNDLE_UNCHANGED, _BUNDLE_UNCHANGED, compiled, exported),
                )
            )

        def unexplained(slot: str) -> bool:
            return self._owner(slot) not in self.explained

        positional = "a saved graph passes the old slot list by position"
        for name in old_order:
            if name not in self.new_args and unexplained(name):
                slot_finding(
                    "SLOT_REMOVED",
                    name,
                    f"slot `{self.old_args[name]}` removed",
                    _breaks(positional),
                    _breaks(f"loading a saved program drops its `{name}` silently"),
                )
        for name in new_order:
            arg = self.new_args[name]
            if name not in self.old_args:
                if unexplained(name):
                    slot_finding(
                        "SLOT_ADDED",
                        name,
                        f"slot `{arg}` added",
                        _breaks(positional),
                        _ok("it has a schema default, which loading fills in")
                        if arg.default is not None
                        else _breaks(f"no schema default for `{name}`: a saved program lacks it"),
                    )
                continue
            old = self.old_args[name]
            if old.type != arg.type and unexplained(name):
                widened = _widens(old, arg)
                slot_finding(
                    "SLOT_TYPE_CHANGED",
                    name,
                    f"slot `{old}` -> `{arg}`",
                    _ok("the op still takes what was passed before")
                    if widened
                    else _breaks(positional),
                    _ok("the op still takes what was passed before")
                    if widened
                    else _breaks("a saved program's argument no longer fits"),
                )
            if old.default != arg.default and unexplained(name):
                slot_finding(
                    "SLOT_DEFAULT_CHANGED",
                    name,
                    f"slot `{old}` -> `{arg}`",
                    _ok("a saved graph passes every slot"),
                    _ok("loading now fills a missing argument in")
                    if old.default is None
                    else _breaks(
                        f"a saved program that left `{name}` out now gets "
                        f"{arg.default or 'no value'}"
                    ),
                )
            if name not in kept and unexplained(name):
                slot_finding(
                    "SLOT_MOVED",
                    name,
                    f"slot `{arg}` moved",
                    _breaks(
                        "a saved graph passes slots by position: values land in the wrong slots"
                    ),
                    _ok("a saved program's arguments are matched by name on load"),
                )
        old_returns, new_returns = self.old_schema.returns, self.new_schema.returns
        if old_returns != new_returns:
            found.append(
                Finding(
                    "SCHEMA_RETURNS_CHANGED",
                    schema,
                    f"returns `{old_returns}` -> `{new_returns}`",
                    _verdicts(
                        _BUNDLE_UNCHANGED,
                        _BUNDLE_UNCHANGED,
                        _breaks("a saved graph reads the old return type"),
                        _breaks("a saved program reads the old return type"),
                    ),
                )
            )
        if (
            not found
            and not self.explained
            and self.old_schema.text != self.new_schema.text
            and self.old_schema.args == self.new_schema.args
        ):
            same = _ok("the schema parses to the same arguments")
            found.append(
                Finding(
                    "SCHEMA_TEXT_CHANGED",
                    schema,
                    "the schema text changed; its arguments did not",
                    _verdicts(same, same, same, same),
                )
            )
        return found
