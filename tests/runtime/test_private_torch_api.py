"""Private torch API lives in one module (``runtime/_torch_private.py``), so a torch
upgrade that moves a private name breaks in one place. Every other module of the
package is read here (its syntax tree, so comments and docstrings do not count) for a
dotted name rooted at ``torch`` with a private part (``torch._C...``,
``torch.Tensor._make_wrapper_subclass``, ``import torch._dynamo``); what remains
outside is allow-listed below, each with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

import transformer_engine_ops

PACKAGE = Path(transformer_engine_ops.__file__).parent
HOME = "runtime/_torch_private.py"

# (file, dotted name) -> why it stays outside runtime/_torch_private.py. Empty: every
# use is there, with its reason and the torch versions it ran on.
ALLOWED: dict[tuple[str, str], str] = {}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _private(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "torch" and any(p.startswith("_") and not p.startswith("__") for p in parts)


def _shortest_private(name: str) -> str:
    """``torch._C._after_autograd_keyset`` -> itself; a longer chain is cut after its
    last private part (``torch._C._foo.bar`` -> ``torch._C._foo``)."""
    parts = name.split(".")
    last = max(i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__"))
    return ".".join(parts[: last + 1])


def private_uses(source: str) -> set[str]:
    """The private torch names a module's code uses."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name and _private(name):
                found.add(_shortest_private(name))
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if _private(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.module and _private(node.module):
            found.add(node.module)
    return found


def _collapse(found: set[str]) -> set[str]:
    # ``torch._C._foo`` is also seen as its inner chain ``torch._C``: keep the longest.
    return {n for n in found if not any(o != n and o.startswith(n + ".") for o in found)}


def test_no_private_torch_name_outside_its_module_but_the_allow_listed():
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel != HOME:
            found |= {(rel, n) for n in _collapse(private_uses(path.read_text(encoding="utf-8")))}
    unexpected = sorted(found - set(ALLOWED))
    assert not unexpected, (
        f"private torch API outside {HOME}: {unexpected}; add it there with its reason "
        "(or use the public equivalent)"
    )


def test_every_allow_listed_use_still_exists():
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        found |= {(rel, n) for n in _collapse(private_uses(path.read_text(encoding="utf-8")))}
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"allow-listed but no longer used (remove from ALLOWED): {stale}"


def test_the_scan_finds_each_spelling_of_a_private_name():
    source = (
        "import torch\nimport torch._dynamo\nfrom torch._inductor import config\n"
        "x = torch._C._after_autograd_keyset\ny = torch.Tensor._make_wrapper_subclass\n"
        "z = torch.nn.functional.relu\n'torch._C in a string'\n# torch._C in a comment\n"
    )
    assert _collapse(private_uses(source)) == {
        "torch._dynamo",
        "torch._inductor",
        "torch._C._after_autograd_keyset",
        "torch.Tensor._make_wrapper_subclass",
    }
