"""The scheduler's admission order: prompts that share a prefix still being computed wait for it."""

from kvferry.engine.block_manager import BlockManager
from kvferry.engine.sampling_params import SamplingParams
from kvferry.engine.scheduler import Scheduler, SchedulerConfig
from kvferry.engine.sequence import Sequence
from kvferry.kvcache.allocator import BlockAllocator

BLOCK = 4
SHARED = list(range(100, 108))  # two full blocks of a common system prompt


def _scheduler(prefix_caching: bool = True, budget: int = 64) -> tuple[Scheduler, BlockManager]:
    manager = BlockManager(BlockAllocator(64, prefix_caching), BLOCK, "model")
    return Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=64), manager), manager


def _seq(name: str, prompt: list[int]) -> Sequence:
    return Sequence(name, 0, prompt, SamplingParams(max_tokens=4), detokenizer=None, generator=None)  # type: ignore[arg-type]


def _computed(manager: BlockManager, batch) -> None:
    """What the engine does after a step: count the computed tokens and offer full blocks to the cache."""
    for seq, count in zip(batch.seqs, batch.num_new_tokens, strict=True):
        seq.num_computed_tokens += count
        manager.cache_computed_blocks(seq)


def test_a_prompt_whose_prefix_is_being_computed_waits_one_step_and_then_hits_it():
    scheduler, manager = _scheduler()
    first, follower, other = _seq("a", SHARED + [1, 2, 3]), _seq("b", SHARED + [4, 5, 6]), _seq("c", [7, 8, 9, 10, 11])
    for seq in (first, follower, other):
        scheduler.add(seq)

    step = scheduler.schedule()
    # The follower is passed over (its first block is on its way), the unrelated prompt behind it is not.
    assert [seq.request_id for seq in step.seqs] == ["a", "c"]
    assert list(scheduler.waiting) == [follower] and follower.block_ids == [] and follower.num_computed_tokens == 0
    _computed(manager, step)

    step = scheduler.schedule()
    assert follower in step.seqs
    assert follower.num_cached_tokens == len(SHARED)  # both shared blocks came from the cache


def test_without_a_prefix_cache_nothing_waits():
    scheduler, _ = _scheduler(prefix_caching=False)
    scheduler.add(_seq("a", SHARED + [1]))
    scheduler.add(_seq("b", SHARED + [2]))
    assert [seq.request_id for seq in scheduler.schedule().seqs] == ["a", "b"]


def test_a_waiting_prompt_is_not_held_back_by_a_running_one_that_computed_its_blocks():
    scheduler, manager = _scheduler(budget=16)
    long_prompt = _seq("a", SHARED + list(range(1, 13)))  # 20 tokens: two chunks of 16 and 4
    scheduler.add(long_prompt)
    _computed(manager, scheduler.schedule())
    scheduler.add(_seq("b", SHARED + [50]))
    step = scheduler.schedule()  # a's shared blocks are computed and cached: b hits them at once
    assert [seq.request_id for seq in step.seqs] == ["a", "b"]
    assert step.seqs[1].num_cached_tokens == len(SHARED)
