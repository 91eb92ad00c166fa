"""The README's quick start runs, and the docs describe the code, not how it was written.

The README's first ```python block is the TE user's quick start: it must import
``transformer_engine_ops`` as ``te``, enter ``te.autocast``, compile with
``torch.compile(fullgraph=True)`` and run a backward; the test runs it as it stands.
README.md, docs/ and benchmarks/ hold reference text and figures with their date,
commit and machine; words that narrate the work (its periods, machine loans, device
time) or refer to files outside the project fail the grep below.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# The narrative words in any case; the outside files by their exact names (the project
# has a docs/architecture.md of its own).
NARRATIVE = re.compile(
    r"(?i:work[ -]periods?|\blent\b|\bloans?\b|\bleases?\b|device[ -]time|\bsessions?\b)"
    r"|ARCHITECTURE\.md|STYLE\.md|TE_FACTS\.md|\.\./shared"
)
TEXT_SUFFIXES = {".md", ".py", ".j2", ".txt", ".toml", ".json"}


def first_python_block(markdown: str) -> str:
    """The body of the first fenced block tagged ``python``."""
    match = re.search(r"^```python\n(.*?)^```$", markdown, re.MULTILINE | re.DOTALL)
    if match is None:
        raise AssertionError("README.md has no ```python block")
    return match.group(1)


def narrative_hits(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line: text`` for each line holding a narrative word."""
    hits = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if NARRATIVE.search(line):
                hits.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return hits


def documented_files() -> list[Path]:
    files = [README]
    for folder in (ROOT / "docs", ROOT / "benchmarks"):
        files += sorted(
            p
            for p in folder.rglob("*")
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts
        )
    return files


def test_first_python_block_is_the_quick_start() -> None:
    code = first_python_block(README.read_text(encoding="utf-8"))
    assert "import transformer_engine_ops as te" in code
    assert "te.autocast(" in code
    assert "torch.compile(fullgraph=True)" in code
    assert ".backward()" in code


@pytest.mark.slow
def test_readme_quick_start_runs() -> None:
    """The block as the README shows it: compiled in one graph, forward and backward."""
    code = first_python_block(README.read_text(encoding="utf-8"))
    torch._dynamo.reset()
    namespace: dict[str, object] = {"__name__": "readme_quick_start"}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    x, y = namespace["x"], namespace["y"]
    assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
    assert x.grad is not None and x.grad.shape == x.shape
    assert torch.isfinite(y.float()).all() and torch.isfinite(x.grad.float()).all()
    layer = namespace["layer"]
    assert all(p.grad is not None for p in layer.parameters())


def test_first_python_block_is_found_and_checked() -> None:
    """The extraction reads the first python block only, and a block without the quick
    start's parts fails the check."""
    text = "# x\n\n```\nmake demo\n```\n\n```python\nimport torch\n```\n\n```python\nB\n```\n"
    assert first_python_block(text) == "import torch\n"
    with pytest.raises(AssertionError):
        first_python_block("no code here\n")


def test_no_narrative_or_outside_files_in_docs() -> None:
    hits = narrative_hits(documented_files())
    assert not hits, "narrative or outside-file references:\n" + "\n".join(hits)


def test_narrative_grep_finds_each_word(tmp_path: Path) -> None:
    lines = [
        "In the third work period the bench ran.",
        "The H200 was not lent.",
        "A machine loan ended.",
        "One lease later.",
        "No device time was left.",
        "This session's figures.",
        "See ARCHITECTURE.md.",
        "See STYLE.md and TE_FACTS.md.",
        "In ../shared/notes.",
    ]
    doc = tmp_path / "doc.md"
    quiet = ["The equivalent layout is silent.", "A release of torch.", "See docs/architecture.md."]
    doc.write_text("\n".join(lines + quiet) + "\n")
    hits = narrative_hits([doc], root=tmp_path)
    assert [hit.split(":")[1] for hit in hits] == [str(n) for n in range(1, len(lines) + 1)]
