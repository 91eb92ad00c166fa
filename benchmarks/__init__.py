"""``make bench``: the performance figures of docs/benchmarks.md.

Run ``python -m benchmarks`` (CPU figures 1-5, then the report) or ``python -m benchmarks
--device cuda --out DIR`` on the H200 (figure 6, JSON only: needs torch and this repo).

The benchmarks time every recipe on whatever GPU runs them, MXFP8 and NVFP4 emulated
below Blackwell, where a module refuses them unless
``TEOPS_EMULATE_UNSUPPORTED_RECIPES=1`` (``transformer_engine_ops/quantization/availability.py``):
importing this package turns it on, unless the environment sets it already.
"""

import os

os.environ.setdefault("TEOPS_EMULATE_UNSUPPORTED_RECIPES", "1")
