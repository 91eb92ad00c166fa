"""Generator configuration, read from ``[tool.transformer_engine_ops.codegen]``.

The qualified names that mean "quantizer", "tensor-or-quantized", "process
group" and "value type" are configuration, so the same generator reads another
codebase's bundles (TE's own, say) without a code change.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from .errors import ConfigError
from .safety import is_dotted_name, is_identifier, output_dir_problem, setting_error

CONFIG_TABLE = ("tool", "transformer_engine_ops", "codegen")
CONFIGURABLE_KINDS = ("tensor_or_quantized", "quantizer", "process_group", "value", "unsupported")


@dataclass(frozen=True)
class Exports:
    source: str  # "pkg/__init__.py", relative to the project root
    subpackages: tuple[str, ...] = ()


@dataclass(frozen=True)
class Config:
    root: Path
    namespace: str
    sources: tuple[str, ...]
    output_dir: str
    meta_type: str
    kinds: dict[str, str]  # qualified name -> configurable kind
    # Reading other codebases (TE's own source): see `load_reading`.
    reading: Reading = field(default_factory=lambda: Reading())
    # The package's export list (``exports.source``, holding ``_EXPORTS``) and the
    # subpackages whose ``__init__.py`` follows from it; None: no export files are written.
    exports: Exports | None = None

    def kind_of(self, qualname: str) -> str | None:
        return self.kinds.get(qualname)


def _read_config(root: Path, confine_to: Path | None = None) -> Config:
    pyproject = root / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{pyproject}: cannot read the generator config: {exc}") from exc
    table: object = data
    for depth, key in enumerate(CONFIG_TABLE):
        table = table.get(key, {})  # type: ignore[union-attr]
        if not isinstance(table, dict):
            where = ".".join(CONFIG_TABLE[: depth + 1])
            raise ConfigError(
                f"{pyproject}: {where} must be a table ([{where}]), got {_toml(table)}"
            )
    if not table:
        raise ConfigError(f"{pyproject}: missing [{'.'.join(CONFIG_TABLE)}] table")
    assert isinstance(table, dict)
    where = f"[{'.'.join(CONFIG_TABLE)}]"
    try:
        kinds: dict[str, str] = {}
        configured = _expect(table["kinds"], dict, f"{where} kinds", pyproject)
        for kind, names in configured.items():  # type: ignore[attr-defined]
            if kind not in CONFIGURABLE_KINDS:
                raise ConfigError(
                    f"{pyproject}: unknown kind {kind!r} in kinds; "
                    f"expected one of {', '.join(CONFIGURABLE_KINDS)}"
                )
            for name in _strings(names, f"{where} kinds.{kind}", pyproject):
                kinds[name] = kind
        return Config(
            root=root,
            namespace=table["namespace"],
            sources=_strings(table["sources"], f"{where} sources", pyproject),
            output_dir=table["output_dir"],
            meta_type=table["meta_type"],
            kinds=kinds,
            reading=load_reading(table, root, pyproject, confine_to),
            exports=_read_exports(table.get("exports"), f"{where} exports", pyproject),
        )
    except KeyError as exc:
        raise ConfigError(f"{pyproject}: generator config lacks key {exc}") from exc


def _read_exports(value: object, where: str, pyproject: Path) -> Exports | None:
    """``exports = { source = "pkg/__init__.py", subpackages = ["modules"] }``, checked."""
    if value is None:
        return None
    table = _expect(value, dict, where, pyproject)
    unknown = sorted(set(table) - {"source", "subpackages"})  # type: ignore[arg-type]
    if unknown:
        raise ConfigError(
            f"{pyproject}: unknown key {unknown[0]!r} in {where}; expected source, subpackages"
        )
    source = table.get("source")  # type: ignore[attr-defined]
    parts = source.split("/") if isinstance(source, str) else []
    if len(parts) < 2 or parts[-1] != "__init__.py" or not all(map(is_identifier, parts[:-1])):
        raise ConfigError(
            f"{pyproject}: {where}.source = {_toml(source)}: give the package's __init__.py "
            'relative to the project root, through identifier folders (e.g. "pkg/__init__.py")'
        )
    subpackages = _strings(table.get("subpackages", []), f"{where}.subpackages", pyproject)  # type: ignore[attr-defined]
    for sub in subpackages:
        if not is_identifier(sub):
            raise ConfigError(
                f"{pyproject}: {where}.subpackages entry {_toml(sub)}: not an identifier; "
                'name a subpackage of the package (e.g. "modules")'
            )
    return Exports(source, tuple(subpackages))


def load_config(root: Path, confine_to: Path | None = None) -> Config:
    """Read the settings and reject any that would reach generated code or paths unchecked.

    ``confine_to``: the folder an untrusted copy of a project lies in (a revision under
    review). Its configuration is data: ``source_root`` is not expanded (no environment
    variable, no ``~``) and must lie inside ``confine_to``, a ``sources`` entry may not
    climb out with ``..`` or be absolute, and a pattern may hold one ``**`` at most
    (several make glob's work grow as a power of the folder depth); checked before any
    path is looked at.
    """
    config = _read_config(root, confine_to)
    pyproject = root / "pyproject.toml"
    if confine_to is not None:
        for entry in config.sources:
            if not isinstance(entry, str):
                continue  # _check_settings names it
            if entry.startswith("/") or ".." in entry.split("/"):
                raise ConfigError(
                    f"{pyproject}: sources entry `{entry}` leads out of the revision; a "
                    "revision under review is read from its own files only"
                )
            if entry.split("/").count("**") > 1:
                raise ConfigError(
                    f"{pyproject}: sources entry `{entry}` holds more than one `**`, which "
                    "is not expanded for a revision under review"
                )
    _check_settings(config, pyproject, ".".join(CONFIG_TABLE))
    return config


def _check_settings(config: Config, pyproject: Path, table: str) -> None:
    """Raise ``ConfigError`` naming the setting for any value that is unsafe to use."""

    def fail(key: str, value: object, problem: str) -> ConfigError:
        return setting_error(pyproject, table, key, value, problem)

    if not is_identifier(config.namespace):
        raise fail(
            "namespace",
            config.namespace,
            "not an identifier; ops are registered as `<namespace>::<op>_fwd`, so use "
            'ASCII letters, digits and `_` (e.g. "teops")',
        )
    if not is_dotted_name(config.meta_type):
        raise fail("meta_type", config.meta_type, "not a dotted name of identifiers")
    if not all(isinstance(s, str) for s in config.sources):
        raise fail("sources", list(config.sources), "every entry must be a path string")
    if not config.sources:
        raise fail(
            "sources",
            [],
            "lists no op module; with none, every generated file would be removed as stale",
        )
    problem = output_dir_problem(
        config.root, config.output_dir, config.sources, config.reading.source_root
    )
    if problem:
        raise fail("output_dir", config.output_dir, problem)


# --- Reading another codebase's source as it ships ------------------------------------

# The generator's own declaration keywords, in the order they are documented.
DECLARATION_KEYS = (
    "name",
    "forward",
    "backward",
    "grad_fields",
    "forward_impl",
    "backward_impl",
    "forward_spec",
    "backward_spec",
    "setup_context",
    "lowers",
    "eager_when",
    "plain_call",
    "cudagraph_unsafe",
    "derived",
)
OWN_DECLARATION = "transformer_engine_ops.runtime.declaration.OpDeclaration"


@dataclass(frozen=True)
class DeclarationForm:
    """A call that declares an op: the callee's qualified name and its keywords.

    ``keywords`` maps each of the callee's keyword names to one of DECLARATION_KEYS.
    ``registration`` is False when the callee's impl contracts are not ours (TE's
    ``register_custom_op``): the impls are checked to exist, and only the boundary
    (schemas, flatten/unflatten) is generated.
    """

    callee: str
    keywords: dict[str, str]
    registration: bool = True

    def keyword_for(self, key: str) -> str:
        """The callee's spelling of one of our declaration keys."""
        return next((k for k, v in self.keywords.items() if v == key), key)

    @property
    def short(self) -> str:
        return self.callee.rsplit(".", 1)[-1]


