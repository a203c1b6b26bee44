"""Bounded client loops against the router, run in threads while a test disturbs the cluster.

Each request streams a greedy completion of one of a few prompts, always `MAX_TOKENS` long (ignore_eos), so
that a stream cut short, or one with a token lost or repeated across a migration, shows. Its outcome is one
of three:
- answered: every token, the text the prompt's undisturbed run gave, then `[DONE]`;
- refused: the client was told, cleanly: a status the router turns requests away with (429, 502, 503, 504)
  and an OpenAI error body, or an error event in the stream. Each records how long the client waited
  without news (since its request or its last token), the promise being a fast error, not a hang;
- failed: anything else: a dropped connection, a timeout, a 500, a stream that ends without its tokens or
  with other text.
Where a peer of the lost node exists, the promise is that nothing is refused or fails; where none does,
refusals come within seconds and nothing fails.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

REFUSAL_STATUSES = (429, 502, 503, 504)
MAX_TOKENS = 24
PROMPTS = (
    "The capital of France is",
    "A short story about a lighthouse keeper:",
    "The three primary colors are",
    "Water boils at",
    "The largest planet in the solar system is",
    "A recipe for bread starts with",
    "The first law of thermodynamics says",
    "My favourite season is autumn because",
)
CLIENT_TIMEOUT_S = 60.0


def request_body(model: str, prompt: str, stream: bool) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}


def undisturbed_texts(router: str, model: str) -> dict[str, str]:
    """Each prompt's greedy text from a cluster left alone: what every stream of it must give."""
    texts = {}
    for prompt in PROMPTS:
        response = httpx.post(f"{router}/v1/completions", json=request_body(model, prompt, stream=False),
                              timeout=CLIENT_TIMEOUT_S)
        assert response.status_code == 200, response.text
        texts[prompt] = response.json()["choices"][0]["text"]
    return texts


@dataclass
class Outcomes:
    answered: int = 0
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    answered_in_a_row: int = 0  # since the last refusal or failure
    longest_wait_for_refusal_s: float = 0.0  # without news before a refusal: since the request or its last token
    answers: dict[str, int] = field(default_factory=dict)  # by the expected text they gave: "text 0", "text 1"

    def __str__(self) -> str:
        return (f"{self.answered} answered, {len(self.refused)} refused (waited at most "
                f"{self.longest_wait_for_refusal_s:.1f} s), {len(self.failed)} failed")

    def described(self) -> str:
        """The counts, and the first failures and refusals as the client saw them."""
        return f"{self}; first failed: {self.failed[:3]}; first refused: {self.refused[:3]}"


@dataclass
class _Stream:
    text: str = ""
    tokens: int | None = None
    error: str | None = None
    done: bool = False
    last_news: float = field(default_factory=time.monotonic)


class ServingLoop:
    """`workers` clients, each streaming one request after another, until stopped, or `max_requests` in all,
    or `max_seconds`. `expected` holds each prompt's undisturbed text (undisturbed_texts), or the texts it may
    be (across a model change, either model's: never a mix of the two)."""

    def __init__(self, router: str, model: str, expected: Mapping[str, str | tuple[str, ...]], workers: int = 4,
                 max_requests: int = 400, max_seconds: float = 300.0) -> None:
        self.router, self.model, self.workers = router, model, workers
        self.expected = {prompt: (texts,) if isinstance(texts, str) else texts for prompt, texts in expected.items()}
        self.max_requests, self.max_seconds = max_requests, max_seconds
        self.outcomes = Outcomes()
        self._lock = threading.Lock()
        self._numbers = iter(range(max_requests))
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="serving-loop")
        self._clients: list = []

    def __enter__(self) -> ServingLoop:
        deadline = time.monotonic() + self.max_seconds
        self._clients = [self._pool.submit(self._run, deadline) for _ in range(self.workers)]
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> Outcomes:
        self._stop.set()
        for client in self._clients:
            client.result(timeout=CLIENT_TIMEOUT_S * 2)  # a client's own error fails the test here
        self._pool.shutdown()
        return self.snapshot()

    def snapshot(self) -> Outcomes:
        with self._lock:
            o = self.outcomes
            return Outcomes(o.answered, list(o.refused), list(o.failed), o.answered_in_a_row,
                            o.longest_wait_for_refusal_s, dict(o.answers))

    def _next_number(self) -> int | None:
        with self._lock:
            return next(self._numbers, None)

    def _run(self, deadline: float) -> None:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                number = self._next_number()
                if number is None:
                    return
                try:
                    outcome = self._one(client, number)
                except Exception as exc:  # noqa: BLE001 - an answer the client cannot read fails; the loop goes on
                    outcome = "failed", f"request {number}: {type(exc).__name__}: {exc}", 0.0
                self._record(*outcome)
                if outcome[0] != "answered":
                    time.sleep(0.2)  # as a client backing off would

    def _one(self, client: httpx.Client, number: int) -> tuple[str, str, float]:
        prompt = PROMPTS[number % len(PROMPTS)]
        stream = _Stream()
        try:
            with client.stream("POST", f"{self.router}/v1/completions",
                               json=request_body(self.model, prompt, stream=True)) as response:
                if response.status_code != 200:
                    return self._refusal_or_failure(number, response.status_code, response.read(), stream)
                for line in response.iter_lines():
                    _read_event(line, stream)
        except httpx.HTTPError as exc:
            return "failed", f"request {number}: {type(exc).__name__}: {exc}", 0.0
        waited = time.monotonic() - stream.last_news
        if stream.error is not None:
            return "refused", f"request {number}: error event after {len(stream.text)} chars: {stream.error}", waited
        if not stream.done or stream.tokens != MAX_TOKENS or stream.text not in self.expected[prompt]:
            return "failed", (f"request {number}: {stream.tokens} tokens, done {stream.done}, text {stream.text!r} "
                              f"where one of {self.expected[prompt]!r}"), 0.0
        return "answered", f"text {self.expected[prompt].index(stream.text)}", 0.0

    @staticmethod
    def _refusal_or_failure(number: int, status: int, body: bytes, stream: _Stream) -> tuple[str, str, float]:
        waited = time.monotonic() - stream.last_news
        detail = f"request {number}: {status} {body[:300].decode(errors='replace')}"
        try:
            clean = status in REFUSAL_STATUSES and isinstance(json.loads(body).get("error"), dict)
        except ValueError:
            clean = False
        return ("refused" if clean else "failed"), detail, waited

    def _record(self, kind: str, detail: str, waited: float) -> None:
        with self._lock:
            o = self.outcomes
            if kind == "answered":
                o.answered += 1
                o.answered_in_a_row += 1
                o.answers[detail] = o.answers.get(detail, 0) + 1
                return
            o.answered_in_a_row = 0
            if kind == "refused":
                o.refused.append(detail)
                o.longest_wait_for_refusal_s = max(o.longest_wait_for_refusal_s, waited)
            else:
                o.failed.append(detail)


def _read_event(line: str, stream: _Stream) -> None:
    if line == "data: [DONE]":
        stream.done = True
        return
    if not line.startswith("data: {"):
        return
    event = json.loads(line.removeprefix("data: "))
    stream.last_news = time.monotonic()
    if "error" in event:
        stream.error = event["error"].get("message")
    if event.get("usage"):
        stream.tokens = event["usage"]["completion_tokens"]
    for choice in event.get("choices", []):
        stream.text += choice["text"]
