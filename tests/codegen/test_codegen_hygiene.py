"""Import hygiene both ways: the runtime never derives a schema, the generator never
imports torch or the code it reads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from codegen_support import REPO_ROOT, subprocess_env

# Runs in a fresh interpreter: torch first, then every schema-deriving function is
# trapped and the generator's dependencies are made unimportable.
IMPORT_GENERATED = textwrap.dedent(
    """
    import sys

    import torch
    import torch._library.infer_schema
    import torch.library

    BLOCKED = ("libcst", "jinja2", "codegen")
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, f"loaded before the test could block them: {loaded}"
    for name in BLOCKED:
        sys.modules[name] = None  # any `import name` now raises ImportError

    import dataclasses
    import inspect
    import typing

    calls = []
    exempt = []

    def trap(name, real):
        def trapped(*args, **kwargs):
            caller = sys._getframe(1)
            where = f"{name} from {caller.f_code.co_filename}:{caller.f_lineno}"
            if (
                name == "inspect.signature"
                and caller.f_globals.get("__name__") == "dataclasses"
                and caller.f_code.co_name == "_process_class"
            ):
                # @dataclass on a class without a docstring writes one from the
                # signature: the stdlib documenting a class, not a schema derived.
                exempt.append(where)
                return real(*args, **kwargs)
            calls.append(where)
            raise AssertionError(f"{name} was called while importing generated code")

        return trapped

    typing.get_type_hints = trap("typing.get_type_hints", typing.get_type_hints)
    dataclasses.fields = trap("dataclasses.fields", dataclasses.fields)
    inspect.signature = trap("inspect.signature", inspect.signature)
    torch.library.infer_schema = trap("torch.library.infer_schema", None)
    torch._library.infer_schema.infer_schema = trap("torch._library...infer_schema", None)

    import transformer_engine_ops.generated.linear as generated

    assert generated.FORWARD_SCHEMA.startswith("("), generated.FORWARD_SCHEMA
    assert not calls, calls
    leaked = sorted(
        m for m in sys.modules if m.split(".")[0] in BLOCKED and sys.modules[m] is not None
    )
    assert not leaked, leaked
    print("imported", generated.__name__, "with", len(generated.FORWARD_SLOTS), "slots")
    """
)


def test_importing_generated_code_derives_no_schema(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_GENERATED],
        cwd=tmp_path,  # outside the repo: the installed (editable) package is what imports
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "imported transformer_engine_ops.generated.linear" in result.stdout


RUN_WITHOUT_TORCH = textwrap.dedent(
    """
    import sys

    for name in ("torch", "transformer_engine_ops"):
        sys.modules[name] = None  # unimportable: the generator must not need them

    from codegen.cli import main

    rc = main(sys.argv[1:])
    imported = sorted(
        m for m in sys.modules
        if m.split(".")[0] in ("torch", "transformer_engine_ops") and sys.modules[m] is not None
    )
    assert not imported, imported
    sys.exit(rc)
    """
)


def test_generator_runs_with_torch_unimportable(repo: Path) -> None:
    for mode in ("--check", "--diff"):
        result = subprocess.run(
            [sys.executable, "-c", RUN_WITHOUT_TORCH, "--root", str(repo), mode],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "up to date" in result.stdout


def test_generator_explains_a_bundle_with_torch_unimportable(repo: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_TORCH, "--root", str(repo), "explain", "LinearFwdArgs"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "activation_dtype" in result.stdout
