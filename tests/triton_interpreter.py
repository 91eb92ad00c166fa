"""Running a test module's checks under Triton's interpreter, in a fresh Python.

``TRITON_INTERPRET=1`` runs the Triton kernels on CPU tensors (the kernels' CPU tests);
it must be set before Triton is imported, and once ``torch.compile`` has run in a
process Triton 3.9's interpreter refuses nested ``@jit`` helpers. So each check runs
in a child process, from the repository root.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELUDE = "import sys, warnings; warnings.simplefilter('ignore')\n"


def run_interpreted(
    code: str, test_file: str | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """``code`` in a new Python under ``TRITON_INTERPRET=1``; with ``test_file``, that
    test module imported first as ``t`` (its folder on ``sys.path``)."""
    prelude = PRELUDE
    if test_file is not None:
        path = Path(test_file)
        prelude += f"sys.path.insert(0, {str(path.parent)!r})\nimport {path.stem} as t\n"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


def assert_interpreted(test_file: str, checks: str, count: str | None = None) -> str:
    """Run ``checks`` (code that sets ``failures``, a list of lines, and may set the
    name ``count`` names) in the interpreter's child; fail with its output unless the
    list is empty. Returns the child's output, which ends ``<count> cases`` where
    ``count`` is given."""
    code = checks + "\nprint('\\n'.join(failures))\n"
    if count is not None:
        code += f"print({count}, 'cases')\n"
    code += "sys.exit(1 if failures else 0)\n"
    out = run_interpreted(code, test_file)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout
