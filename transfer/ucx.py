"""The slice of ucxx the transfer engine uses: one worker, endpoints by worker address, tagged messages.

Why endpoints are made without UCX's peer error handling: with UCP_ERR_HANDLING_MODE_PEER, UCX 1.21
leaves out every transport that cannot report a peer failure, which on one host is all of the fast
ones (posix and sysv shared memory, CMA); the endpoint then wires to tcp/lo only (UCX_PROTO_INFO=y shows
it). Without it, the same worker address gives CMA zero-copy rendezvous between two processes. Peer
failure is then the transfer engine's job: every operation has a deadline, and a send to a dead peer
completes with an error rather than hanging (both checked by tests/integration/test_transfer_*.py).
"""

from __future__ import annotations

from ucxx._lib import libucxx as ucx
from ucxx._lib.arr import Array

from kvferry.transfer.errors import PeerUnreachableError

Request = ucx.UCXRequest


class UcxWorker:
    def __init__(self, options: dict[str, str] | None = None) -> None:
        """`options` are UCX settings without the UCX_ prefix ({"CMA_TX_QUOTA": "1024"}); they override
        the environment, for this context only."""
        features = (ucx.Feature.TAG, ucx.Feature.RMA, ucx.Feature.WAKEUP)
        self.context = ucx.UCXContext(config_dict=options or {}, feature_flags=features)
        self.worker = ucx.UCXWorker(self.context)
        self.worker.init_blocking_progress_mode()

    @property
    def handle(self) -> int:
        """The ucp_worker_h, for the direct UCP calls of ucp_direct."""
        return self.worker.handle

    @property
    def context_handle(self) -> int:
        """The ucp_context_h, for memory maps and remote keys."""
        return self.context.handle

    @property
    def address(self) -> bytes:
        return bytes(memoryview(self.worker.address))

    def connect(self, address: bytes) -> ucx.UCXEndpoint:
        """An endpoint to the worker at `address`. An address whose process is gone fails here (UCX cannot
        attach to its shared memory): raised as a transfer error, which every caller on the loop handles."""
        remote = ucx.UCXAddress.create_from_buffer(address)
        try:
            return ucx.UCXEndpoint.create_from_worker_address(self.worker, remote, False)
        except ucx.UCXError as exc:
            raise PeerUnreachableError(f"cannot connect to the worker at that address: {exc}") from exc

    def progress(self) -> None:
        self.worker.progress()

    def wait_for_events(self, timeout_ms: int) -> None:
        """Sleep until the network has something for us or `timeout_ms` passes (no busy polling)."""
        self.worker.progress_worker_event(epoll_timeout=timeout_ms)

    def recv_any(self, buffer: memoryview | object, tag: int) -> Request:
        """A receive matching `tag` from any peer (control messages)."""
        return self.worker.tag_recv(Array(buffer), ucx.UCXXTag(tag), ucx.UCXXTagMaskFull)

    @staticmethod
    def send(endpoint: ucx.UCXEndpoint, buffer: object, tag: int) -> Request:
        return endpoint.tag_send(Array(buffer), ucx.UCXXTag(tag))

    @staticmethod
    def recv(endpoint: ucx.UCXEndpoint, buffer: object, tag: int) -> Request:
        """A receive tied to `endpoint`, so closing the endpoint cancels it."""
        return endpoint.tag_recv(Array(buffer), ucx.UCXXTag(tag), ucx.UCXXTagMaskFull)


def request_error(request: Request) -> BaseException | None:
    try:
        request.check_error()
    except Exception as exc:  # noqa: BLE001 - ucxx raises its own error classes; callers type them
        return exc
    return None