OWN_FORM = DeclarationForm(OWN_DECLARATION, {k: k for k in DECLARATION_KEYS})


@dataclass(frozen=True)
class ConfiguredOp:
    """An op declared in the configuration for a source file that declares none."""

    source: str
    name: str
    forward: str
    backward: str
    grad_fields: tuple[str, ...]


@dataclass(frozen=True)
class TeLayout:
    """Also render every bundle in TE's run-time layout (``te_<module>.py``).

    ``runtime`` is the module whose value bundle and storage helpers the generated
    pack/unpack call (TE's ``dynamo/custom_op``); ``value_bundle_type`` the schema
    type of the value-bundle slots.
    """

    runtime: str
    value_bundle_type: str


@dataclass(frozen=True)
class Reading:
    """Where sources live and how they declare ops; the defaults read this project."""

    source_root: Path | None = None  # None: the project root
    forms: tuple[DeclarationForm, ...] = (OWN_FORM,)
    ops: tuple[ConfiguredOp, ...] = ()
    te_layout: TeLayout | None = None

    def form_for(self, callee: str) -> DeclarationForm | None:
        return next((f for f in self.forms if f.callee == callee), None)

    def op_for(self, source: str) -> ConfiguredOp | None:
        return next((o for o in self.ops if o.source == source), None)


