"""Eager fallback: a configuration the op path cannot serve runs eagerly, with a reason.

Under ``torch.compile`` the eager call sits behind ``torch.compiler.disable`` with the
reason attached, so dynamo breaks the graph there (and ``fullgraph=True`` raises,
quoting the reason); the first such call per reason warns. The warning is issued
from the disabled (eager) function itself: a ``warnings.warn`` traced by dynamo
would be dropped.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from . import _torch_private as _private

_WARNED: set[str] = set()
_RUNNERS: dict[str, Callable[..., Any]] = {}


class EagerFallbackWarning(UserWarning):
    """A compiled module ran a call eagerly; the message names the reason."""


def _runner(reason: str) -> Callable[..., Any]:
    runner = _RUNNERS.get(reason)
    if runner is None:

        def run_eagerly(fn: Callable[..., Any], *args: Any) -> Any:
            if reason not in _WARNED:
                _WARNED.add(reason)
                warnings.warn(
                    f"transformer_engine_ops: running eagerly under torch.compile: {reason}",
                    EagerFallbackWarning,
                    stacklevel=3,
                )
            return fn(*args)

        runner = torch.compiler.disable(
            run_eagerly, reason=f"transformer_engine_ops eager fallback: {reason}"
        )
        _RUNNERS[reason] = runner
    return runner


def _make_runner_at_trace_time(ctx: Any) -> None:
    # Runs in dynamo's own frame (via comptime), not traced: creating the disabled
    # runner inside the traced region would make dynamo break on
    # ``torch.compiler.disable`` itself, and fullgraph's error would not name the reason.
    _runner(ctx.get_local("reason").as_python_constant())


def run_eagerly(reason: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` outside any compiled graph, warning once per ``reason``."""
    if torch.compiler.is_compiling():
        # Looked up now, not at import: it imports Dynamo, which importing a generated
        # op module (this module's importer) must not pay; Dynamo is loaded by now.
        _private.comptime(_make_runner_at_trace_time)
    return _runner(reason)(fn, *args)


def reset_warnings() -> None:
    """Forget which reasons have warned (tests use this)."""
    _WARNED.clear()
