"""No top-level folder of the checkout stands in for a package of the same name in the test process.

With the checkout root on sys.path, kernels/ once took the place of Hugging Face's `kernels` package
inside transformers, and benchmarks/kernels.py did so when benchmarks/ was on the path
(tests/conftest.py says how the root is kept off).
"""

from __future__ import annotations

import importlib
import operator
import sys
import sysconfig
from importlib.machinery import PathFinder
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_checkout_root_is_not_on_sys_path():
    assert str(REPO) not in [str(Path(entry or ".").resolve()) for entry in sys.path]


def test_import_kernels_gives_the_installed_distribution():
    kernels = importlib.import_module("kernels")
    assert Path(kernels.__file__).is_relative_to(sysconfig.get_paths()["purelib"]), kernels.__file__


def test_import_operator_gives_the_standard_library():
    assert Path(operator.__file__).parent == Path(sysconfig.get_paths()["stdlib"])


@pytest.mark.parametrize("folder", ["router", "engine", "kvcache", "transfer", "prefill_node", "decode_node", "benchmarks"])
def test_component_folders_are_not_importable_by_their_own_names(folder):
    # Searched on sys.path itself: tests of benchmark code register `benchmarks` in sys.modules from its
    # folder (support/benchmarks_package.py), which is not the root on the path.
    assert (REPO / folder).is_dir()
    assert PathFinder.find_spec(folder, sys.path) is None
    if folder not in sys.modules:
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(folder)
