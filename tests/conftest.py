"""Suite-wide set-up: compiled code never comes from an earlier run's caches.

Inductor's on-disk caches key compiled graphs on the graph, not on our custom ops'
fake kernels, so a cache left by an older checkout (or a worktree beside this one) can
serve code compiled for another output layout. Each test process (each pytest-xdist
worker) compiles into its own fresh cache directory.
"""

from __future__ import annotations

import os
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="teops-inductor-")

# ``TEOPS_INDUCTOR_SIMDLEN=0`` (or 256, 512) compiles every test's Inductor CPU code at
# that vector width instead of the host's pick, so a bitwise claim that rests on Inductor
# and ATen summing in the same order fails on any host (tests/modules/inductor_widths.py).
_SIMDLEN = os.environ.get("TEOPS_INDUCTOR_SIMDLEN")
if _SIMDLEN:
    import torch._inductor.config

    torch._inductor.config.cpp.simdlen = int(_SIMDLEN)
