"""The transfer engine's C put loop (transfer/_ucp_batch.c): built in place from source where no build
exists, rebuilt when older than its source, a clear error without a compiler; and how the loop sorts
UCP's answers. The real puts over real UCX are tests/integration/test_transfer*.py's; here the put and
free functions are fakes that answer as UCP does when puts fail (named so: this is about faults)."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvferry.transfer import native, ucp_direct

UCS_ERR_CONNECTION_RESET = -25
UCS_ERR_ENDPOINT_TIMEOUT = -80


@pytest.fixture
def source_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """native with its source in a scratch checkout (a pyproject.toml beside the package folder)."""
    (tmp_path / "pyproject.toml").write_text("")
    source = tmp_path / "transfer" / native.SOURCE.name
    source.parent.mkdir()
    shutil.copy(native.SOURCE, source)
    monkeypatch.setattr(native, "SOURCE", source)
    return source


def test_a_tree_without_a_build_compiles_it_in_place(source_copy: Path) -> None:
    library = native.load()
    assert hasattr(library, "kvf_put_many")
    built = list(source_copy.parent.glob("_ucp_batch*.so"))
    assert len(built) == 1 and not list(source_copy.parent.glob(".*"))  # no temporary left behind


def test_a_build_older_than_its_source_is_rebuilt(source_copy: Path) -> None:
    first = native.build()
    os.utime(first, (0, 0))  # older than the source
    native.load()
    assert first.stat().st_mtime > 0


def test_without_a_compiler_the_error_says_what_to_run(source_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(source_copy.parent / "no-such-compiler"))
    with pytest.raises(native.NativeBuildError, match="make venv"):
        native.load()


PUT = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def run_loop(answers: list[int | None]) -> tuple[list[int], int, list[tuple[int, int, int, int]], list[int]]:
    """kvf_put_many over fake put/free functions; put i answers answers[i] (None: completed in place,
    a small positive number: a request, negative: UCS_STATUS_PTR of that error)."""
    issued: list[tuple[int, int, int, int]] = []
    freed: list[int] = []

    def put(endpoint: int, buffer: int, length: int, remote: int, rkey: int, param: int) -> int | None:
        answer = answers[len(issued)]
        issued.append((buffer, length, remote, rkey))
        return None if answer is None else answer % (1 << 64)

    put_fn, free_fn = PUT(put), FREE(freed.append)
    count = len(answers)
    columns = [np.arange(count, dtype=np.uint64) * 4096 + base for base in (1 << 20, 4096, 1 << 30, 7)]
    failed = np.full(count, -1, dtype=np.int64)
    status = ctypes.c_int32(1)
    library = ucp_direct._BATCH
    failures = library.kvf_put_many(
        ctypes.cast(put_fn, ctypes.c_void_p).value, ctypes.cast(free_fn, ctypes.c_void_p).value, 11, 22, count,
        *(column.ctypes.data for column in columns), failed.ctypes.data, ctypes.byref(status),
    )  # fmt: skip
    expected = [tuple(int(column[i]) for column in columns) for i in range(count)]
    assert issued == expected  # every put, in order, with its own four fields
    return failed[:failures].tolist(), status.value, issued, freed


def test_the_loop_frees_requests_and_reports_the_puts_that_failed_at_once() -> None:
    answers = [None, 0x1000, UCS_ERR_CONNECTION_RESET, 0x2000, UCS_ERR_ENDPOINT_TIMEOUT, None]
    failed, status, _, freed = run_loop(answers)
    assert failed == [2, 4]
    assert status == UCS_ERR_CONNECTION_RESET  # the first failure's
    assert freed == [0x1000, 0x2000]  # requests in flight only; errors are not requests


def test_a_batch_that_all_completed_reports_nothing() -> None:
    failed, status, issued, freed = run_loop([None] * 300)
    assert (failed, status, freed, len(issued)) == ([], 0, [], 300)
