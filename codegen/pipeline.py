"""Sources -> rendered, formatted files, entirely in memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import FORMAT_VERSION, emit, exports, render, safety, te_layout
from .config import Config
from .errors import CodegenError, Location
from .model import Bundle, SourceModule
from .parsing import decode_source
from .reader import read_source
from .sources import select as select_sources

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"


@dataclass(frozen=True)
class Generated:
    modules: tuple[SourceModule, ...]
    files: dict[str, str]  # repo-relative path -> text


def read_all(config: Config, sources: list[str] | None = None) -> tuple[SourceModule, ...]:
    """Read every op module (sorted, so input order never matters); check paths and names.

    ``sources`` (``--source``) replaces the configured entries; either may hold patterns."""
    source_root = config.reading.source_root or config.root
    paths = select_sources(config, sources)
    safety.check_output_names(paths)
    modules = []
    for rel in paths:
        path = source_root / rel
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CodegenError(
                Location(rel, 1, 1),
                f"cannot read the op module: {exc.strerror}",
                "fix `sources` in [tool.transformer_engine_ops.codegen]"
                + (
                    f" (read under source_root {source_root})" if source_root != config.root else ""
                ),
            ) from None
        modules.append(read_source(rel, decode_source(rel, data), config, source_root))
    seen: dict[str, SourceModule] = {}
    for module in modules:
        for op in module.ops:
            if not safety.is_identifier(op.name):
                raise CodegenError(
                    op.location,
                    f"op name {op.name!r} is not an ASCII identifier",
                    "name the op with ASCII letters, digits and `_`",
                )
            first = seen.get(op.name)
            if first is not None:
                raise CodegenError(
                    op.location,
                    f"duplicate op name `{op.name}`",
                    f"it is already declared at {first.ops[0].location}; op names are unique "
                    f"in the `{config.namespace}` namespace",
                )
            seen[op.name] = module
    return tuple(modules)


def generate(config: Config, sources: list[str] | None = None) -> Generated:
    modules = read_all(config, sources)
    env = render.environment(TEMPLATE_DIR)
    out = config.output_dir
    python: dict[str, str] = {}
    contexts = []
    for module in modules:
        ctx = emit.op_module_context(module, config)
        contexts.append((module, ctx))
        stem = module.path.rsplit("/", 1)[-1]
        code = env.get_template("op_module.py.j2").render(ctx)
        safety.check_generated_names(module, code)
        python[f"{out}/{stem}"] = code
    if config.reading.te_layout is not None:
        for module, path, code in te_layout.render_modules(modules, config, env, out):
            if path in python:
                raise CodegenError(
                    Location(module.path, 1, 1),
                    f"its TE-layout output `{path}` is also another op module's output",
                    "give op modules names that do not start with `te_`",
                )
            safety.check_generated_names(module, code)
            python[path] = code
    python[f"{out}/__init__.py"] = env.get_template("package_init.py.j2").render(
        format_version=FORMAT_VERSION,
        module_names=[m.path.rsplit("/", 1)[-1].removesuffix(".py") for m in modules],
    )
    if config.exports is not None:
        python.update(_export_files(config, env))
    files = render.format_python(python)
    files[f"{out}/SCHEMAS.md"] = env.get_template("schemas.md.j2").render(
        emit.schemas_doc_context(contexts)
    )
    if config.reading.te_layout is not None:
        files[f"{out}/TE_LAYOUT.md"] = te_layout.layout_doc(modules, config, env)
    return Generated(modules, dict(sorted(files.items())))


def _export_files(config: Config, env) -> dict[str, str]:
    """The typing imports and subpackage ``__init__.py`` files from the export list."""
    assert config.exports is not None
    source = config.exports.source
    try:
        data = (config.root / source).read_bytes()
    except OSError as exc:
        raise CodegenError(
            Location(source, 1, 1),
            f"cannot read the export list: {exc.strerror}",
            "fix `exports.source` in [tool.transformer_engine_ops.codegen]",
        ) from None
    listed = exports.read(source, decode_source(source, data))
    return exports.render(source, listed, config.exports.subpackages, env, FORMAT_VERSION)


def find_bundle(modules: tuple[SourceModule, ...], name: str) -> Bundle | None:
    for module in modules:
        for op in module.ops:
            for bundle in (op.forward, op.backward):
                if name in (bundle.name, bundle.qualname):
                    return bundle
    return None
