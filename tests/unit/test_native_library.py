"""kvferry's C libraries (kvferry/native_library.py): built in place from source where no build exists,
rebuilt when older than their source, a clear error without a compiler. On a scratch copy of the transfer
put loop's source, in a scratch checkout (a pyproject.toml beside the package folder)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvferry.native_library import NativeBuildError, NativeLibrary

PUT_LOOP_SOURCE = Path(__file__).resolve().parents[2] / "transfer" / "_ucp_batch.c"


@pytest.fixture
def library(tmp_path: Path) -> NativeLibrary:
    (tmp_path / "pyproject.toml").write_text("")
    source = tmp_path / "transfer" / PUT_LOOP_SOURCE.name
    source.parent.mkdir()
    shutil.copy(PUT_LOOP_SOURCE, source)
    return NativeLibrary(source, "the scratch put loop")


def test_a_tree_without_a_build_compiles_it_in_place(library: NativeLibrary) -> None:
    assert hasattr(library.load(), "kvf_put_many")
    built = list(library.source.parent.glob("_ucp_batch*.so"))
    assert len(built) == 1 and not list(library.source.parent.glob(".*"))  # no temporary left behind


def test_a_build_older_than_its_source_is_rebuilt(library: NativeLibrary) -> None:
    first = library.build()
    os.utime(first, (0, 0))  # older than the source
    library.load()
    assert first.stat().st_mtime > 0


def test_without_a_compiler_the_error_says_what_to_run(library: NativeLibrary, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(library.source.parent / "no-such-compiler"))
    with pytest.raises(NativeBuildError, match="make venv") as failed:
        library.load()
    assert "the scratch put loop is not built" in str(failed.value)
