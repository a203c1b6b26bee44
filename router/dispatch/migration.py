"""A choice's stream that outlives its decode node (docs/reliability.md, mid-stream migration).

When the decode node's stream breaks before the last token (the node died, was deleted or cut off), the choice
starts again on another decode node with the prompt plus the tokens the client already has: that node
computes them as prompt (through a prefill node, or itself, as the P/D decision says, reusing cached
prefixes) and streams only what follows, so the client's stream goes on with no token twice and none missing.
Greedy output is the undisturbed output; a seeded one too, as the new node's generator skips the draws of
the resumed tokens (engine/sequence.py). Bounded: `max_migrations` per choice, then the loss is the client's
error (502), as it is at once when no other decode node is up (503).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from opentelemetry.trace import Span

from kvferry import tracing
from kvferry.internal_api import SamplingSpec
from kvferry.router.api.errors import APIError
from kvferry.router.discovery.nodes import NodeView
from kvferry.router.dispatch.pd_flow import DecodeNodeLost, PDFlow
from kvferry.router.metrics import RouterMetrics
from kvferry.router.scheduling import Decision

log = logging.getLogger(__name__)

# Schedules a choice again: its tokens so far (prompt + resumed), the URLs of the decode nodes it lost, and
# the last of them when the choice has output tokens (its successor runs the same model: a stream is one
# model's output, rollout or not); None when it has none, so that any model served under the name may start
# it afresh (mid-rollout the lost node may have been its model's last one).
Reschedule = Callable[[list[int], set[str], NodeView | None], Awaitable[Decision]]


class Migration:
    def __init__(self, flow: PDFlow, metrics: RouterMetrics, max_migrations: int) -> None:
        self.flow, self.metrics, self.max_migrations = flow, metrics, max_migrations

    async def stream(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec, decision: Decision,
                     reschedule: Reschedule, trace_parent: Span) -> AsyncIterator[list[dict[str, Any]]]:
        """PDFlow.stream's batches, continued on another decode node whenever one is lost. `trace_parent`: the
        span the node calls' spans belong to (the request's dispatch)."""
        sent: list[int] = []  # the output tokens the client has
        lost: set[str] = set()
        attempt = 0
        while True:
            node_request_id = request_id if attempt == 0 else f"{request_id}-m{attempt}"
            try:
                async for batch in self.flow.stream(node_request_id, prompt_ids, spec, decision, list(sent),
                                                    tracing.headers_for(trace_parent)):
                    for chunk in batch:
                        sent += chunk["token_ids"]
                    yield batch
                return
            except DecodeNodeLost as exc:
                lost.add(exc.node.url)
                model_of = exc.node if sent else None  # the client has none of its tokens: any model may start over
                decision = await self._elsewhere(exc, prompt_ids + sent, model_of, lost, attempt, reschedule)
                log.warning("%s: %s after %d tokens; goes on on %s", request_id, exc, len(sent), decision.decode.name)
            attempt += 1

    async def _elsewhere(self, exc: DecodeNodeLost, tokens: list[int], model_of: NodeView | None, lost: set[str],
                         attempt: int, reschedule: Reschedule) -> Decision:
        """Where the choice goes on, or the client's error when it may not or cannot."""
        if attempt >= self.max_migrations:
            self.metrics.migrations.labels(outcome="exhausted").inc()
            raise APIError(502, f"{exc} ({attempt} migrations, at most {self.max_migrations})")
        try:
            decision = await reschedule(tokens, lost, model_of)
        except APIError as refused:
            self.metrics.migrations.labels(outcome="no_node").inc()
            raise APIError(refused.status, f"{exc}, and no other decode node can go on: {refused.message}") from None
        self.metrics.migrations.labels(outcome="migrated").inc()
        return decision
