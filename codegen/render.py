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
        # Not --quiet: it silences the parse errors too, and they are the report.
        done = subprocess.run(
            [*_ruff(), "format", *_RUFF_OPTIONS, "."],
            capture_output=True,
            text=True,
            cwd=root,
        )
        if done.returncode != 0:
            raise FormatterError(
                "ruff could not format the generated code (a template bug):\n"
                + _report(done.stderr, names, sources)
            )
        return {
            name: (root / f"{i}.py").read_text(encoding="utf-8") for i, name in enumerate(names)
        }


_FILE_POSITION = re.compile(r"\b(\d+)\.py\b(?::(\d+):\d+)?")


def _report(stderr: str, names: list[str], sources: dict[str, str]) -> str:
    """ruff's errors with each ``<i>.py`` named as the generated file it stands for, and
    the generated line a parse error points at quoted under it."""
    lines = []
    for line in stderr.strip().splitlines():
        match = _FILE_POSITION.search(line)
        if match is None or int(match[1]) >= len(names):
            lines.append(line)
            continue
        name = names[int(match[1])]
        lines.append(line[: match.start()] + name + line[match.start(1) + len(match[1]) + 3 :])
        code = sources[name].splitlines()
        row = int(match[2] or 0)
        if 0 < row <= len(code):
            lines.append(f"    {code[row - 1].strip()}")
    return "\n".join(lines) or "(ruff said nothing)"
