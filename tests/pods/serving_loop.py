"""A bounded client loop against the router, run in a thread while a test disturbs the cluster.

Each outcome is one of three: answered (200 with a completion), refused (a status the router uses to turn
a request away, with an OpenAI error body: the client can retry), or failed (anything else: a dropped
connection, a timeout, a 500, a body that is not a completion). A cluster that loses a node may refuse;
it must never fail.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx

REFUSAL_STATUSES = (429, 502, 503, 504)


@dataclass
class Outcomes:
    answered: int = 0
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    answered_in_a_row: int = 0  # since the last refusal or failure


class ServingLoop:
    """Sends one small greedy completion after another until stopped, or `max_requests`, or `max_seconds`."""

    def __init__(self, router: str, model: str, max_requests: int = 400, max_seconds: float = 300.0) -> None:
        self.router, self.model = router, model
        self.max_requests, self.max_seconds = max_requests, max_seconds
        self.outcomes = Outcomes()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serving-loop", daemon=True)

    def __enter__(self) -> ServingLoop:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> Outcomes:
        self._stop.set()
        self._thread.join(timeout=120)
        return self.snapshot()

    def snapshot(self) -> Outcomes:
        with self._lock:
            return Outcomes(self.outcomes.answered, list(self.outcomes.refused), list(self.outcomes.failed),
                            self.outcomes.answered_in_a_row)

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        with httpx.Client(timeout=60) as client:
            for number in range(self.max_requests):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                self._record(self._one(client, number))

    def _one(self, client: httpx.Client, number: int) -> tuple[str, str]:
        body = {"model": self.model, "prompt": f"Request {number}: the sky is", "max_tokens": 4, "temperature": 0}
        try:
            response = client.post(f"{self.router}/v1/completions", json=body)
        except httpx.HTTPError as exc:
            return "failed", f"request {number}: {type(exc).__name__}: {exc}"
        detail = f"request {number}: {response.status_code} {response.text[:300]}"
        try:
            payload = response.json()
        except ValueError:
            return "failed", detail
        if response.status_code == 200 and payload.get("choices"):
            return "answered", detail
        if response.status_code in REFUSAL_STATUSES and isinstance(payload.get("error"), dict):
            time.sleep(0.2)  # as a client backing off would
            return "refused", detail
        return "failed", detail

    def _record(self, outcome: tuple[str, str]) -> None:
        kind, detail = outcome
        with self._lock:
            if kind == "answered":
                self.outcomes.answered += 1
                self.outcomes.answered_in_a_row += 1
                return
            self.outcomes.answered_in_a_row = 0
            (self.outcomes.refused if kind == "refused" else self.outcomes.failed).append(detail)
