"""The cluster token on the transfer path: engines that share it read each other's registered memory; a peer
without it, or with another, gets nothing (its messages are dropped unread and counted)."""

from __future__ import annotations

import pytest
from support.transfer_peer import block_digests, fill_random

from kvferry.transfer import TransferTimeoutError

pytest_plugins = ["support.transfer_fixtures"]  # local_engine

BLOCKS = [3, 4, 9]


def _read_blocks(reader, reader_pool, owner_name: str, owner_pool) -> None:
    block = reader_pool.block_bytes()
    reader.register_memory(reader_pool.tensor.data_ptr(), reader_pool.tensor.numel() * reader_pool.tensor.element_size())
    reader.batch_transfer_read(owner_name, [reader_pool.tensor.data_ptr() + b * block for b in BLOCKS],
                               [owner_pool.tensor.data_ptr() + b * block for b in BLOCKS], [block] * len(BLOCKS))


@pytest.mark.parametrize("outsider_token", [None, "another cluster's token"])
def test_only_a_peer_with_the_cluster_token_reads_a_nodes_kv(outsider_token, local_engine, request):
    owner, owner_pool = local_engine("prefill", cluster_token="the cluster's token")
    fill_random(owner_pool, seed=5)
    owner.register_memory(owner_pool.tensor.data_ptr(), owner_pool.tensor.numel() * owner_pool.tensor.element_size())
    owner_name = f"prefill-{request.node.name}"

    outsider, outsider_pool = local_engine("outsider", cluster_token=outsider_token, timeout_seconds=1.0)
    untouched = block_digests(outsider_pool, BLOCKS)
    with pytest.raises(TransferTimeoutError):
        _read_blocks(outsider, outsider_pool, owner_name, owner_pool)
    assert block_digests(outsider_pool, BLOCKS) == untouched  # nothing of the owner's pool came
    assert owner.stats["unauthenticated_messages"] >= 1

    member, member_pool = local_engine("decode", cluster_token="the cluster's token")
    _read_blocks(member, member_pool, owner_name, owner_pool)
    assert block_digests(member_pool, BLOCKS) == block_digests(owner_pool, BLOCKS)
