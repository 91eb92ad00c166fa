"""A bundle's fields as keyword arguments of its generated ``call_<op>``, in a form
torch.compile traces: torch 2.11's Dynamo cannot unpack ``**vars(bundle)`` (the
instance ``__dict__``) inside a compiled function."""

from __future__ import annotations

import dataclasses
from typing import Any


def fields_by_name(bundle: Any) -> dict[str, Any]:
    return {f.name: getattr(bundle, f.name) for f in dataclasses.fields(bundle)}
