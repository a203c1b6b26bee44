"""`kvferry up --prefill 2 --decode 2` with no --model serves the default model (SmolLM2-135M-Instruct) as
smollm2-135m-instruct; greedy output through prefill -> decode equals transformers', the official
openai client gets Paris for the capital of France, structured outputs fit 22 schemas, required tool calls
fit their tools' schemas, and a Responses conversation remembers its first turn, whose KV the second reuses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel
from support.real_model import MAX_NEW_TOKENS
from support.redis_server import free_port
from support.structured_schemas import SCHEMAS
from support.tool_call_stream import streamed_tool_calls

SERVED_NAME = "smollm2-135m-instruct"
STRUCTURED_MAX_TOKENS = 300
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def router(smollm2):  # smollm2: the cache holds the default model before kvferry up looks for it
    port = free_port()
    args = [sys.executable, "-m", "kvferry", "up", "--prefill", "2", "--decode", "2", "--port", str(port)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url, deadline, seen = None, time.monotonic() + 300, []
    for line in process.stdout:  # type: ignore[union-attr]
        seen.append(line)
        if match := re.match(r"\s+router ready at (\S+)", line):
            url = match[1]
        if "is up at" in line or time.monotonic() > deadline:
            break
    assert url and f"model {SERVED_NAME}" in seen[-1], "".join(seen)
    yield url
    os.killpg(process.pid, signal.SIGINT)
    try:
        assert process.wait(timeout=45) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def _answer(router: str, case) -> list[int]:
    body = {"model": SERVED_NAME, "max_tokens": MAX_NEW_TOKENS, "temperature": 0}
    if case.chat:
        body["messages"] = [{"role": "user", "content": case.text}]
    else:
        body["prompt"] = case.text
    path = "/v1/chat/completions" if case.chat else "/v1/completions"
    response = httpx.post(f"{router}{path}", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def test_greedy_output_through_prefill_and_decode_equals_transformers(router, smollm2_greedy):
    expected = [case.output_ids for case in smollm2_greedy]
    assert [_answer(router, case) for case in smollm2_greedy] == expected  # one at a time
    with ThreadPoolExecutor(len(smollm2_greedy)) as pool:  # all at once
        assert list(pool.map(lambda case: _answer(router, case), smollm2_greedy)) == expected


def test_the_openai_client_learns_the_capital_of_france(router):
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key="unused")
    assert [model.id for model in client.models.list().data] == [SERVED_NAME]
    reply = client.chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0, max_tokens=32
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


def _schema_prompt(name: str, example: str) -> list[dict[str, str]]:
    # With an example to go by: asked for the schema alone, this 135M model loops inside a string or an array
    # (a dozen of the 22 ran to max_tokens, greedy); the grammar keeps the form, the model must still end.
    return [{"role": "user", "content": f"Write another {name.replace('_', ' ')} as JSON, as short as this one: {example}"}]


def test_structured_outputs_fit_every_schema_and_prefill_decode_equals_colocated(router, smollm2):
    """The official client's parse() with each of 22 Pydantic models through prefill -> decode: every answer
    parses and validates, and its greedy text is the colocated engine's (the same model in this process,
    with the same grammar: the strict schema parse() sends, every field required, an optional one nullable)."""
    from openai import OpenAI
    from openai.lib._parsing._completions import type_to_response_format_param

    from kvferry.engine import LLM, SamplingParams
    from kvferry.engine.sampling_params import Grammar

    client = OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0, timeout=600)

    def parsed(item: tuple[str, tuple]) -> tuple[str, str]:
        name, (model, example) = item
        answer = client.beta.chat.completions.parse(model=SERVED_NAME, messages=_schema_prompt(name, example),
                                                    response_format=model, temperature=0, max_tokens=STRUCTURED_MAX_TOKENS)
        choice = answer.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, model), (name, choice)
        return name, choice.message.content

    with ThreadPoolExecutor(8) as pool:
        served = dict(pool.map(parsed, SCHEMAS.items()))

    colocated = LLM(smollm2.folder, max_model_len=2048)  # the nodes' dtype: the model's own
    tokenizer = colocated.engine.tokenizer
    # As the router encodes a chat: the template writes the special tokens itself.
    prompts = [{"prompt_token_ids": tokenizer.encode(tokenizer.apply_chat_template(_schema_prompt(name, example)),
                                                     add_special_tokens=False)}
               for name, (_, example) in SCHEMAS.items()]
    sent = [type_to_response_format_param(model)["json_schema"]["schema"] for model, _ in SCHEMAS.values()]  # type: ignore[index]
    params = [SamplingParams(temperature=0, max_tokens=STRUCTURED_MAX_TOKENS, grammar=Grammar("json_schema", json.dumps(schema)))
              for schema in sent]
    expected = [output.outputs[0].text for output in colocated.generate(prompts, params)]
    assert served == dict(zip(SCHEMAS, expected, strict=True))


class _Weather(BaseModel):
    city: Literal["Paris", "Tokyo", "Lima"]
    unit: Literal["celsius", "fahrenheit"]


class _Time(BaseModel):
    zone: Literal["CET", "JST", "PET"]


TOOL_ARGUMENTS = {"get_weather": _Weather, "get_time": _Time}
TOOLS = [{"type": "function", "function": {"name": name, "description": description, "parameters": model.model_json_schema()}}
         for (name, model), description in zip(TOOL_ARGUMENTS.items(), ("the weather in a city", "the time in a zone"),
                                               strict=True)]


def test_required_tool_calls_validate_and_a_round_trip_answers(router):
    """tool_choice=required with the official client, whole and streamed, through prefill -> decode: each call
    names a tool and its arguments validate; the call and its result go back and the model answers in text."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    request = {"model": SERVED_NAME, "messages": messages, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
               "max_tokens": 100}
    whole = client.chat.completions.create(**request).choices[0]
    calls = [(call.function.name, call.function.arguments) for call in whole.message.tool_calls]
    assert whole.finish_reason == "tool_calls" and calls, whole
    assert all(TOOL_ARGUMENTS[name].model_validate_json(arguments) for name, arguments in calls), calls
    assert streamed_tool_calls(client.chat.completions.create(**request, stream=True)) == (calls, "tool_calls")
    results = [{"role": "tool", "tool_call_id": call.id, "content": "18 degrees celsius and sunny"}
               for call in whole.message.tool_calls]
    final = client.chat.completions.create(model=SERVED_NAME, messages=[*messages, whole.message.model_dump(exclude_none=True),
                                                                        *results],
                                           tools=TOOLS, tool_choice="none", temperature=0, max_tokens=40).choices[0]
    assert final.message.content and not final.message.tool_calls, final


def test_a_responses_conversation_remembers_its_first_turn_and_reuses_its_kv(router):
    """Two turns of /v1/responses, the second by previous_response_id, whole and streamed: the model answers
    from the first turn's words (asked alone, it cannot), and the second prompt's cached tokens cover the first
    turn's whole blocks."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0, timeout=300)
    question = {"model": SERVED_NAME, "input": "What number did I ask you to remember?", "temperature": 0,
                "max_output_tokens": 30}
    assert "42" not in client.responses.create(**question).output_text
    first = client.responses.create(model=SERVED_NAME, input="Remember the number 42.", temperature=0,
                                    max_output_tokens=40)
    for stream in (False, True):
        request = {**question, "previous_response_id": first.id}
        second = list(client.responses.create(**request, stream=True))[-1].response if stream else \
            client.responses.create(**request)
        assert "42" in second.output_text, second.output_text
        assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // 16 * 16 > 0, second.usage
