"""Malformed op modules give one positioned error with a hint, and write nothing.

Each file in corpus/ is one malformed op module whose first line states the expected
report: ``# expect: LINE:COL message fragment``. Files starting with ``_`` are valid
helpers that a case reads alongside (see ``EXTRA_SOURCES``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from codegen_support import CORPUS, OUTPUT_DIR, REPO_ROOT, copy_essentials, snapshot, subprocess_env

EXPECT = re.compile(r"^# expect: (?P<line>\d+):(?P<col>\d+) (?P<fragment>.+)$")
# Cases that need a second module: the error is reported in the case's own file.
EXTRA_SOURCES = {"duplicate_op_name.py": ("_duplicate_op_support.py",)}


@dataclass(frozen=True)
class Case:
    name: str
    line: int
    col: int
    fragment: str

    @property
    def source(self) -> str:
        return f"{CORPUS}/{self.name}"

    def argv(self) -> list[str]:
        extra = [f"{CORPUS}/{name}" for name in EXTRA_SOURCES.get(self.name, ())]
        return [arg for rel in (self.source, *extra) for arg in ("--source", rel)]


def _cases() -> list[Case]:
    cases = []
    for path in sorted((REPO_ROOT / CORPUS).glob("*.py")):
        if path.name.startswith("_"):
            continue
        first = path.read_text(encoding="utf-8").splitlines()[0]
        match = EXPECT.match(first)
        assert match, f"{path.name}: first line must be `# expect: LINE:COL fragment`"
        cases.append(
            Case(path.name, int(match["line"]), int(match["col"]), match["fragment"].strip())
        )
    return cases


CASES = _cases()


def _assert_reported(case: Case, rc: int, out: str, err: str) -> None:
    assert rc == 1, (rc, out, err)
    assert "Traceback" not in out + err
    lines = err.splitlines()
    position = f"{re.escape(case.source)}:{case.line}:{case.col}"
    assert re.match(rf"^{position}: error: ", lines[0]), err
    assert case.fragment in lines[0], err
    assert re.match(r"^  hint: \S", lines[1]), err


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repo copy holding the corpus at its repo-relative path, so reports name it alike."""
    root = copy_essentials(tmp_path_factory.mktemp("corpus"))
    shutil.copytree(REPO_ROOT / CORPUS, root / CORPUS)
    return root


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 18
    assert len({(c.line, c.col, c.fragment) for c in CASES}) >= 18


@pytest.mark.parametrize("case", CASES, ids=[c.name.removesuffix(".py") for c in CASES])
def test_malformed_module_is_reported_at_its_position(case: Case, corpus_root: Path, cli) -> None:
    ours_before = snapshot(corpus_root / OUTPUT_DIR)
    repo_before = snapshot(REPO_ROOT / OUTPUT_DIR)

    result = cli("--root", str(corpus_root), *case.argv())

    _assert_reported(case, result.rc, result.out, result.err)
    assert "nothing was written" in result.err
    assert snapshot(corpus_root / OUTPUT_DIR) == ours_before
    assert snapshot(REPO_ROOT / OUTPUT_DIR) == repo_before


@pytest.mark.parametrize("name", ["syntax_error.py", "mixed_union_pipe.py"])
def test_malformed_module_fails_end_to_end_without_traceback(name: str) -> None:
    """`python -m codegen` on the real repo: exit code, stderr, generated/ untouched."""
    (case,) = [c for c in CASES if c.name == name]
    before = snapshot(REPO_ROOT / OUTPUT_DIR)

    result = subprocess.run(
        [sys.executable, "-m", "codegen", "--root", str(REPO_ROOT), *case.argv()],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )

    _assert_reported(case, result.returncode, result.stdout, result.stderr)
    assert snapshot(REPO_ROOT / OUTPUT_DIR) == before


def test_corpus_helper_modules_are_valid(corpus_root: Path, cli) -> None:
    """The helpers fail nothing on their own, so a case's error is the case's."""
    for helper in sorted((corpus_root / CORPUS).glob("_*.py")):
        result = cli("--root", str(corpus_root), "--diff", "--source", f"{CORPUS}/{helper.name}")
        assert result.rc == 0, result.err
