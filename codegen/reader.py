"""Read op modules statically with libcst: bundles, enums and op declarations.

Nothing here imports the code it reads: names resolve statically (names.py), bundles and
declarations are read from the parsed tree (bundle_reader.py, declaration_reader.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst

from .bundle_reader import BundleReader
from .config import Config
from .declaration_reader import configured_op, read_declaration
from .errors import CodegenError, Location
from .model import Op, SourceModule
from .names import (
    ENUM_BASES,
    AmbiguousName,
    Enums,
    Resolver,
    ast_dotted_name,
    ast_module_statements,
    base_names,
    dotted_name,
    module_of,
    module_small_statements,
    module_statements,
    parse_file,
    relative_base,
)


def read_source(
    path: str, text: str, config: Config, source_root: Path | None = None
) -> SourceModule:
    """Read one op module; raise ``CodegenError`` at the first problem.

    ``source_root`` is where the modules it imports are found for static name
    resolution (default: the configured source root, else the project root).
    """
    reading = config.reading
    root = source_root or reading.source_root or config.root
    resolver = Resolver(root, config)
    file = parse_file(path, text, resolver)
    body = file.body
    statements = list(module_statements(body))

    classes = [s for s in statements if isinstance(s, cst.ClassDef)]
    local_enums = frozenset(
        f"{file.module}.{c.name.value}"
        for c in classes
        if any(b in ENUM_BASES for b in base_names(file, c))
    )
    enums = Enums(local_enums, resolver, file.module)
    functions = {s.name.value: s for s in statements if isinstance(s, cst.FunctionDef)}
    read_bundle = BundleReader(file, {c.name.value: c for c in classes}, config, enums)

    ops: list[Op] = []
    for small in module_small_statements(body):
        value = small.value if isinstance(small, cst.Assign | cst.AnnAssign | cst.Expr) else None
        if not isinstance(value, cst.Call):
            continue
        callee = dotted_name(value.func)
        if callee is None or not file.resolves(callee):
            continue
        qualname = file.qualify(callee, value.func)
        try:
            canonical = resolver.canonical(qualname, stop_at=file.module)
        except AmbiguousName:
            canonical = qualname  # not a declaration form: read as written
        form = reading.form_for(qualname) or reading.form_for(canonical)
        if form is None:
            continue
        if ops:
            raise CodegenError(
                file.loc(value),
                f"a second {form.short} in one op module",
                f"move it to its own module (the first is at {ops[0].location})",
            )
        ops.append(read_declaration(file, value, form, read_bundle, functions))
    configured = reading.op_for(path)
    if configured is not None:
        if ops:
            raise CodegenError(
                ops[0].location,
                f"this file declares an op and the configuration declares `{configured.name}` "
                "for it too",
                "remove one of the two declarations",
            )
        ops.append(configured_op(file, configured, read_bundle))
    if not ops:
        raise CodegenError(
            Location(path, 1, 1),
            "no OpDeclaration found in this op module",
            "declare the op: NAME = OpDeclaration(name=..., forward=..., ...)",
        )
    return SourceModule(path, file.module, text, tuple(ops))


def declaration_position(
    path: str, text: str, config: Config, source_root: Path | None = None
) -> tuple[int, int] | None:
    """Where a module declares an op (line, column), or None if it declares none.

    A quick look with Python's ``ast`` (no libcst, no bundle read) that tells op modules
    from helpers among the files a ``sources`` pattern matches or a source's folder
    holds: a module-level call of a configured declaration form, or an op the
    configuration declares for ``path``. Text Python cannot parse counts as an op
    module, so the full read reports it rather than skipping it.
    """
    reading = config.reading
    if reading.op_for(path) is not None:
        return (1, 1)
    if not any(form.short in text for form in reading.forms):
        return None
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return (1, 1)
    module, package = module_of(path)
    local: dict[str, str] = {}
    statements = list(ast_module_statements(tree.body))
    for statement in statements:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                head = alias.name.split(".", 1)[0]
                local[alias.asname or head] = alias.name if alias.asname else head
        elif isinstance(statement, ast.ImportFrom):
            base = statement.module or ""
            if statement.level:
                base = relative_base(package, statement.level, base)
            for alias in statement.names:
                local[alias.asname or alias.name] = f"{base}.{alias.name}"
    resolver = Resolver(source_root or reading.source_root or config.root, config)
    for statement in statements:
        value = getattr(statement, "value", None)
        if not isinstance(statement, ast.Assign | ast.AnnAssign | ast.Expr):
            continue
        if not isinstance(value, ast.Call):
            continue
        dotted = ast_dotted_name(value.func)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        qualname = local.get(head, f"{module}.{head}") + (f".{rest}" if rest else "")
        try:
            canonical = resolver.canonical(qualname)
        except AmbiguousName:
            return (1, 1)  # the full read reports it
        if reading.form_for(qualname) or reading.form_for(canonical):
            return (statement.lineno, statement.col_offset + 1)
    return None
