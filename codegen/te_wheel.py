"""Fetch Transformer Engine's pure-Python wheel into a cache outside git, and unpack it.

``python -m codegen.te_wheel`` (what ``make te-boundary`` runs first) makes sure
``~/.cache/teops/transformer_engine-<version>/`` holds TE's Python sources exactly as
the wheel ships them, and prints that folder. The generator only reads these files;
nothing here or anywhere else imports ``transformer_engine``.

The cache folder can be moved with ``TEOPS_CACHE``; the example configuration
(``examples/te_2_20/pyproject.toml``) reads ``$TEOPS_CACHE`` too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

TE_VERSION = "2.20.2"
WHEEL = f"transformer_engine-{TE_VERSION}-py3-none-any.whl"
DEFAULT_CACHE = "~/.cache/teops"


class FetchError(Exception):
    """The wheel could not be downloaded or unpacked (no network, no pip)."""


def cache_dir() -> Path:
    return Path(os.path.expanduser(os.environ.get("TEOPS_CACHE", DEFAULT_CACHE)))


def source_dir(cache: Path | None = None) -> Path:
    """Where the unpacked sources live (whether or not they are there yet)."""
    return (cache or cache_dir()) / f"transformer_engine-{TE_VERSION}"


def ensure_source(cache: Path | None = None, quiet: bool = True) -> Path:
    """Download (once) and unpack (once) the wheel; return the unpacked source folder."""
    cache = cache or cache_dir()
    target = source_dir(cache)
    marker = target / ".complete"
    if marker.is_file():
        return target
    wheel = cache / WHEEL
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check"]
        cmd += [*(["-q"] if quiet else []), f"transformer-engine=={TE_VERSION}"]
        cmd += ["--no-deps", "--only-binary=:all:", "-d", str(cache)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not wheel.is_file():
            raise FetchError(
                f"could not download transformer-engine=={TE_VERSION} with pip "
                f"(exit {done.returncode}): {done.stderr.strip()[-400:]}"
            )
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [
                n
                for n in archive.namelist()
                if n.startswith("transformer_engine/") and n.endswith(".py")
            ]
            for name in names:  # only .py members under the package: no path escapes
                if ".." in Path(name).parts:
                    raise FetchError(f"{wheel}: unexpected member {name!r}")
            archive.extractall(target, members=names)
    except (OSError, zipfile.BadZipFile) as exc:
        raise FetchError(f"could not unpack {wheel}: {exc}") from exc
    marker.write_text(f"{WHEEL}\n", encoding="utf-8")
    return target


def main() -> int:
    try:
        print(ensure_source(quiet=False))
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
