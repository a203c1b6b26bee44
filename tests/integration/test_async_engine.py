import asyncio
import os
import threading
import time

import anyio
import pytest

from kvferry.engine import LLM, AsyncLLMEngine, LLMEngine, SamplingParams
from kvferry.engine.engine_args import EngineArgs

STEP_SECONDS = 0.5


@pytest.fixture
def async_engine(tiny_models):
    engine = AsyncLLMEngine(LLMEngine(tiny_models["llama"], EngineArgs(dtype="float32", max_model_len=256)))
    yield engine
    engine.shutdown()
    stats = engine.engine.allocator.check_integrity()
    assert stats.in_use == 0, stats


def _collect(engine, request_id, prompt, params):
    async def run():
        stream = await engine.add_request(request_id, prompt, params)
        return [output async for output in stream]

    return run()


def test_streams_incremental_outputs_matching_offline_generate(async_engine, tiny_models):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(30, 60))}

    async def main():
        return await asyncio.gather(*(_collect(async_engine, f"r{i}", prompt, params) for i in range(3)))

    streams = asyncio.run(main())
    # A separate engine: the async engine's thread owns its own, which must not be stepped from here.
    final = LLM(tiny_models["llama"], dtype="float32", max_model_len=256).generate(prompt, params)[0]
    for outputs in streams:
        token_counts = [len(o.outputs[0].token_ids) for o in outputs]
        assert token_counts == sorted(token_counts) and token_counts[-1] == 12
        assert outputs[-1].finished and outputs[-1].outputs[0].token_ids == final.outputs[0].token_ids
        texts = [o.outputs[0].text for o in outputs]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))


def test_leaving_the_stream_early_aborts_and_frees_blocks(async_engine):
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        stream = await async_engine.add_request("leaver", {"prompt_token_ids": list(range(100))}, params)
        async for output in stream:
            if len(output.outputs[0].token_ids) >= 3:
                break
        await stream.aclose()

    asyncio.run(main())
    assert "leaver" not in async_engine.engine.requests
    assert async_engine.engine.allocator.stats().in_use == 0
    # The id can be used again once the first request is gone.
    outputs = asyncio.run(_collect(async_engine, "leaver", {"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=2)))
    assert outputs[-1].finished


def test_bad_input_raises_before_anything_is_queued(async_engine):
    async def main():
        with pytest.raises(ValueError, match="empty"):
            await async_engine.add_request("bad", {"prompt_token_ids": []}, SamplingParams())

    asyncio.run(main())
    assert not async_engine.engine.has_unfinished_requests()


def test_a_long_step_does_not_freeze_the_event_loop(async_engine):
    """A prefill node's step can take seconds; meanwhile its event loop must keep serving (streams, health
    probes): new requests and engine calls wait for the step off the loop."""
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    step = async_engine.engine.step

    async def main():
        loop, stepping = asyncio.get_running_loop(), asyncio.Event()

        def slow_step():
            loop.call_soon_threadsafe(stepping.set)
            time.sleep(STEP_SECONDS)  # under the engine lock, as a long prefill holds it
            return step()

        async_engine.engine.step = slow_step
        first = await async_engine.add_request("long", {"prompt_token_ids": list(range(20))}, params)
        await stepping.wait()
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        second = await async_engine.add_request("queued", {"prompt_token_ids": list(range(20, 40))}, params)
        task.cancel()
        called = await async_engine.call(lambda engine: engine)
        outputs = [[o async for o in stream] for stream in (first, second)]
        return ticks, called, outputs

    ticks, called, outputs = asyncio.run(main())
    # The loop kept ticking (every 10 ms) while add_request waited out a step of STEP_SECONDS.
    assert ticks >= STEP_SECONDS / 0.01 / 4, ticks
    assert called is async_engine.engine
    assert [len(o[-1].outputs[0].token_ids) for o in outputs] == [2, 2]


def test_engine_calls_get_the_lock_between_two_steps(async_engine):
    """The engine thread takes the lock again right after each step; without a hand-off, a waiting call (a
    node's /metrics, its load report, a reservation) lost that race for many steps in a row."""
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    step = async_engine.engine.step
    steps = 0

    def counted_step():
        nonlocal steps
        steps += 1
        time.sleep(0.02)  # a step that holds the lock long enough for a call to queue behind it
        return step()

    async_engine.engine.step = counted_step

    async def main():
        stream = await async_engine.add_request("busy", {"prompt_token_ids": list(range(20))}, params)
        waited = []
        for _ in range(10):
            before = steps
            await async_engine.call(lambda engine: engine.allocator.stats())
            waited.append(steps - before)
        assert await asyncio.to_thread(async_engine.abort, "busy")
        return waited, [output async for output in stream]

    waited, outputs = asyncio.run(main())
    assert outputs[-1].outputs[0].finish_reason == "abort"
    # The call waits out the step in progress and at most the one that began while it was queued.
    assert max(waited) <= 2, waited


def _counting_aborts(tiny_models) -> tuple[AsyncLLMEngine, list[str]]:
    aborts: list[str] = []
    engine = LLMEngine(tiny_models["llama"], EngineArgs(dtype="float32", max_model_len=256))
    return AsyncLLMEngine(engine, on_abort=lambda: aborts.append("abort")), aborts


async def _until_idle(engine: AsyncLLMEngine) -> None:
    while engine.run_locked(lambda e: e.has_unfinished_requests()):
        await asyncio.sleep(0.05)


LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
PROMPT = {"prompt_token_ids": list(range(30, 60))}


def test_a_reader_cancelled_while_every_worker_thread_is_busy_still_aborts(tiny_models):
    """Starlette cancels a streaming response's scope when its client leaves, and anyio then cancels every await
    in it at once, the stream's abort among them: with the pool's threads busy, the abort was dropped before
    any ran it, and the request went on unread to max_tokens."""
    engine, aborts = _counting_aborts(tiny_models)

    async def main() -> None:
        stream = await engine.add_request("left", PROMPT, LONG)
        await anext(stream)
        loop, release = asyncio.get_running_loop(), threading.Event()
        busy = [loop.run_in_executor(None, release.wait) for _ in range(min(32, (os.cpu_count() or 1) + 4))]
        with anyio.CancelScope() as scope:
            scope.cancel()
            await stream.aclose()  # the reader leaves inside a cancelled scope
        release.set()
        await asyncio.gather(*busy)
        await _until_idle(engine)

    try:
        asyncio.run(main())
        assert aborts == ["abort"]  # stopped, not run to its 200 tokens
    finally:
        engine.shutdown()
    assert engine.engine.allocator.check_integrity().in_use == 0


def test_a_caller_cancelled_while_its_request_waits_for_the_step_lock_leaves_nothing_running(tiny_models):
    """The request is added in a worker thread once the step in progress ends; a caller cancelled meanwhile
    never gets its stream, so nobody would read or abort it."""
    engine, aborts = _counting_aborts(tiny_models)
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=engine.run_locked, args=(lambda _: (held.set(), release.wait()),))

    async def main() -> None:
        holder.start()
        held.wait()  # a long step in progress, as far as new requests can tell
        adding = asyncio.ensure_future(engine.add_request("never-read", PROMPT, LONG))
        await asyncio.sleep(0.2)  # its thread waits for the lock
        adding.cancel()
        with pytest.raises(asyncio.CancelledError):
            await adding
        release.set()
        await asyncio.sleep(0.2)
        await _until_idle(engine)

    try:
        asyncio.run(main())
        assert aborts == ["abort"]
    finally:
        release.set()
        engine.shutdown()
    assert engine.engine.allocator.check_integrity().in_use == 0
