"""Lay contexts out with Jinja2 and format Python with the pinned ruff."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2

RUFF_VERSION = "0.14.0"  # pinned: a formatter change must not drift generated code
# --no-cache: ruff would otherwise leave a .ruff_cache in the working directory.
_RUFF_OPTIONS = ("--isolated", "--no-cache", "--line-length=100", "--target-version=py310")


class FormatterError(Exception):
    pass


def environment(template_dir: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _ruff() -> list[str]:
    return [sys.executable, "-m", "ruff"]


def check_formatter() -> None:
    try:
        out = subprocess.run([*_ruff(), "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise FormatterError(
            f"ruff {RUFF_VERSION} is needed to format generated code ({exc}); "
            f"install it with `pip install ruff=={RUFF_VERSION}`"
        ) from exc
    version = out.stdout.split()[-1]
    if version != RUFF_VERSION:
        raise FormatterError(
            f"generated code is formatted with ruff {RUFF_VERSION}, found {version}; "
            f"run `pip install ruff=={RUFF_VERSION}` (or `make .venv`)"
        )


def format_python(sources: dict[str, str]) -> dict[str, str]:
    """Format many Python texts with one ruff run; keys are relative file names.

    The texts are formatted in a private temporary folder under names of its own
    (``0.py``, ``1.py``, ...), so no key, whatever it holds, decides where a file lands,
    and nothing is written into the project.
    """
    if not sources:
        return {}
    check_formatter()
    names = sorted(sources)
    with tempfile.TemporaryDirectory(prefix="codegen-format-") as tmp:
        root = Path(tmp)
        for i, name in enumerate(names):
            (root / f"{i}.py").write_text(sources[name], encoding="utf-8")
        done = subprocess.run(
            [*_ruff(), "format", *_RUFF_OPTIONS, "--quiet", "."],
            capture_output=True,
            text=True,
            cwd=root,
        )
        if done.returncode != 0:
            stderr = re.sub(
                r"\b(\d+)\.py\b",
                lambda m: names[int(m[1])] if int(m[1]) < len(names) else m[0],
                done.stderr.strip(),
            )
            raise FormatterError(
                "ruff could not format the generated code (a template bug):\n" + stderr
            )
        return {
            name: (root / f"{i}.py").read_text(encoding="utf-8") for i, name in enumerate(names)
        }
