"""`kvferry up --prefill 2 --decode 2` with no --model serves the default model (SmolLM2-135M-Instruct) as
smollm2-135m-instruct; greedy output through prefill -> decode equals transformers', and the official
openai client gets Paris for the capital of France."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support.real_model import MAX_NEW_TOKENS
from support.redis_server import free_port

SERVED_NAME = "smollm2-135m-instruct"
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
