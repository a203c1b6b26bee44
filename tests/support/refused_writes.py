"""The refusals a decode node's lease makes, driven the same way against a host or a CUDA pool."""

from __future__ import annotations

import pytest
from support.peer_process import PeerProcess

from kvferry.transfer.errors import TransferRejectedError
from kvferry.transfer.kv_connector import DestinationHandle, KVSender


def refused_around_one_accepted(
    sender: KVSender, receiver: PeerProcess, request_id: str, src: list[int], dst: list[int]
) -> None:
    """Writes into blocks outside the lease and with a forged token are refused, the lease's own write lands,
    and a replay is refused (the lease completed): three refusals, and `dst` holds `src`."""
    handle = DestinationHandle.from_json(
        receiver.call("expect", request_id=request_id, block_ids=dst)["handle"]
    )
    outside = DestinationHandle.from_json({**handle.to_json(), "block_ids": [b + len(dst) for b in dst]})
    with pytest.raises(TransferRejectedError, match="outside the blocks reserved"):
        sender.send_blocks(request_id, src, outside)
    forged = DestinationHandle.from_json({**handle.to_json(), "token": "0" * 32})
    with pytest.raises(TransferRejectedError, match="lease token"):
        sender.send_blocks(request_id, src, forged)
    sender.send_blocks(request_id, src, handle)
    assert receiver.call("wait", request_id=request_id)["arrived"]
    with pytest.raises(TransferRejectedError, match="lease token"):  # the lease completed: a replay is stale
        sender.send_blocks(request_id, src[::-1], handle)  # other data: had it landed, `dst` would show it
