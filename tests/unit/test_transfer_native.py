"""The transfer engine's C put loop (transfer/_ucp_batch.c): how it sorts UCP's answers (its build:
tests/unit/test_native_library.py). The real puts over real UCX are tests/integration/test_transfer*.py's; here the put and
free functions are fakes that answer as UCP does when puts fail (named so: this is about faults)."""

from __future__ import annotations

import ctypes

import numpy as np

from kvferry.transfer import ucp_direct

UCS_ERR_CONNECTION_RESET = -25
UCS_ERR_ENDPOINT_TIMEOUT = -80


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
