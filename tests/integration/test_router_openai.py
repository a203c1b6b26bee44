"""The router in front of real node processes (tiny model, UCX, redis-server), driven by the official
`openai` client: completions and chat, streaming or not, n, stop, usage, errors; the P/D fallbacks,
colocated mode, prefix-aware routing over the Redis index, aborts, plugins, auth and metrics; and
schemathesis against the router's own OpenAPI document."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from pydantic import BaseModel, Field
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from support.fake_node import StallingPrefillNode
from support.processes import Processes
from support.redis_server import free_port
from support.tool_call_stream import streamed_tool_calls
from tokenizers import Tokenizer

pytestmark = pytest.mark.slow
API_KEY = "sk-router-test"
STALL_TIMEOUT_SECONDS = 3.0
AUTO_MIN_TOKENS = 40  # the auto_pd router's threshold of uncached prompt tokens
MAX_EXAMPLES = 30  # per operation: the whole schema run stays well under two minutes


@pytest.fixture(scope="module")
def stalling_prefill() -> Iterator[StallingPrefillNode]:
    node = StallingPrefillNode()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def cluster(tiny_models, redis_url, tmp_path_factory, stalling_prefill) -> Iterator[dict[str, str]]:
    """Two prefill nodes and one decode node, and routers in front of them in several set-ups."""
    folder = tmp_path_factory.mktemp("router-cluster")
    model = str(tiny_models["llama"])
    processes = Processes(folder)
    urls: dict[str, str] = {}
    suffix = os.urandom(3).hex()  # node names are unique in the session's shared Redis
    for name, role in (("prefill-0", "prefill"), ("prefill-1", "prefill"), ("decode-0", "decode")):
        port = free_port()
        urls[name] = f"http://127.0.0.1:{port}"
        processes.spawn(name, role, "--model", model, "--name", f"rt-{name}-{suffix}", "--registry", redis_url,
                        "--port", str(port))
    plugins = folder / "plugins.yaml"
    plugins.write_text(json.dumps({"plugins": [
        {"name": "system_prompt", "options": {"prompt": "You are terse."}},
        {"name": "prompt_guard", "options": {"deny": ["forbidden"]}},
    ]}))
    short_prefill = folder / "short-prefill.yaml"
    short_prefill.write_text(json.dumps({"prefill_timeout_seconds": STALL_TIMEOUT_SECONDS, "max_inflight": 1}))
    auto_pd = folder / "auto-pd.yaml"  # the P/D decision before it has measured anything: a token threshold
    auto_pd.write_text(json.dumps({"disaggregation": "auto", "disaggregation_min_tokens": AUTO_MIN_TOKENS}))
    dead_port = free_port()
    nodes = ["--decode", urls["decode-0"]]
    routers = {
        "router": ["--prefill", urls["prefill-0"], "--prefill", urls["prefill-1"], *nodes, "--redis-url", redis_url],
        "colocated": [*nodes, "--redis-url", redis_url, "--policy", "least_load"],
        "dead_prefill": ["--prefill", f"http://127.0.0.1:{dead_port}", *nodes],
        "guarded": [*nodes, "--api-key", API_KEY, "--router-config", str(plugins)],
        "schema": [*nodes, "--max-model-len", "48", "--redis-url", redis_url],
        "stalled": ["--prefill", stalling_prefill.url, *nodes, "--router-config", str(short_prefill)],
        "auto_pd": ["--prefill", urls["prefill-0"], *nodes, "--router-config", str(auto_pd)],
        "permissive": [*nodes, "--unsupported-fields", "warn"],
        "thinking": ["--prefill", urls["prefill-0"], *nodes, "--chat-template",
                     str(Path(__file__).parent.parent / "support" / "thinking_chat_template.jinja")],
    }
    for name, args in routers.items():
        urls[name] = f"http://127.0.0.1:{free_port()}"
        processes.spawn(name, "router", "--model", model, "--port", urls[name].rsplit(":", 1)[1], *args)
    try:
        processes.wait_healthy(urls)
        processes.wait_healthy({name: urls[name] for name in routers}, "/ready")
        yield urls
    finally:
        processes.stop()


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
GREEDY_BODY = {"temperature": 0, "ignore_eos": True}  # the same, in a raw body


def test_completions_and_chat_with_usage(cluster):
    api = client(cluster["router"])
    completion = api.completions.create(model="llama", prompt="The cat sat on", max_tokens=6, **GREEDY)
    assert completion.object == "text_completion" and completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 6 and completion.usage.total_tokens == completion.usage.prompt_tokens + 6
    chat = api.chat.completions.create(model="llama", messages=[{"role": "user", "content": "Hi there"}],
                                       max_completion_tokens=5, **GREEDY)
    assert chat.choices[0].message.role == "assistant" and isinstance(chat.choices[0].message.content, str)
    assert chat.usage.completion_tokens == 5 and chat.usage.prompt_tokens > 2  # the template adds its markers
    assert [m.id for m in api.models.list().data] == ["llama"]


def test_streams_match_the_whole_responses(cluster):
    api = client(cluster["router"])
    whole = api.completions.create(model="llama", prompt="Once upon a time", max_tokens=8, **GREEDY)
    chunks = list(api.completions.create(model="llama", prompt="Once upon a time", max_tokens=8, stream=True,
                                         stream_options={"include_usage": True}, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

    messages = [{"role": "user", "content": "Tell me a story"}]
    whole_chat = api.chat.completions.create(model="llama", messages=messages, max_tokens=7, **GREEDY)
    stream = list(api.chat.completions.create(model="llama", messages=messages, max_tokens=7, stream=True, **GREEDY))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == whole_chat.choices[0].message.content
    assert stream[-1].choices[0].finish_reason == "length" and all(c.usage is None for c in stream)


def test_n_choices_seeded_and_stop_strings(cluster):
    api = client(cluster["router"])
    many = api.completions.create(model="llama", prompt="Colors:", max_tokens=5, n=3, seed=11, extra_body={"ignore_eos": True})
    again = api.completions.create(model="llama", prompt="Colors:", max_tokens=5, n=3, seed=11, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in many.choices) == [0, 1, 2] and many.usage.completion_tokens == 15
    assert [c.text for c in many.choices] == [c.text for c in again.choices]  # seeded: repeatable
    assert len({c.text for c in many.choices}) > 1  # ... and the choices differ from each other

    full = api.completions.create(model="llama", prompt="Numbers:", max_tokens=12, **GREEDY).choices[0].text
    stop = full[len(full) // 2:][:3]
    assert stop.strip(), full
    stopped = api.completions.create(model="llama", prompt="Numbers:", max_tokens=12, stop=[stop], **GREEDY).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == full[: full.index(stop)]


def test_logprobs_name_the_sampled_token_and_the_top_alternatives(cluster):
    api = client(cluster["router"])
    result = api.completions.create(model="llama", prompt="Hello", max_tokens=3, logprobs=2, **GREEDY).choices[0]
    assert len(result.logprobs.tokens) == 3 and "".join(result.logprobs.tokens) == result.text
    for sampled, top in zip(result.logprobs.token_logprobs, result.logprobs.top_logprobs, strict=True):
        assert len(top) == 2 and max(top.values()) == pytest.approx(sampled)  # greedy: the best is the one sampled
    chat = api.chat.completions.create(model="llama", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       logprobs=True, top_logprobs=3, **GREEDY).choices[0]
    assert [len(item.top_logprobs) for item in chat.logprobs.content] == [3, 3]


def test_bad_requests_raise_the_clients_error_classes(cluster):
    api = client(cluster["router"])
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        api.completions.create(model="llama", prompt="x", max_tokens=100_000)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        api.completions.create(model="llama", prompt="x", temperature=7)
    with pytest.raises(openai.BadRequestError, match="messages"):
        api.chat.completions.create(model="llama", messages=[])
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        api.completions.create(model="gpt-4", prompt="x")
    too_big = httpx.post(f"{cluster['router']}/v1/completions", content=b"x" * (2 << 20),
                         headers={"content-type": "application/json"})
    assert too_big.status_code == 413 and too_big.json()["error"]["type"] == "invalid_request_error"


UNSUPPORTED = {
    "prediction": {"prediction": {"type": "content", "content": "x"}},
    "audio": {"audio": {"voice": "alloy", "format": "mp3"}},
    "logit_bias": {"logit_bias": {"5": 10}},
    "messages[0].audio": {"messages": [{"role": "assistant", "content": "x", "audio": {"id": "a"}}]},
    "messages[0].content[0].type=image_url": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]},
    "stream_options.continuous_usage_stats": {"stream": True, "stream_options": {"continuous_usage_stats": True}},
}


@pytest.mark.parametrize("field", list(UNSUPPORTED))
def test_a_field_kvferry_does_not_implement_is_refused_by_name(cluster, field):
    """Never dropped without a word: a 400 that names the field (the client's BadRequestError), or, on a router
    set to `unsupported_fields: warn`, an answer and a line in its log."""
    body = {"model": "llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **UNSUPPORTED[field]}
    refused = httpx.post(f"{cluster['router']}/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == (field, "unsupported_parameter") and field in error["message"]
    answered = httpx.post(f"{cluster['permissive']}/v1/chat/completions", json=body, timeout=60)
    assert answered.status_code == 200, answered.text


def test_echo_puts_the_prompt_before_each_choice_whole_and_streamed(cluster, tiny_models):
    api = client(cluster["router"])
    plain = api.completions.create(model="llama", prompt="The cat sat on", max_tokens=5, **GREEDY).choices[0].text
    echoed = api.completions.create(model="llama", prompt="The cat sat on", max_tokens=5, echo=True, **GREEDY)
    assert echoed.choices[0].text == "The cat sat on" + plain and echoed.usage.completion_tokens == 5
    streamed = api.completions.create(model="llama", prompt="The cat sat on", max_tokens=5, echo=True, stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == echoed.choices[0].text
    tokenizer = Tokenizer.from_file(str(tiny_models["llama"] / "tokenizer.json"))
    ids = tokenizer.encode("Once upon a time", add_special_tokens=False).ids
    by_ids = api.completions.create(model="llama", prompt=ids, max_tokens=3, echo=True, **GREEDY).choices[0].text
    assert by_ids.startswith(tokenizer.decode(ids)) and len(by_ids) > len(tokenizer.decode(ids))
    with pytest.raises(openai.BadRequestError, match="echo with logprobs"):
        api.completions.create(model="llama", prompt="x", max_tokens=2, echo=True, logprobs=1)


def test_min_tokens_holds_back_a_stop_token(cluster):
    api = client(cluster["router"])
    first = api.completions.create(model="llama", prompt="Numbers:", max_tokens=8, **GREEDY).choices[0]
    stop = {"stop_token_ids": [first.token_ids[0]]}
    stopped = api.completions.create(model="llama", prompt="Numbers:", max_tokens=8, temperature=0, extra_body=stop)
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1
    held = api.completions.create(model="llama", prompt="Numbers:", max_tokens=8, temperature=0,
                                  extra_body={**stop, "min_tokens": 4}).choices[0]
    assert len(held.token_ids) >= 4 and first.token_ids[0] not in held.token_ids[:4]
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        api.completions.create(model="llama", prompt="x", max_tokens=2, extra_body={"min_tokens": 3})


def test_best_of_returns_the_most_likely_of_its_choices(cluster):
    """best_of=3 with a seed generates what n=3 with that seed does (choice j is seeded seed + j) and returns
    the one whose tokens' logprobs sum highest; usage counts all three."""
    api = client(cluster["router"])
    sampled = {"temperature": 1.0, "seed": 21, "extra_body": {"ignore_eos": True}}
    three = api.completions.create(model="llama", prompt="Colors:", max_tokens=6, n=3, logprobs=0, **sampled)
    likeliest = max(three.choices, key=lambda c: sum(c.logprobs.token_logprobs))
    best = api.completions.create(model="llama", prompt="Colors:", max_tokens=6, best_of=3, user="agent-7", **sampled)
    assert [(c.index, c.text, c.logprobs) for c in best.choices] == [(0, likeliest.text, None)]
    assert best.usage.completion_tokens == three.usage.completion_tokens == 18
    with pytest.raises(openai.BadRequestError, match="best_of"):
        api.completions.create(model="llama", prompt="x", max_tokens=2, n=3, best_of=2)
    with pytest.raises(openai.BadRequestError, match="cannot be streamed"):
        api.completions.create(model="llama", prompt="x", max_tokens=2, best_of=2, stream=True)


class Reading(BaseModel):
    unit: Literal["celsius", "kelvin"]
    value: int = Field(ge=-40, le=500)
    ok: bool
    tags: list[Literal["indoor", "outdoor", "lab"]] = Field(max_length=3)


def test_structured_outputs_parse_and_are_the_same_through_prefill_and_decode(cluster):
    """The official client's parse() with a Pydantic model (a random model writes nothing meaningful: every
    field is bounded, so the form is what counts), greedy on P -> D equal to colocated, streamed equal to
    whole; vLLM's structured_outputs regex and choice."""
    messages = [{"role": "user", "content": "A reading, please"}]
    outputs = {}
    for router in ("router", "colocated"):
        parsed = client(cluster[router]).beta.chat.completions.parse(
            model="llama", messages=messages, response_format=Reading, max_tokens=150, temperature=0)
        choice = parsed.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Reading), choice
        outputs[router] = choice.message.content
    assert outputs["router"] == outputs["colocated"]
    api = client(cluster["router"])
    regex = {"structured_outputs": {"regex": "[a-z]{3}-[0-9]{2}"}}
    whole = api.completions.create(model="llama", prompt="Code:", max_tokens=20, temperature=0, extra_body=regex)
    assert re.fullmatch("[a-z]{3}-[0-9]{2}", whole.choices[0].text), whole
    streamed = api.completions.create(model="llama", prompt="Code:", max_tokens=20, temperature=0, stream=True,
                                      extra_body=regex)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text
    chosen = api.chat.completions.create(model="llama", messages=messages, max_tokens=10, temperature=1.0, seed=4, n=3,
                                         extra_body={"structured_outputs": {"choice": ["up", "down"]}})
    assert {c.message.content for c in chosen.choices} <= {"up", "down"}


