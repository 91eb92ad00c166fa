"""Suite-wide set-up: compiled code never comes from an earlier run's caches, and the
GPU tests run every recipe, emulated where the GPU cannot run it natively.

Inductor's on-disk caches key compiled graphs on the graph, not on our custom ops'
fake kernels, so a cache left by an older checkout (or a worktree beside this one) can
serve code compiled for another output layout. Each test process (each pytest-xdist
worker) compiles into its own fresh cache directory.

A module built without a ``device`` puts its parameters on CUDA where CUDA is available,
as TE's (``transformer_engine_ops/modules/_device.py``). The suite's tests were written
for the CPU and pass ``device`` where they mean CUDA, so ``TEOPS_DEFAULT_DEVICE=cpu``
keeps ``device=None`` on the CPU on any machine, in this process and every process a
test starts (the distributed ranks, the subprocess checks); the tests of the default
itself lift it (``tests/modules/test_default_device.py``).

A module on a CUDA device refuses a recipe that device cannot run natively (MXFP8 and
NVFP4 below Blackwell), unless ``TEOPS_EMULATE_UNSUPPORTED_RECIPES=1``
(``transformer_engine_ops/quantization/availability.py``). The tests marked ``gpu`` check every
recipe on whatever GPU runs them (an H100 or H200 too), so they run with it on; a test
of the refusal itself turns it off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
import torch

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="teops-inductor-")
os.environ["TEOPS_DEFAULT_DEVICE"] = "cpu"

# ``TEOPS_INDUCTOR_SIMDLEN=0`` (or 256, 512) compiles every test's Inductor CPU code at
# that vector width instead of the host's pick, so a bitwise claim that rests on Inductor
# and ATen summing in the same order fails on any host (tests/modules/inductor_widths.py).
_SIMDLEN = os.environ.get("TEOPS_INDUCTOR_SIMDLEN")
if _SIMDLEN:
    import torch._inductor.config

    torch._inductor.config.cpp.simdlen = int(_SIMDLEN)


@pytest.fixture(autouse=True)
def emulate_unsupported_recipes_on_gpu_tests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TEOPS_EMULATE_UNSUPPORTED_RECIPES=1`` for the tests marked ``gpu``."""
    if request.node.get_closest_marker("gpu") is not None:
        monkeypatch.setenv("TEOPS_EMULATE_UNSUPPORTED_RECIPES", "1")


# Running compiled graphs on threads that then exit leaves torch 2.11's Dynamo unable to
# trace later: a compile on another thread crashes (a segfault in FakeTensorMode), or
# frames after a graph break run untraced. torch 2.13 shows neither (docs/design.md).
# Before 2.13, a test marked ``threads`` runs in a pytest process of its own, so the
# tests after it in this process trace as they would alone.
_THREADS_NEED_OWN_PROCESS = torch.__version__ < (2, 13)
_CHILD = "TEOPS_THREADS_TEST_CHILD"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if (
        pyfuncitem.get_closest_marker("threads") is None
        or not _THREADS_NEED_OWN_PROCESS
        or os.environ.get(_CHILD)
    ):
        return None
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
        + ["-m", "threads", pyfuncitem.nodeid],
        cwd=pyfuncitem.config.rootpath,
        env={**os.environ, _CHILD: "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        pytest.fail(
            f"{pyfuncitem.nodeid} in its own process (torch {torch.__version__}) exited "
            f"{done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}",
            pytrace=False,
        )
    return True
