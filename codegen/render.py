"""Lay contexts out with Jinja2 and format Python with the pinned ruff."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2

RUFF_VERSION = "0.14.0"  # pinned: a formatter change must not drift generated code
_RUFF_OPTIONS = ("--isolated", "--line-length=100", "--target-version=py310")


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


def template_texts(template_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(template_dir.glob("*.j2"))}


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
    """Format many Python texts with one ruff run; keys are relative file names."""
    if not sources:
        return {}
    check_formatter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, text in sources.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text, encoding="utf-8")
        done = subprocess.run(
            [*_ruff(), "format", *_RUFF_OPTIONS, "--quiet", str(root)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise FormatterError(
                "ruff could not format the generated code (a template bug):\n" + done.stderr.strip()
            )
        return {name: (root / name).read_text(encoding="utf-8") for name in sources}
