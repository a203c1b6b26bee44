"""kvferry's plain C libraries (no Python or UCX headers), loaded with ctypes: built beside their source, or
built there now.

`make venv` (an editable install) and a wheel build each with the package (pyproject.toml's ext-modules,
with the same flags as here). A tree that runs from source through PYTHONPATH (the GPU machine) may never
have been built, or hold a build older than the source: the first load then compiles it in place with the
C compiler ($CC, else cc), as Triton compiles its launchers on such machines. Without a compiler the load
fails and says what to run.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

BUILD_TIMEOUT_S = 120
# A library's functions by name: (the ctypes return type or None, [the ctypes argument types]).
Signatures = dict[str, tuple[type | None, list[type]]]


class NativeBuildError(ImportError):
    pass


@dataclass(frozen=True)
class NativeLibrary:
    source: Path  # the C file; the library is `<stem><extension suffix>` beside it
    purpose: str  # what it is, for errors: "kvferry.transfer's put loop"
    flags: tuple[str, ...] = ("-O2",)  # pyproject.toml's extra-compile-args (and -l options) for it
    headers: tuple[str, ...] = ()  # the headers beside the source that it includes (pyproject.toml's depends)

    def built(self) -> Path | None:
        """The library; in a source checkout only one at least as new as the source and its headers (an installed package
        is built once, and the times its files get from the wheel say nothing)."""
        checkout = (self.source.parent.parent / "pyproject.toml").is_file()
        inputs = [self.source, *(self.source.with_name(header) for header in self.headers)]
        source_time = max(path.stat().st_mtime for path in inputs) if checkout else 0.0
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = self.source.with_name(self.source.stem + suffix)
            if path.is_file() and path.stat().st_mtime >= source_time:
                return path
        return None

    def build(self) -> Path:
        """Compile the source into the library's place. Processes that start together may each build: each
        writes its own temporary file and renames it into place, so a reader never sees half a library."""
        stem = self.source.stem
        target = self.source.with_name(stem + importlib.machinery.EXTENSION_SUFFIXES[0])
        hint = f"build it with `make venv` or `{shlex.join(self._command(str(target)))}`"
        try:
            handle, temporary = tempfile.mkstemp(dir=self.source.parent, prefix=f".{stem}-", suffix=".so")
            os.close(handle)
        except OSError as exc:
            raise NativeBuildError(f"{self.purpose} is not built and {self.source.parent} is not writable ({exc}); {hint}") from exc
        try:
            subprocess.run(self._command(temporary), check=True, capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT_S)  # fmt: skip
            os.replace(temporary, target)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", None) or exc
            raise NativeBuildError(f"{self.purpose} is not built and compiling {self.source.name} failed: {detail}; {hint}") from exc
        finally:
            Path(temporary).unlink(missing_ok=True)
        return target

    def _command(self, output: str) -> list[str]:
        compiler = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or "cc"]
        return [*compiler, "-shared", "-fPIC", "-o", output, str(self.source), *self.flags]

    def load(self, signatures: Signatures | None = None) -> ctypes.CDLL:
        """The loaded library, its functions' types set from `signatures` (name: (restype, argtypes)): ctypes
        converts the arguments once a call from these rather than guessing each one."""
        library = ctypes.CDLL(str(self.built() or self.build()))
        for name, (restype, argtypes) in (signatures or {}).items():
            function = getattr(library, name)
            function.restype, function.argtypes = restype, argtypes
        return library