@pytest.mark.parametrize(("fields", "param", "message"), [
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "needs its json_schema"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs", "give one"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs", "at least 1"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
     None, "json_schema grammar does not compile"),
    ({"response_format": {"type": "json_object"}, "min_tokens": 2}, None, "min_tokens cannot be combined"),
])
def test_a_structured_output_that_cannot_be_is_refused_by_name(cluster, fields, param, message):
    body = {"model": "llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **fields}
    refused = httpx.post(f"{cluster['router']}/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert message in error["message"] and (param is None or error["param"] == param), error


class WeatherArgs(BaseModel):
    city: Literal["Paris", "Oslo", "Lima"]
    days: int = Field(ge=1, le=7)


class LookupArgs(BaseModel):
    query: str = Field(max_length=20)
    exact: bool


TOOL_ARGS = {"weather": WeatherArgs, "lookup": LookupArgs}
TOOLS = [{"type": "function", "function": {"name": name, "description": f"the {name} tool",
                                           "parameters": model.model_json_schema()}} for name, model in TOOL_ARGS.items()]
TOOL_MESSAGES = [{"role": "user", "content": "Weather in Paris for 2 days?"}]


# The tiny model's weights are random: the grammar makes it write a thinking block and an answer.
THINKING_REGEX = r"<think>\n[a-z]{2,7}( [a-z]{2,7}){2,4}\n</think>\n\n[A-Z][a-z]{2,7}( [a-z]{2,7}){1,3}\."


def test_a_thinking_block_goes_to_reasoning_content_through_prefill_and_decode(cluster, tiny_models):
    api, tokenizer = client(cluster["thinking"]), Tokenizer.from_file(str(tiny_models["llama"] / "tokenizer.json"))
    request = {"model": "llama", "messages": [{"role": "user", "content": "Think, then answer."}], "max_tokens": 80,
               "temperature": 0, "extra_body": {"structured_outputs": {"regex": THINKING_REGEX}}}
    choice = api.chat.completions.create(**request).choices[0]
    written = tokenizer.decode(choice.token_ids)
    thinking, answer = re.fullmatch(r"<think>\n(.*)\n</think>\n\n(.*)", written).groups()
    assert (choice.message.reasoning_content, choice.message.content) == (thinking, answer), written
    chunks = list(api.chat.completions.create(**request, stream=True))
    streamed = [getattr(chunk.choices[0].delta, "reasoning_content", None) for chunk in chunks]
    assert "".join(piece or "" for piece in streamed) == thinking and sum(piece is not None for piece in streamed) > 1
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == answer

    # enable_thinking: false: the template closes an empty block in the prompt, and the answer is all content.
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    prompt = httpx.post(f"{cluster['thinking']}/tokenize", json={"model": "llama", "messages": request["messages"], **off},
                        timeout=10).json()["tokens"]
    assert tokenizer.decode(prompt).endswith("<think>\n\n</think>\n\n")
    plain = api.chat.completions.create(**{**request, "extra_body": {**off, "structured_outputs": {"regex": "[A-Z][a-z]{2,7}\\."}}})
    message = plain.choices[0].message
    assert re.fullmatch(r"[A-Z][a-z]{2,7}\.", message.content) and getattr(message, "reasoning_content", None) is None
    refused = httpx.post(f"{cluster['thinking']}/v1/chat/completions", timeout=10, json={
        "model": "llama", "messages": request["messages"], "chat_template_kwargs": {"tools": []}})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "chat_template_kwargs"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "lookup"}}])
