"""Package names that load on first use (PEP 562), for packages whose light modules a light process imports.

A package's __init__ runs whenever any of its modules is imported: the router importing the block hash
from kvferry.kvcache, or the node registry from kvferry.transfer, must not import torch or UCX with them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's `__getattr__`: each name of `homes` (name -> the module that defines it) on first use."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return __getattr__
