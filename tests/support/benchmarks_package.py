"""The checkout's benchmarks package, for tests of benchmark code.

Benchmarks run as `python -m benchmarks.<name>` from the checkout root, where the root is on sys.path. The
test process keeps the root off sys.path (tests/conftest.py says why), so `benchmarks` is registered here
from its folder, and nothing else of the root becomes importable with it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def import_benchmark(name: str) -> ModuleType:
    """`benchmarks.<name>`, as `python -m benchmarks.<name>` would import it."""
    if "benchmarks" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "benchmarks", BENCHMARKS / "__init__.py", submodule_search_locations=[str(BENCHMARKS)]
        )
        package = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["benchmarks"] = package
        spec.loader.exec_module(package)  # type: ignore[union-attr]
    return importlib.import_module(f"benchmarks.{name}")
