"""``make bench``: the performance figures of docs/benchmarks.md (ARCHITECTURE.md section 6).

Run ``python -m benchmarks`` (CPU figures 1-5, then the report) or ``python -m benchmarks
--device cuda --out DIR`` on the H200 (figure 6, JSON only: needs torch and this repo).
"""


def _map_generated_package() -> None:
    """Make ``transformer_engine_ops.generated`` importable from a plain checkout.

    pyproject maps the checked-in ``generated/`` folder to that package at install
    time; on a machine where the repository is used without ``pip install -e .`` (the
    H200 run needs only torch and the checkout), the repository root is added to the
    package's search path so ``generated/`` is found the same way.
    """
    import importlib.util
    from pathlib import Path

    try:
        found = importlib.util.find_spec("transformer_engine_ops.generated") is not None
    except ModuleNotFoundError:
        return
    if not found:
        import transformer_engine_ops

        transformer_engine_ops.__path__.append(str(Path(__file__).resolve().parent.parent))


_map_generated_package()
