"""Wall time of `python -m codegen` and `--check` for all bundles (median of 7 runs)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "codegen", *args], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    interpreter = statistics.median(timed_python() for _ in range(7))
    for label, args in (("generate", []), ("--check", ["--check"])):
        runs = [timed(args) for _ in range(7)]
        median = statistics.median(runs)
        print(
            f"codegen {label:9s}: {median * 1e3:.0f} ms wall "
            f"({(median - interpreter) * 1e3:.0f} ms after interpreter start; "
            f"spread {min(runs) * 1e3:.0f}-{max(runs) * 1e3:.0f} ms)"
        )


def timed_python() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
