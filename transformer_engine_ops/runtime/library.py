"""The ``torch.library.Library`` of each op namespace, shared by the op definitions
(custom_ops), the marked exact pieces (lowering) and the kernels' ops."""

from __future__ import annotations

import threading
from typing import Any

import torch

_LIBRARIES: dict[str, Any] = {}
_LOCK = threading.Lock()


def op_library(namespace: str) -> Any:
    """The ``FRAGMENT`` Library of ``namespace``, one per process and kept alive (a
    Library unregisters its definitions when collected)."""
    lib = _LIBRARIES.get(namespace)
    if lib is None:
        with _LOCK:
            lib = _LIBRARIES.get(namespace)
            if lib is None:
                lib = _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    return lib
