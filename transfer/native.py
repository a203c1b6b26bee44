"""The C put loop (`_ucp_batch.c`): the library built beside its source, or built there now.

`make venv` (an editable install) and a wheel build it with the package (pyproject.toml's
ext-modules). A tree that runs from source through PYTHONPATH (the GPU machine) may never have been
built, or hold a build older than the source: the first import then compiles it in place with the C
compiler ($CC, else cc), as Triton compiles its launchers on such machines. The file needs no UCX or
Python header. Without a compiler the import fails and says what to run: there is one put path, not a
slower copy of it in Python to fall back on.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("_ucp_batch.c")
_STEM = "_ucp_batch"
BUILD_TIMEOUT_S = 120


class NativeBuildError(ImportError):
    pass


def _built() -> Path | None:
    """The library; in a source checkout only one at least as new as the source (an installed package
    is built once, and the times its files get from the wheel say nothing)."""
    checkout = (SOURCE.parent.parent / "pyproject.toml").is_file()
    source_time = SOURCE.stat().st_mtime if checkout else 0.0
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = SOURCE.with_name(_STEM + suffix)
        if path.is_file() and path.stat().st_mtime >= source_time:
            return path
    return None


def build() -> Path:
    """Compile the source into the library's place. Processes that start together may each build: each
    writes its own temporary file and renames it into place, so a reader never sees half a library."""
    target = SOURCE.with_name(_STEM + importlib.machinery.EXTENSION_SUFFIXES[0])
    compiler = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or "cc"]
    hint = f"build it with `make venv` or `{compiler[0]} -O2 -shared -fPIC -o {target} {SOURCE}`"
    try:
        handle, temporary = tempfile.mkstemp(dir=SOURCE.parent, prefix=f".{_STEM}-", suffix=".so")
        os.close(handle)
    except OSError as exc:
        raise NativeBuildError(f"kvferry.transfer's put loop is not built and {SOURCE.parent} is not writable ({exc}); {hint}") from exc
    try:
        subprocess.run([*compiler, "-O2", "-shared", "-fPIC", "-o", temporary, str(SOURCE)],
                       check=True, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)  # fmt: skip
        os.replace(temporary, target)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        raise NativeBuildError(f"kvferry.transfer's put loop is not built and compiling {SOURCE.name} failed: {detail}; {hint}") from exc
    finally:
        Path(temporary).unlink(missing_ok=True)
    return target


def load() -> ctypes.CDLL:
    return ctypes.CDLL(str(_built() or build()))
