"""What the rewritten TE tests import in place of TE names this package does not offer.

Copied beside the rewritten tests (conformance/rewrite.py says which names come here).

* ``internal(entry, name)``: a placeholder for a TE internal. The runner skips every
  test that reaches one (conformance/analysis.py), so a test never runs one; while the
  test modules are imported and collected, attribute access, calls and subclassing give
  further placeholders (a parametrize list or a class statement at module level still
  builds). Once tests run (``RUNNING``), any use raises ``TEInternalReached``: the static
  analysis missed that use.
* ``missing(name)``: a placeholder for a public TE name this package does not offer; it
  behaves the same at collection, and any use in a test raises ``TENameMissing``, a
  failure of that test naming the name.
* TE's test-support helpers: ``init_method_normal``, ``scaled_init_method_normal``
  (Megatron's initialisations, N(0, sigma) and N(0, sigma / sqrt(2 * num_layers))),
  ``attention_mask_func`` (masked scores set to -10000), and
  ``fp8_global_state_reset`` for TE's ``FP8GlobalStateManager.reset()``, which the
  tests' teardown fixtures call: it returns this package's per-thread recipe state to
  "no recipe".
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any, NoReturn

import torch

# Set by the conformance plugin once collection is over.
RUNNING = False


class TEInternalReached(RuntimeError):
    """A test used a TE internal that the static analysis did not see."""


class TENameMissing(AttributeError):
    """A test used a public TE name that transformer_engine_ops does not offer."""


class _Placeholder:
    """Stands for a TE name with no counterpart here (see the module docstring)."""

    __slots__ = ("_teops_name", "_teops_kind", "_teops_entry")

    def __init__(self, name: str, kind: str, entry: str) -> None:
        object.__setattr__(self, "_teops_name", name)
        object.__setattr__(self, "_teops_kind", kind)
        object.__setattr__(self, "_teops_entry", entry)

    def _teops_fail(self, use: str) -> NoReturn:
        if self._teops_kind == "internal":
            raise TEInternalReached(
                f"TE internal {self._teops_entry} ({self._teops_name}) reached at run time "
                f"by {use}: the conformance runner's static analysis did not see this use"
            )
        raise TENameMissing(
            f"transformer_engine_ops does not offer TE's {self._teops_name}"
            + (f" ({self._teops_entry})" if self._teops_entry != self._teops_name else "")
        )

    def _teops_child(self, suffix: str, use: str) -> _Placeholder:
        if RUNNING:
            self._teops_fail(use)
        return _Placeholder(self._teops_name + suffix, self._teops_kind, self._teops_entry)

    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return self._teops_child(f".{attr}", f"reading .{attr}")

    def __setattr__(self, attr: str, value: Any) -> None:
        self._teops_fail(f"setting .{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        return self._teops_child("()", "a call")

    def __getitem__(self, key: Any) -> _Placeholder:
        return self._teops_child("[...]", "indexing")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        placeholder = self

        def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            placeholder._teops_fail("instantiating a subclass")

        base = type(f"TEPlaceholderBase[{self._teops_name}]", (), {"__init__": __init__})
        return (base,)

    def __instancecheck__(self, obj: Any) -> bool:
        self._teops_fail("isinstance()")

    def __subclasscheck__(self, cls: Any) -> bool:
        self._teops_fail("issubclass()")

    def __bool__(self) -> bool:
        self._teops_fail("a truth test")

    def __iter__(self) -> NoReturn:
        self._teops_fail("iteration")

    def __repr__(self) -> str:
        what = "TE internal" if self._teops_kind == "internal" else "missing TE name"
        return f"<{what} {self._teops_name}>"


def internal(entry: str, name: str | None = None) -> Any:
    """A placeholder for the TE internal ``name`` (listed as ``entry``)."""
    return _Placeholder(name or entry, "internal", entry)


def missing(name: str, entry: str | None = None) -> Any:
    """A placeholder for the public TE name ``name`` that this package does not offer."""
    return _Placeholder(name, "missing", entry or name)


def init_method_normal(sigma: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """An init method drawing N(0, sigma)."""

    def init(tensor: torch.Tensor) -> torch.Tensor:
        return torch.nn.init.normal_(tensor, mean=0.0, std=sigma)

    return init


def scaled_init_method_normal(sigma: float, num_layers: int) -> Callable[[torch.Tensor], Any]:
    """An init method drawing N(0, sigma / sqrt(2 * num_layers)) (output layers)."""
    return init_method_normal(sigma / math.sqrt(2.0 * num_layers))


def attention_mask_func(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Set the masked attention scores to -10000, in place."""
    return scores.masked_fill_(mask, -10000.0)


def fp8_global_state_reset() -> None:
    """Return this package's per-thread recipe state to no recipe (what TE's
    ``FP8GlobalStateManager.reset()`` does to TE's global state)."""
    # the module, not the function transformer_engine_ops.modules exports under its name
    state = importlib.import_module("transformer_engine_ops.modules.autocast").STATE
    for cell in ("autocast", "model_init"):
        if not hasattr(state, cell):
            raise RuntimeError(
                f"fp8_global_state_reset: transformer_engine_ops.modules.autocast.STATE has "
                f"no {cell!r}; conformance/shim/_teops_te.py follows that state's layout"
            )
        setattr(state, cell, None)
    state.preserve_init_val = False
