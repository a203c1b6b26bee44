"""/v1/responses through the router, P -> D (tiny model, UCX, redis-server), driven by the official `openai`
client: a turn is the chat request of its conversation (same tokens as chat), `previous_response_id` continues
a stored conversation whose KV the next turn reuses, streaming events add up to the whole response, tool calls
and their results go round, and `store: false`, retrieval and deletion do what OpenAI's do."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import openai
import pytest
from pydantic import BaseModel, Field
from support.processes import Processes
from support.redis_server import free_port

pytestmark = pytest.mark.slow
BLOCK_SIZE = 16  # the nodes' KV block (engine default): prefix caching reuses whole blocks
INSTRUCTIONS = "You are a careful assistant. " * 6  # a first turn of several blocks
GREEDY = {"temperature": 0, "max_output_tokens": 6}


@pytest.fixture(scope="module")
def cluster(tiny_models, redis_url, tmp_path_factory) -> Iterator[dict[str, str]]:
    """One prefill and one decode node; a router over them with Redis (responses stored there) and one without
    (stored in its memory)."""
    processes = Processes(tmp_path_factory.mktemp("responses-cluster"))
    model, suffix = str(tiny_models["llama"]), os.urandom(3).hex()
    urls = {name: f"http://127.0.0.1:{free_port()}" for name in ("prefill", "decode", "router", "memory")}
    for role in ("prefill", "decode"):
        processes.spawn(role, role, "--model", model, "--name", f"resp-{role}-{suffix}", "--registry", redis_url,
                        "--port", urls[role].rsplit(":", 1)[1])
    nodes = ["--prefill", urls["prefill"], "--decode", urls["decode"]]
    processes.spawn("router", "router", "--model", model, "--port", urls["router"].rsplit(":", 1)[1], *nodes,
                    "--redis-url", redis_url)
    processes.spawn("memory", "router", "--model", model, "--port", urls["memory"].rsplit(":", 1)[1], *nodes)
    try:
        processes.wait_healthy(urls)
        processes.wait_healthy({name: urls[name] for name in ("router", "memory")}, "/ready")
        yield urls
    finally:
        processes.stop()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)


def warm_chat(api: openai.OpenAI, messages: list[dict]) -> None:
    """The prompt's blocks cached before the two requests compared: both then compute the same uncached tail
    (a cached prefix and a computed one differ in the last float bits, which can flip a near-tie of greedy)."""
    api.chat.completions.create(model="llama", messages=messages, max_completion_tokens=1, temperature=0)


@pytest.mark.parametrize("router", ["router", "memory"])
def test_a_conversation_is_its_chat_and_the_second_turn_reuses_the_first_turns_kv(cluster, router):
    api = client(cluster[router])
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "Name a color."}]
    warm_chat(api, messages)
    first = api.responses.create(model="llama", instructions=INSTRUCTIONS, input="Name a color.", **GREEDY)
    chat = api.chat.completions.create(model="llama", messages=messages, max_completion_tokens=6, temperature=0)
    assert first.output_text == chat.choices[0].message.content and first.output[0].type == "message"
    assert first.usage.input_tokens == chat.usage.prompt_tokens and first.usage.output_tokens == chat.usage.completion_tokens
    assert first.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")

    # The next turn: the conversation so far (its instructions not carried on, OpenAI's rule), then the input.
    messages += [{"role": "assistant", "content": first.output_text}, {"role": "user", "content": "And another?"}]
    warm_chat(api, messages)
    second = api.responses.create(model="llama", previous_response_id=first.id, instructions=INSTRUCTIONS,
                                  input="And another?", **GREEDY)
    again = api.chat.completions.create(model="llama", messages=messages, max_completion_tokens=6, temperature=0)
    assert second.output_text == again.choices[0].message.content
    assert second.usage.input_tokens == again.usage.prompt_tokens
    assert second.previous_response_id == first.id and api.responses.retrieve(second.id).output_text == second.output_text
    # A third turn, nothing warmed: its prompt starts with the second's, whose blocks a node's prefix cache held.
    third = api.responses.create(model="llama", previous_response_id=second.id, instructions=INSTRUCTIONS,
                                 input="One more?", **GREEDY)
    whole_blocks = second.usage.input_tokens // BLOCK_SIZE * BLOCK_SIZE
    assert whole_blocks > 0 and third.usage.input_tokens_details.cached_tokens >= whole_blocks, third.usage


def test_streamed_events_add_up_to_the_whole_response(cluster):
    api = client(cluster["router"])
    whole = api.responses.create(model="llama", input="Tell me a story.", **GREEDY)
    events = list(api.responses.create(model="llama", input="Tell me a story.", stream=True, **GREEDY))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in ("response.completed",
                                                                                       "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == whole.output_text and final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [item.id for item in done] == [item.id for item in final.output]
    assert api.responses.retrieve(final.id).output_text == whole.output_text  # stored when its stream ended


class Weather(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


TOOLS = [{"type": "function", "name": "weather", "description": "the weather", "parameters": Weather.model_json_schema()}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_and_its_result_go_round(cluster, stream):
    api = client(cluster["router"])
    request = {"model": "llama", "input": "Weather in Oslo?", "tools": TOOLS, "tool_choice": "required",
               "parallel_tool_calls": False, "max_output_tokens": 60, "temperature": 0}
    if stream:
        events = list(api.responses.create(**request, stream=True))
        assert [event.type for event in events if event.type.startswith("response.function_call_arguments")] == [
            "response.function_call_arguments.delta", "response.function_call_arguments.done"]
        response = events[-1].response
    else:
        response = api.responses.create(**request)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "weather" and Weather.model_validate_json(calls[0].arguments), response
    answer = api.responses.create(model="llama", previous_response_id=response.id, tools=TOOLS, max_output_tokens=4,
                                  temperature=0, input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                                         "output": json.dumps({"sky": "clear"})}])
    assert answer.status in ("completed", "incomplete") and answer.usage.input_tokens > response.usage.input_tokens


def test_unstored_deleted_and_unknown_responses(cluster):
    api = client(cluster["router"])
    unstored = api.responses.create(model="llama", input="Hi", store=False, **GREEDY)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as refused:
        api.responses.create(model="llama", input="Hi again", previous_response_id=unstored.id, **GREEDY)
    assert refused.value.body["param"] == "previous_response_id"
    stored = api.responses.create(model="llama", input="Hi", **GREEDY)
    api.responses.delete(stored.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(stored.id)
    with pytest.raises(openai.BadRequestError) as unsupported:
        api.responses.create(model="llama", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://127.0.0.1/x.png"}]}], **GREEDY)
    assert unsupported.value.body["param"] == "input[0].content[0].type=input_image"
