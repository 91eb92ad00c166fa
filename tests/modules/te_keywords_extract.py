"""Write ``te_2_20_keywords.py``: the keyword arguments (name and default, as source
text) of TE 2.20.2's module constructors and ``forward`` methods, read statically (``ast``)
from its unpacked wheel, never imported. Run once by hand when the TE version changes:

    python tests/modules/te_keywords_extract.py ~/.cache/teops/transformer_engine-2.20.2

CI has no wheel; the test reads the table written here.
"""

from __future__ import annotations

import ast
import pprint
import sys
from pathlib import Path

# class -> its file under transformer_engine/pytorch/
CLASSES = {
    "Linear": "module/linear.py",
    "LayerNormLinear": "module/layernorm_linear.py",
    "LayerNormMLP": "module/layernorm_mlp.py",
    "GroupedLinear": "module/grouped_linear.py",
    "LayerNorm": "module/layernorm.py",
    "RMSNorm": "module/rmsnorm.py",
    "MultiheadAttention": "attention/multi_head_attention.py",
    "TransformerLayer": "transformer.py",
    "DotProductAttention": "attention/dot_product_attention/dot_product_attention.py",
}


def _arguments(function: ast.FunctionDef) -> list[tuple[str, str | None]]:
    args = function.args
    positional = [*args.posonlyargs, *args.args][1:]  # without self
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    pairs = [(a.arg, d) for a, d in zip(positional, defaults, strict=True)]
    pairs += list(zip((a.arg for a in args.kwonlyargs), args.kw_defaults, strict=True))
    return [(name, None if d is None else ast.unparse(d)) for name, d in pairs]


def extract(root: Path) -> dict[str, dict[str, list[tuple[str, str | None]]]]:
    table = {}
    for cls, file in CLASSES.items():
        tree = ast.parse((root / "transformer_engine/pytorch" / file).read_text())
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
        # LayerNorm/RMSNorm inherit forward(input) from TE's fusible op.
        table[cls] = {
            name: _arguments(methods[name]) for name in ("__init__", "forward") if name in methods
        }
    return table


def main() -> None:
    root = Path(sys.argv[1]).expanduser()
    out = Path(__file__).with_name("te_2_20_keywords.py")
    text = (
        '"""TE 2.20.2 module signatures: (name, default source or None) per argument,\n'
        'written by te_keywords_extract.py from the wheel (do not edit by hand)."""\n\n'
        f"TE_SIGNATURES = {pprint.pformat(extract(root), width=96, sort_dicts=False)}\n"
    )
    out.write_text(text)


if __name__ == "__main__":
    main()
