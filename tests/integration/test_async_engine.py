import asyncio

import pytest
from kvferry.engine import LLM, AsyncLLMEngine, LLMEngine, SamplingParams
from kvferry.engine.engine_args import EngineArgs


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
