"""A second checkout imports its own generated code, never another install's.

The generated modules live inside the package (``transformer_engine_ops/generated``), so
running from a checkout's root resolves every ``transformer_engine_ops.*`` module,
generated ones included, to that checkout, even with another checkout installed in
editable mode in the same environment (as this repository is in ``.venv``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from codegen_support import REPO_ROOT


def test_a_second_checkout_imports_its_own_generated_modules(tmp_path: Path) -> None:
    clone = tmp_path / "second-clone"
    shutil.copytree(
        REPO_ROOT / "transformer_engine_ops",
        clone / "transformer_engine_ops",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    marker = "# second clone's own copy\n"
    generated = clone / "transformer_engine_ops" / "generated" / "linear.py"
    generated.write_text(generated.read_text(encoding="utf-8") + marker, encoding="utf-8")
    probe = (
        "import transformer_engine_ops.generated.linear as g, pathlib; "
        "print(pathlib.Path(g.__file__).resolve())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    imported = Path(done.stdout.strip())
    assert imported == generated.resolve()
    assert imported.read_text(encoding="utf-8").endswith(marker)