def test_forced_tool_calls_fit_their_schemas_through_prefill_and_decode(cluster, tool_choice):
    """A random model's calls, forced by the grammar: each names a tool and its arguments validate against that
    tool's schema; greedy P -> D equals colocated; streamed equals whole."""
    api, named = client(cluster["router"]), isinstance(tool_choice, dict)
    request = {"model": "llama", "messages": TOOL_MESSAGES, "tools": TOOLS, "tool_choice": tool_choice,
               "max_tokens": 200, "temperature": 0, "parallel_tool_calls": False}
    whole = api.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == ("stop" if named else "tool_calls") and choice.message.content is None, choice
    found = [(call.function.name, call.function.arguments) for call in choice.message.tool_calls]
    assert len(found) == 1 and TOOL_ARGS[found[0][0]].model_validate_json(found[0][1]), found
    if named:
        assert found[0][0] == "lookup"
    colocated = client(cluster["colocated"]).chat.completions.create(**request).choices[0].message.tool_calls
    assert [(call.function.name, call.function.arguments) for call in colocated] == found
    assert streamed_tool_calls(api.chat.completions.create(**request, stream=True)) == (found, choice.finish_reason)


def test_parallel_required_calls_each_fit_their_schema_whole_and_streamed(cluster):
    """Several calls in one answer (a random model may go on calling until max_tokens: only whole calls count)."""
    request = {"model": "llama", "messages": TOOL_MESSAGES, "tools": TOOLS, "tool_choice": "required",
               "max_tokens": 120, "temperature": 1.0, "seed": 3}
    choice = client(cluster["router"]).chat.completions.create(**request).choices[0]
    calls = [(call.function.name, call.function.arguments) for call in choice.message.tool_calls]
    assert len(calls) >= 2 and all(TOOL_ARGS[name].model_validate_json(arguments) for name, arguments in calls), choice
    assert len({call.id for call in choice.message.tool_calls}) == len(calls)
    streamed = streamed_tool_calls(client(cluster["router"]).chat.completions.create(**request, stream=True))
    assert streamed == (calls, choice.finish_reason)


