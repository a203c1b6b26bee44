import pytest

from kvferry.kvcache import BlockAllocator, BlockRemoved, BlockStored, OutOfBlocksError


def test_allocates_in_order_and_never_hands_out_the_null_block():
    allocator = BlockAllocator(6)
    assert allocator.allocate(3) == [1, 2, 3]
    assert allocator.allocate(2) == [4, 5]
    with pytest.raises(OutOfBlocksError):
        allocator.allocate(1)
    assert allocator.check_integrity().in_use == 5


def test_freed_chain_is_evicted_tail_first():
    allocator = BlockAllocator(8)
    chain = allocator.allocate(3)  # [1, 2, 3]
    for parent, (block, block_hash) in zip([0, 101, 102], zip(chain, [101, 102, 103], strict=True), strict=True):
        allocator.cache_block(block, block_hash, parent)
    other = allocator.allocate(2)  # [4, 5], unhashed
    allocator.free(chain)
    allocator.free(other)
    # Queue: never-used 6, 7, then the chain tail first (3, 2, 1), then 5, 4.
    assert list(allocator.free_queue) == [6, 7, 3, 2, 1, 5, 4]
    assert allocator.allocate(3) == [6, 7, 3]
    assert allocator.longest_cached_prefix([101, 102, 103]) == [1, 2]  # only the tail was evicted
    assert allocator.check_integrity() == allocator.stats()
    stats = allocator.stats()
    assert (stats.free, stats.cached, stats.in_use) == (2, 2, 3)


def test_prefix_hit_takes_a_reference_and_leaves_the_queue():
    allocator = BlockAllocator(5)
    blocks = allocator.allocate(2)
    allocator.cache_block(blocks[0], 11, 0)
    allocator.cache_block(blocks[1], 12, 11)
    allocator.free(blocks)
    hits = allocator.longest_cached_prefix([11, 12, 13])
    assert hits == [1, 2]
    allocator.take_cached(hits)
    allocator.take_cached(hits)  # a second sequence shares them
    assert [allocator.blocks[b].ref_count for b in hits] == [2, 2]
    assert list(allocator.free_queue) == [3, 4]
    allocator.free(hits)
    assert list(allocator.free_queue) == [3, 4]
    allocator.free(hits)
    assert list(allocator.free_queue) == [3, 4, 2, 1]
    allocator.check_integrity()


def test_duplicate_content_keeps_the_first_block_and_events_follow_the_cache():
    allocator = BlockAllocator(4)
    a, b = allocator.allocate(2)
    allocator.cache_block(a, 42, 0)
    allocator.cache_block(b, 42, 0)
    assert allocator.cached_block_by_hash == {42: a}
    assert allocator.take_events() == [BlockStored(42, 0)]
    allocator.free([a, b])
    allocator.allocate(3)  # 3, then b (freed last is queued first), then a: evicting a's hash
    assert allocator.take_events() == [BlockRemoved(42)]
    assert allocator.cached_block_by_hash == {}


def test_double_free_is_refused():
    allocator = BlockAllocator(3)
    block = allocator.allocate(1)
    allocator.free(block)
    with pytest.raises(RuntimeError, match="freed more often"):
        allocator.free(block)


def test_prefix_caching_off_caches_nothing():
    allocator = BlockAllocator(4, enable_prefix_caching=False)
    block = allocator.allocate(1)
    allocator.cache_block(block[0], 5, 0)
    assert allocator.longest_cached_prefix([5]) == []
    assert allocator.stats().cached == 0


def test_events_stop_at_the_bound_and_the_consumer_is_told_to_resync(monkeypatch):
    monkeypatch.setattr("kvferry.kvcache.allocator.MAX_PENDING_EVENTS", 2)
    allocator = BlockAllocator(5)
    blocks = allocator.allocate(3)
    for offset, block in enumerate(blocks):
        allocator.cache_block(block, 100 + offset, 0)
    assert allocator.take_events() is None  # the third event was dropped
    assert sorted(allocator.cached_hashes()) == [100, 101, 102]  # what a resync publishes instead
    allocator.cache_block(allocator.allocate(1)[0], 200, 0)
    assert allocator.take_events() == [BlockStored(200, 0)]  # recording resumed after the drain
