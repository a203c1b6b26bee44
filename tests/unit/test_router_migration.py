"""The migration loop (router/dispatch/migration.py) over a scripted P/D flow: named fakes, as this test is
about faults, not answers (the real thing: tests/e2e/test_stream_migration.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from opentelemetry.trace import INVALID_SPAN

from kvferry.internal_api import SamplingSpec
from kvferry.router.api.errors import APIError
from kvferry.router.discovery.nodes import NodeView
from kvferry.router.dispatch.migration import Migration
from kvferry.router.dispatch.pd_flow import DecodeNodeLost
from kvferry.router.metrics import RouterMetrics
from kvferry.router.scheduling import Decision

PROMPT = [1, 2, 3]


def _decision(name: str) -> Decision:
    return Decision(decode=NodeView(name=name, url=f"http://{name}", role="decode"), prefill=None, cached_blocks=0)


class ScriptedFlow:
    """A fake P/D flow: each decode node streams its script of token batches, then dies (or finishes)."""

    def __init__(self, scripts: dict[str, tuple[list[list[int]], bool]]) -> None:
        self.scripts = scripts  # node -> (token batches, dies after them)
        self.calls: list[tuple[str, str, list[int]]] = []  # (node, request id, resumed)

    async def stream(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec, decision: Decision,
                     resumed: list[int], trace_headers: dict[str, str]) -> AsyncIterator[list[dict]]:
        node = decision.decode
        self.calls.append((node.name, request_id, resumed))
        batches, dies = self.scripts[node.name]
        for i, tokens in enumerate(batches):
            last = not dies and i == len(batches) - 1
            yield [{"token_ids": tokens, "text": "", "finish_reason": "length" if last else None}]
        if dies:
            raise DecodeNodeLost(node, "connection reset")


def _run(migration: Migration, reschedule) -> list[int]:
    async def collect() -> list[int]:
        tokens = []
        async for batch in migration.stream("req", PROMPT, SamplingSpec(), _decision("d0"), reschedule, INVALID_SPAN):
            tokens += [t for chunk in batch for t in chunk["token_ids"]]
        return tokens

    return asyncio.run(collect())


def test_a_lost_stream_goes_on_elsewhere_with_the_tokens_sent_and_without_the_lost_node():
    flow = ScriptedFlow({"d0": ([[10], [11, 12]], True), "d1": ([[13], [14]], False)})
    asked = []

    async def reschedule(tokens: list[int], lost: set[str], last: NodeView | None) -> Decision:
        asked.append((tokens, lost, last and last.name))
        return _decision("d1")

    metrics = RouterMetrics()
    assert _run(Migration(flow, metrics, max_migrations=1), reschedule) == [10, 11, 12, 13, 14]  # type: ignore[arg-type]
    assert asked == [(PROMPT + [10, 11, 12], {"http://d0"}, "d0")]  # the successor is asked to run d0's model
    assert flow.calls == [("d0", "req", []), ("d1", "req-m1", [10, 11, 12])]
    assert metrics.migrations.labels(outcome="migrated")._value.get() == 1


def test_a_stream_lost_before_its_first_token_may_start_over_on_any_model():
    """Mid-rollout the lost node may have been its model's last decode node; the client has nothing of it yet,
    so the successor need not continue its model (the CI failure of 16.11 in docs/reliability.md)."""
    flow = ScriptedFlow({"d0": ([], True), "d1": ([[13], [14]], False)})
    asked = []

    async def reschedule(tokens: list[int], lost: set[str], last: NodeView | None) -> Decision:
        asked.append((tokens, lost, last))
        return _decision("d1")

    assert _run(Migration(flow, RouterMetrics(), max_migrations=1), reschedule) == [13, 14]  # type: ignore[arg-type]
    assert asked == [(PROMPT, {"http://d0"}, None)]
    assert flow.calls == [("d0", "req", []), ("d1", "req-m1", [])]


def test_migrations_are_bounded_and_then_the_loss_is_the_clients_error():
    flow = ScriptedFlow({"d0": ([[10]], True), "d1": ([[11]], True), "d2": ([[12]], False)})
    nodes = iter(["d1", "d2"])

    async def reschedule(tokens: list[int], lost: set[str], last: NodeView | None) -> Decision:
        return _decision(next(nodes))

    with pytest.raises(APIError) as refused:
        _run(Migration(flow, RouterMetrics(), max_migrations=1), reschedule)  # type: ignore[arg-type]
    assert refused.value.status == 502 and "1 migrations, at most 1" in refused.value.message
    assert [call[0] for call in flow.calls] == ["d0", "d1"]


def test_no_other_decode_node_is_a_clean_503_naming_the_loss():
    flow = ScriptedFlow({"d0": ([[10]], True)})

    async def reschedule(tokens: list[int], lost: set[str], last: NodeView | None) -> Decision:
        raise APIError(503, "no healthy decode node")

    with pytest.raises(APIError) as refused:
        _run(Migration(flow, RouterMetrics(), max_migrations=1), reschedule)  # type: ignore[arg-type]
    assert refused.value.status == 503
    assert "decode node d0 failed" in refused.value.message and "no other decode node" in refused.value.message