def test_a_tool_round_trip_renders_the_tools_the_call_and_its_result(cluster):
    """The call goes back as an assistant message, its result as a tool message; the prompt the router renders
    (its /tokenize) holds the tools, the call and the result, and the answer comes."""
    api = client(cluster["router"])
    call = api.chat.completions.create(model="llama", messages=TOOL_MESSAGES, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=200, temperature=0).choices[0].message
    messages = [*TOOL_MESSAGES, call.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "sunny, 21 C"}]
    answer = api.chat.completions.create(model="llama", messages=messages, tools=TOOLS, max_tokens=8, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls"), answer
    rendered = httpx.post(f"{cluster['router']}/tokenize", json={"model": "llama", "messages": messages, "tools": TOOLS},
                          timeout=60).json()["tokens"]
    assert answer.usage.prompt_tokens == len(rendered)
    text = httpx.post(f"{cluster['router']}/detokenize", json={"model": "llama", "tokens": rendered}, timeout=60).json()
    assert "sunny, 21 C" in text["prompt"] and '"name": "lookup"' in text["prompt"], text
    assert call.tool_calls[0].function.name in text["prompt"]


@pytest.mark.parametrize(("fields", "param", "message"), [
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "`nope`"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", "give one"),
    ({"tools": [*TOOLS, TOOLS[0]]}, "tools", "same function name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "tools.0.function.name: String should match"),
])
def test_a_tool_request_that_cannot_be_is_refused_by_name(cluster, fields, param, message):
    body = {"model": "llama", "messages": TOOL_MESSAGES, "max_tokens": 4, **fields}
    refused = httpx.post(f"{cluster['router']}/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert message in error["message"] and error["param"] == param, error


def test_tokenize_and_detokenize_count_as_generation_does(cluster):
    router = cluster["router"]
    chat = {"model": "llama", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 3, **GREEDY_BODY}
    usage = httpx.post(f"{router}/v1/chat/completions", json=chat, timeout=60).json()["usage"]
    counted = httpx.post(f"{router}/tokenize", json={"model": "llama", "messages": chat["messages"]}, timeout=60).json()
    assert counted["count"] == usage["prompt_tokens"] == len(counted["tokens"]) and counted["max_model_len"] > 0
    text = httpx.post(f"{router}/tokenize", json={"model": "llama", "prompt": "The cat sat"}, timeout=60).json()
    back = httpx.post(f"{router}/detokenize", json={"model": "llama", "tokens": text["tokens"]}, timeout=60).json()
    assert back["prompt"] == "The cat sat"
    for path, body, param in (("/tokenize", {"model": "llama"}, "prompt"),
                              ("/tokenize", {"model": "llama", "prompt": "x", "messages": chat["messages"]}, "prompt"),
                              ("/detokenize", {"model": "llama", "tokens": [10**8]}, "tokens")):
        refused = httpx.post(f"{router}{path}", json=body, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    assert httpx.post(f"{router}/tokenize", json={"model": "other", "prompt": "x"}, timeout=60).status_code == 404


def _counters(url: str, family: str) -> dict[str, float]:
    """A router counter's samples by their one label's value."""
    found = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f"kvferry:{family}_total{{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('"')[1]] = float(value)
    return found


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key, 0.0)}


def test_a_disaggregated_request_is_two_calls_one_to_each_node(cluster):
    """The P/D path: D's stream (its first line the reservation), then P's prefill into it; nothing else
    (no second visit to D, no abort) for a request that completes."""
    router = cluster["router"]
    before = _counters(router, "router_node_calls")
    body = {"model": "llama", "prompt": list(range(200, 260)), "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    assert httpx.post(f"{router}/v1/completions", json=body, timeout=60).status_code == 200
    assert _delta(_counters(router, "router_node_calls"), before) == {"decode": 1.0, "prefill": 1.0}


def test_the_pd_decision_keeps_short_prompts_on_the_decode_node(cluster):
    router, direct = cluster["auto_pd"], cluster["router"]
    calls, paths = _counters(router, "router_node_calls"), _counters(router, "pd_decisions")
    short, long = list(range(300, 300 + AUTO_MIN_TOKENS // 2)), list(range(400, 400 + 2 * AUTO_MIN_TOKENS))
    for prompt in (short, long):
        body = {"model": "llama", "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        kept = httpx.post(f"{router}/v1/completions", json=body, timeout=60).json()["choices"][0]["token_ids"]
        always = httpx.post(f"{direct}/v1/completions", json=body, timeout=60).json()["choices"][0]["token_ids"]
        assert kept == always  # either path, the same greedy tokens
    assert _delta(_counters(router, "pd_decisions"), paths) == {"kept_on_decode": 1.0, "disaggregated": 1.0}
    assert _delta(_counters(router, "router_node_calls"), calls) == {"generate": 1.0, "decode": 1.0, "prefill": 1.0}
    assert _stats(router)["disaggregation"] == {"mode": "auto", "threshold_tokens": AUTO_MIN_TOKENS, "samples": 1}


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/stats", headers={"Authorization": f"Bearer {API_KEY}"}).json()


# Seeded: the decode node samples every token, the first too, from one generator, whichever path the prompt
# took (a prefill node, its own prefill, or its fallback after a prefill node failed).
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7, "n": 3}], ids=["greedy", "seeded"])
def test_disaggregated_colocated_and_fallback_paths_give_the_same_tokens(cluster, sampling):
    body = {"model": "llama", "prompt": list(range(40, 90)), "max_tokens": 8, "ignore_eos": True, **sampling}
    tokens = {name: [c["token_ids"] for c in httpx.post(f"{cluster[name]}/v1/completions", json=body, timeout=60).json()["choices"]]
              for name in ("router", "colocated", "dead_prefill")}
    assert tokens["router"] == tokens["colocated"] == tokens["dead_prefill"]
    assert [len(choice) for choice in tokens["router"]] == [8] * sampling.get("n", 1)
    assert _stats(cluster["router"])["local_prefill_fallbacks"] == 0, [
        line for line in httpx.get(f"{cluster['router']}/metrics").text.splitlines() if "fallbacks_total{" in line]
    dead = _stats(cluster["dead_prefill"])
    assert dead["local_prefill_fallbacks"] >= 1
    # The dead node failed its first probe (or the call): ejected, so D prefills with no call to it.
    assert [node["healthy"] for node in dead["nodes"] if node["role"] == "prefill"] == [False]
    metrics = httpx.get(f"{cluster['dead_prefill']}/metrics").text
    assert any(f'kvferry:local_prefill_fallbacks_total{{reason="{reason}"}}' in metrics
               for reason in ("prefill_unreachable", "no_prefill_node")), metrics


def _decisions(url: str, role: str) -> dict[str, float]:
    found = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("kvferry:routing_decisions_total{") and f'role="{role}"' in line:
            node = line.split('node="', 1)[1].split('"', 1)[0]
            found[node] = float(line.rsplit(" ", 1)[1])
    return found


def test_a_repeated_prefix_goes_to_the_prefill_node_that_cached_it(cluster):
    router = cluster["router"]
    shared = list(range(200, 264))  # four full blocks
    body = {"model": "llama", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    httpx.post(f"{router}/v1/completions", json={**body, "prompt": shared + [7]}, timeout=60).raise_for_status()
    before, hits_before = _decisions(router, "prefill"), _stats(router)["prefix_hit_tokens"]
    time.sleep(1.0)  # the node's KV events reach Redis in the background
    for tail in range(5):
        httpx.post(f"{router}/v1/completions", json={**body, "prompt": shared + [tail]}, timeout=60).raise_for_status()
    after = _decisions(router, "prefill")
    grown = {node: after[node] - before.get(node, 0) for node in after if after[node] != before.get(node, 0)}
    assert list(grown.values()) == [5], grown  # all five to one node
    assert _stats(router)["prefix_hit_tokens"] - hits_before == 5 * 64


def _wait(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(condition())


def test_a_hanging_prefill_node_times_out_into_local_prefill_and_fills_the_admission_limit(cluster, stalling_prefill):
    router = cluster["stalled"]
    body = {"model": "llama", "prompt": [3, 4, 5, 6], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        first = pool.submit(httpx.post, f"{router}/v1/completions", json=body, timeout=60)
        assert _wait(lambda: len(stalling_prefill.prefill_ids()) == 1)
        # The one request allowed in flight is waiting on the prefill node: the next one gets 429.
        with pytest.raises(openai.RateLimitError) as refused:
            client(router).completions.create(model="llama", prompt="x", max_tokens=1)
        assert refused.value.response.headers["retry-after"] == "1"
        response = first.result()
    assert response.status_code == 200 and len(response.json()["choices"][0]["token_ids"]) == 4
    assert time.monotonic() - started >= STALL_TIMEOUT_SECONDS
    assert _wait(lambda: stalling_prefill.aborted(stalling_prefill.prefill_ids()[0]))
    assert 'kvferry:local_prefill_fallbacks_total{reason="prefill_timeout"} 1.0' in httpx.get(f"{router}/metrics").text


def test_a_client_that_leaves_during_prefill_aborts_on_both_nodes(cluster, stalling_prefill):
    known = set(stalling_prefill.prefill_ids())
    body = {"model": "llama", "prompt": "Wait for it", "max_tokens": 8, "stream": True}
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream("POST", f"{cluster['stalled']}/v1/completions", json=body, timeout=httpx.Timeout(60, read=1.0)):
            pass
    request_id = next(rid for rid in stalling_prefill.prefill_ids() if rid not in known)
    # Well before the router's own prefill timeout would abort it.
    assert _wait(lambda: stalling_prefill.aborted(request_id), timeout=1.0)
    decode = httpx.get(f"{cluster['decode-0']}/stats").json()
    assert decode["reserved"] == 0 and decode["blocks"]["in_use"] == 0, decode
    assert 'kvferry:router_requests_total{status="499"} 1.0' in httpx.get(f"{cluster['stalled']}/metrics").text


def test_a_client_that_leaves_mid_stream_stops_every_choice_on_the_decode_node(cluster):
    decode = cluster["decode-0"]
    body = {"model": "llama", "prompt": "Go on", "max_tokens": 4000, "n": 16, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{cluster['router']}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert httpx.get(f"{decode}/stats").json()["running"] > 0  # 64k tokens to go: still decoding
    # Aborted on leaving, long before the 16 x 4000 tokens could have been generated.
    assert _wait(lambda: httpx.get(f"{decode}/stats").json()["running"] == 0, timeout=2.0)
    assert httpx.get(f"{decode}/stats").json()["blocks"]["in_use"] == 0


def test_api_keys_and_plugins(cluster):
    guarded = cluster["guarded"]
    with pytest.raises(openai.AuthenticationError):
        client(guarded, "sk-wrong").models.list()
    assert httpx.get(f"{guarded}/health").status_code == 200 and httpx.get(f"{guarded}/ready").status_code == 200
    api = client(guarded, API_KEY)
    with pytest.raises(openai.BadRequestError, match="prompt_guard"):
        api.chat.completions.create(model="llama", messages=[{"role": "user", "content": "a Forbidden topic"}])
    messages = [{"role": "user", "content": "Hi"}]
    plain = client(cluster["colocated"]).chat.completions.create(model="llama", messages=messages, max_tokens=1)
    injected = api.chat.completions.create(model="llama", messages=messages, max_tokens=1)
    assert injected.usage.prompt_tokens > plain.usage.prompt_tokens  # the system prompt went in front


def test_metrics_histograms_count_requests(cluster):
    text = httpx.get(f"{cluster['router']}/metrics").text
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        count = next(line for line in text.splitlines() if line.startswith(f"kvferry:{name}_count"))
        assert float(count.rsplit(" ", 1)[1]) > 0, name
    assert 'kvferry:router_requests_total{status="200"}' in text and 'status="400"' in text


SCHEMA_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_openapi_schema_holds_for_generated_requests(cluster):
    """Every operation of /openapi.json, with generated requests in schemathesis' positive and negative modes: no 5xx, and only the
    statuses, content types and bodies the schema documents. (The router runs with a 48-token context,
    so that generated requests stay short.)"""
    schema = schemathesis.openapi.from_url(f"{cluster['schema']}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"}
    # Requests that fit the schema, and (where an operation takes a body to get wrong) ones that do not.
    cases = [(op, mode) for op in operations for mode in GenerationMode if mode is GenerationMode.POSITIVE or len(op.body)]
    assert any(mode is GenerationMode.NEGATIVE for _, mode in cases)
    for operation, mode in cases:
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def conforms(case) -> None:
            if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
                case.body["model"] = "llama"  # a generated name is a 404 (tested above): reach the rest
            case.call_and_validate(checks=SCHEMA_CHECKS, timeout=60)

        conforms()
    # Generated requests reached the completion routes, valid ones and invalid ones.
    served = httpx.get(f"{cluster['schema']}/metrics").text
    assert 'kvferry:router_requests_total{status="200"}' in served and 'kvferry:router_requests_total{status="400"}' in served