_TOML_TYPES = {dict: "table", list: "list", str: "string", bool: "boolean", int: "integer"}


def _toml(value: object) -> str:
    """A value as TOML spells it, with its type: `"x"` (a string), `5` (an integer)."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    name = _TOML_TYPES.get(type(value), type(value).__name__)
    return f"{text} ({'an' if name[0] in 'aeiou' else 'a'} {name})"


def _expect(value: object, kind: type | tuple[type, ...], what: str, pyproject: Path) -> object:
    if not isinstance(value, kind):
        kinds = (kind,) if isinstance(kind, type) else kind
        names = " or ".join(_TOML_TYPES.get(k, k.__name__) for k in kinds)
        raise ConfigError(f"{pyproject}: {what} must be a {names}, got {_toml(value)}")
    return value


def _strings(value: object, what: str, pyproject: Path) -> tuple[str, ...]:
    _expect(value, list, what, pyproject)
    for item in value:  # type: ignore[attr-defined]
        _expect(item, str, f"each entry of {what}", pyproject)
    return tuple(value)  # type: ignore[arg-type]


def expand_path(raw: str) -> str:
    """``${VAR:-default}``, ``$VAR`` and a leading ``~`` expanded."""
    raw = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m[1]) or m[2], raw)
    return os.path.expanduser(os.path.expandvars(raw))


def _confined_source_root(raw: str, root: Path, pyproject: Path, confine_to: Path) -> Path:
    setting = f"{pyproject}: source_root = {json.dumps(raw, ensure_ascii=False)}"
    if "$" in raw or raw.startswith("~"):
        raise ConfigError(
            f"{setting}: names an environment variable or `~`, which is not expanded for a "
            "revision under review (its configuration does not see the reviewer's environment)"
        )
    source_root = (root / raw).resolve()
    if not source_root.is_relative_to(confine_to.resolve()):
        raise ConfigError(
            f"{setting}: lies outside the revision; a revision under review is read from "
            "its own files only"
        )
    return source_root


def load_reading(
    table: dict, root: Path, pyproject: Path, confine_to: Path | None = None
) -> Reading:
    """The optional keys ``source_root``, ``declaration_forms``, ``ops``, ``te_layout``.

    ``source_root`` (``~`` and ``$VARS`` expanded; relative to the project root) is
    where ``sources`` and the packages they import are found, so a source may live
    outside the project (an unpacked wheel in a cache). Output is always written
    under the project root. With ``confine_to`` (see ``load_config``) it is taken as
    written and must resolve inside that folder.
    """
    where = ".".join(CONFIG_TABLE)
    source_root = None
    if "source_root" in table:
        raw = str(_expect(table["source_root"], str, f"{where}.source_root", pyproject))
        if confine_to is None:
            source_root = (root / expand_path(raw)).resolve()
        else:
            source_root = _confined_source_root(raw, root, pyproject, confine_to)
    forms = [OWN_FORM]
    declared = _expect(
        table.get("declaration_forms", []), list, f"{where}.declaration_forms", pyproject
    )
    for i, entry in enumerate(declared):  # type: ignore[arg-type]
        what = f"{where}.declaration_forms[{i}]"
        _expect(entry, dict, what, pyproject)
        unknown = set(entry) - {"callee", "keywords", "registration"}
        if unknown or "callee" not in entry or "keywords" not in entry:
            raise ConfigError(
                f"{pyproject}: {what} needs `callee` and `keywords` (and optionally "
                f"`registration`); got keys {sorted(entry)}"
            )
        keywords = dict(_expect(entry["keywords"], dict, f"{what}.keywords", pyproject))  # type: ignore[arg-type]
        for theirs, ours in keywords.items():
            if ours not in DECLARATION_KEYS:
                raise ConfigError(
                    f"{pyproject}: {what}.keywords.{theirs} = {ours!r} is not a declaration "
                    f"key; expected one of {', '.join(DECLARATION_KEYS)}"
                )
        mapped = list(keywords.values())
        repeated = sorted({k for k in mapped if mapped.count(k) > 1})
        missing = [k for k in ("name", "forward", "backward", "grad_fields") if k not in mapped]
        if repeated or missing:
            raise ConfigError(
                f"{pyproject}: {what}.keywords must map exactly one keyword to each of "
                f"name, forward, backward, grad_fields (missing: {missing}, repeated: {repeated})"
            )
        registration = entry.get("registration", True)
        _expect(registration, bool, f"{what}.registration", pyproject)
        callee = str(_expect(entry["callee"], str, f"{what}.callee", pyproject))
        if any(f.callee == callee for f in forms):
            raise ConfigError(f"{pyproject}: {what}: callee {callee!r} is configured twice")
        forms.append(DeclarationForm(callee, keywords, bool(registration)))
    ops = []
    sources = table.get("sources", [])
    for i, entry in enumerate(_expect(table.get("ops", []), list, f"{where}.ops", pyproject)):  # type: ignore[arg-type]
        what = f"{where}.ops[{i}]"
        _expect(entry, dict, what, pyproject)
        keys = {"source", "name", "forward", "backward", "grad_fields"}
        if set(entry) != keys:
            raise ConfigError(
                f"{pyproject}: {what} needs exactly the keys {', '.join(sorted(keys))}; "
                f"got {', '.join(sorted(entry))}"
            )
        for key in ("source", "name", "forward", "backward"):
            _expect(entry[key], str, f"{what}.{key}", pyproject)
        if not any(fnmatch.fnmatchcase(entry["source"], pattern) for pattern in sources):
            raise ConfigError(
                f"{pyproject}: {what}.source {entry['source']!r} is not in `sources` "
                "(nor matched by a pattern there)"
            )
        if not is_identifier(entry["name"]):
            raise setting_error(
                pyproject,
                where,
                f"ops[{i}].name",
                entry["name"],
                "not an identifier; the op is registered as `<namespace>::<name>_fwd` and "
                "its generated functions are named after it, so use ASCII letters, digits "
                "and `_`, not a Python keyword",
            )
        if any(o.source == entry["source"] for o in ops):
            raise ConfigError(f"{pyproject}: {what}: a second op for {entry['source']!r}")
        grads = _strings(entry["grad_fields"], f"{what}.grad_fields", pyproject)
        ops.append(
            ConfiguredOp(entry["source"], entry["name"], entry["forward"], entry["backward"], grads)
        )
    te_layout = None
    if "te_layout" in table:
        entry = _expect(table["te_layout"], dict, f"{where}.te_layout", pyproject)
        if set(entry) != {"runtime", "value_bundle_type"}:  # type: ignore[arg-type]
            raise ConfigError(
                f"{pyproject}: {where}.te_layout needs exactly `runtime` and `value_bundle_type`"
            )
        for key in ("runtime", "value_bundle_type"):
            _expect(entry[key], str, f"{where}.te_layout.{key}", pyproject)  # type: ignore[index]
        te_layout = TeLayout(entry["runtime"], entry["value_bundle_type"])  # type: ignore[index]
        _check_te_layout(te_layout, pyproject)
    return Reading(source_root, tuple(forms), tuple(ops), te_layout)


def _check_te_layout(layout: TeLayout, pyproject: Path) -> None:
    """Both settings are pasted into the TE-layout module: ``runtime`` into
    ``from <module> import <name> as _te``, ``value_bundle_type`` into schema string
    literals; a keyword, a quote or a lone name there made code ruff could not parse."""
    table = ".".join(CONFIG_TABLE)
    if not is_dotted_name(layout.runtime) or "." not in layout.runtime:
        raise setting_error(
            pyproject,
            table,
            "te_layout.runtime",
            layout.runtime,
            "not a module's dotted name: the TE-layout module runs `from <package> "
            "import <module> as _te` with it, so write `package.module` in identifiers "
            "that are not Python keywords",
        )
    if not is_dotted_name(layout.value_bundle_type):
        raise setting_error(
            pyproject,
            table,
            "te_layout.value_bundle_type",
            layout.value_bundle_type,
            "not a dotted name of identifiers that are not Python keywords; it is the "
            "schema type of the value-bundle slots, written into schema strings",
        )
