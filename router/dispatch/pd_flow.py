"""The P/D flow of one completion (docs/internals.md): two calls, one to each node. The decode node's
stream opens first; its first line is the reservation's handle, which the prefill call carries; the prefill
node writes the KV into it, and the decode node streams tokens from it on the same connection. Without a
prefill node (colocated mode, none up, or the P/D decision keeps the prompt on D) the decode node runs the
whole request through /generate: one call.

Faults: a prefill node that answers 5xx, cannot be reached or times out -> the router tells the decode node,
which prefills locally on the stream already open (counted); a 4xx from it is passed through unchanged; KV
that never arrived -> the decode node prefills locally by itself and says so on its first line. A client that
leaves (the stream is closed or cancelled) -> abort on the decode and the prefill node. A decode node that
cannot be reached or whose stream breaks before its last token -> DecodeNodeLost, which migration.py turns
into a new stream elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import orjson

from kvferry.internal_api import API_PREFIX, SamplingSpec
from kvferry.router.api.errors import APIError, overloaded
from kvferry.router.discovery.cluster import ClusterState
from kvferry.router.discovery.nodes import NodeView
from kvferry.router.dispatch.node_streams import NodeStreams, StreamErrors, ndjson_batches
from kvferry.router.metrics import RouterMetrics
from kvferry.router.scheduling import Decision
from kvferry.router.scheduling.pd_decision import PDDecision, PDSample

log = logging.getLogger(__name__)
CONTROL_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
ABORT_TIMEOUT_SECONDS = 2.0


class DecodeNodeLost(Exception):
    """A decode node's stream broke (or never opened) before its last token: the node died or went away."""

    def __init__(self, node: NodeView, reason: str) -> None:
        super().__init__(f"decode node {node.name} failed: {reason}")
        self.node = node


def _detail(content: bytes) -> str:
    try:
        body = orjson.loads(content)
    except ValueError:
        return content.decode(errors="replace")
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)


def _passed_through(status: int, content: bytes, node: str) -> APIError:
    """A node's refusal as the client's error: 4xx unchanged, anything else a 502 naming the node."""
    if 400 <= status < 500:
        return APIError(status, _detail(content))
    return APIError(502, f"{node} answered {status}: {_detail(content)}")


class PDFlow:
    def __init__(self, client: httpx.AsyncClient, streams: NodeStreams, cluster: ClusterState, metrics: RouterMetrics,
                 prefill_timeout_seconds: float, pd: PDDecision) -> None:
        """`client` makes the control calls (prefill, abort), `streams` reads the token streams; both send the
        cluster token. `pd` learns from the P/D requests' measured costs."""
        self.client, self.streams, self.cluster, self.metrics, self.pd = client, streams, cluster, metrics, pd
        self.prefill_timeout = httpx.Timeout(prefill_timeout_seconds, connect=5.0)
        self._aborts: set[asyncio.Task] = set()

    async def stream(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec, decision: Decision,
                     resumed: list[int], trace_headers: dict[str, str]) -> AsyncIterator[list[dict[str, Any]]]:
        """The decode node's chunks (internal_api.StreamChunk as dicts), in order, in batches of those that
        arrived together. `resumed`: output tokens the client has from a decode node that died (the
        chunks continue after them). `trace_headers`: the trace context both node calls carry (tracing.py).
        Raises DecodeNodeLost."""
        decode, prefill = decision.decode, decision.prefill
        body = {"request_id": request_id, "prompt_token_ids": prompt_ids, "sampling": spec.model_dump(),
                "resumed_token_ids": resumed}
        if decision.kept_on_decode:
            self.metrics.pd_decisions.labels(path="kept_on_decode").inc()
        elif prefill is None and not decision.colocated:
            self.metrics.fallback("no_prefill_node")
        elif prefill is not None:
            self.metrics.pd_decisions.labels(path="disaggregated").inc()
        route = "generate" if prefill is None else "decode"
        with self.cluster.track(decode.url):
            finished = False
            try:
                opened = time.perf_counter()
                self.metrics.node_calls.labels(route=route).inc()
                async with self.streams.post(f"{decode.url}{API_PREFIX}/{route}", body, trace_headers) as response:
                    if response.status == 503 and prefill is not None:
                        raise overloaded(503, f"decode node {decode.name} has no room: {_detail(await response.read())}")
                    async with contextlib.aclosing(self._batches(response, decode.url)) as batches:
                        if prefill is None:
                            batch = await anext(batches, None)
                        else:
                            first = await anext(batches, None)
                            if first is None:
                                raise DecodeNodeLost(decode, "its stream closed before reserving")
                            reserved, *chunks = first
                            batch = await self._prefill_watching_decode(batches, body, reserved["handle"], decision,
                                                                        opened, trace_headers)
                            if chunks:  # D held the whole prompt: its tokens came with the handle
                                finished = chunks[-1].get("finish_reason") is not None
                                yield chunks
                        while batch is not None:
                            if batch[0].get("local_prefill") == "kv_not_arrived":  # D's own fallback
                                self.metrics.fallback("kv_not_arrived")
                            finished = batch[-1].get("finish_reason") is not None
                            yield batch
                            batch = await anext(batches, None)
                if not finished:  # the connection closed cleanly, but early: the node went away
                    raise DecodeNodeLost(decode, "its stream ended before the last token")
            except StreamErrors as exc:
                self.cluster.record_failure(decode.url)
                raise DecodeNodeLost(decode, repr(exc)) from None
            finally:
                if not finished:  # the client left, or the stream broke: free what D holds
                    self._abort_later(decode.url, request_id)

    async def _batches(self, response: aiohttp.ClientResponse, url: str) -> AsyncIterator[list[dict[str, Any]]]:
        if response.status != 200:
            raise _passed_through(response.status, await response.read(), f"decode node {url}")
        async with contextlib.aclosing(ndjson_batches(response.content)) as batches:
            async for batch in batches:
                if batch[-1].get("finish_reason") == "error":  # an error line ends a stream: it is the last
                    # The node's engine failed (its own in-band report): an internal error, not a bad gateway.
                    raise APIError(500, f"decode node {url} failed mid-stream: {batch[-1].get('error')}")
                yield batch

    async def _prefill_watching_decode(self, batches: AsyncIterator[list[dict[str, Any]]], body: dict[str, Any],
                                       handle: dict[str, Any], decision: Decision, opened: float,
                                       trace_headers: dict[str, str]) -> list[dict[str, Any]] | None:
        """P's prefill while D's stream is watched; returns D's next batch once P answered (None: D's stream
        closed). A decode node that dies while P works ends the prefill call at once (P is told to abort and
        frees the KV it held) instead of after P's write into the dead node timed out and P answered. Where P
        prefilled, the batch's first chunk carries the prompt tokens P did not compute and P's phases of the
        time to first token (seconds)."""
        prefill_call = asyncio.ensure_future(self._prefill_remotely(body, handle, decision, opened, trace_headers))
        next_batch = asyncio.ensure_future(anext(batches, None))
        try:
            await asyncio.wait((prefill_call, next_batch), return_when=asyncio.FIRST_COMPLETED)
            if not prefill_call.done() and (next_batch.exception() is not None or next_batch.result() is None):
                return await next_batch  # D's stream broke (raises) or closed; P's call is cancelled below
            prefilled = await prefill_call
            batch = await next_batch
            if batch and prefilled is not None:
                total = len(body["prompt_token_ids"]) + len(body["resumed_token_ids"])
                batch[0]["cached_tokens"] = total - prefilled["computed_tokens"]
                batch[0]["prefill_phases"] = {"prefill_queue": prefilled["queue_ms"] / 1e3,
                                              "prefill_compute": prefilled["prefill_ms"] / 1e3,
                                              "transfer": prefilled["transfer_ms"] / 1e3}
            return batch
        finally:
            # Both end here, the generator's read too: `batches` is closed by the caller, not while it runs.
            unfinished = [task for task in (prefill_call, next_batch) if not task.done()]
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)

    async def _prefill_remotely(self, body: dict[str, Any], handle: dict[str, Any], decision: Decision,
                                opened: float, trace_headers: dict[str, str]) -> dict[str, Any] | None:
        """Prefill on P into D's reservation; returns P's answer. When P fails, D is told at once and
        prefills locally (None). `opened`: when D's stream was requested (what the P/D path costs is timed from
        there)."""
        decode, prefill = decision.decode, decision.prefill
        assert prefill is not None
        request_id = body["request_id"]
        reason: str | None = None
        answered = False
        try:
            with self.cluster.track(prefill.url):
                self.metrics.node_calls.labels(route="prefill").inc()
                response = await self.client.post(f"{prefill.url}{API_PREFIX}/prefill", json={**body, "handle": handle},
                                                  timeout=self.prefill_timeout, headers=trace_headers)
            answered = True
        except httpx.TimeoutException:
            reason = "prefill_timeout"
        except httpx.HTTPError:
            reason = "prefill_unreachable"
            self.cluster.record_failure(prefill.url)
        finally:
            if not answered:  # timed out, unreachable, or the client left while P worked
                self._abort_later(prefill.url, request_id)
        if reason is None and response.status_code >= 500:
            reason = "prefill_error"
        if reason is not None:
            detail = f" {response.status_code} {_detail(response.content)}" if answered else ""
            log.warning("prefill of %s on %s failed (%s%s): %s prefills locally", request_id, prefill.name, reason,
                        detail, decode.name)
            self.metrics.fallback(reason)
            await self._post(f"{decode.url}{API_PREFIX}/prefill_failed/{request_id}", "prefill_failed")
            return None
        if response.status_code != 200:
            raise _passed_through(response.status_code, response.content, f"prefill node {prefill.name}")
        prefilled = response.json()  # internal_api.PrefillResponse, read leniently: a newer node may say more
        self._measured(prefilled, time.perf_counter() - opened)
        return prefilled

    def _measured(self, prefilled: dict[str, Any], seconds: float) -> None:
        """One P/D request's costs for the P/D decision: P's compute, and what the path added beyond it."""
        compute, queue = prefilled["prefill_ms"] / 1e3, prefilled["queue_ms"] / 1e3
        self.pd.observe(PDSample(prefilled["computed_tokens"], compute, max(0.0, seconds - compute - queue)))

    async def aclose(self) -> None:
        await self.streams.aclose()

    def _abort_later(self, url: str, request_id: str) -> None:
        """Abort in a task of its own: it must run even when the caller is being cancelled."""
        task = asyncio.get_running_loop().create_task(self._post(f"{url}{API_PREFIX}/abort/{request_id}", "abort"))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _post(self, url: str, route: str) -> None:
        self.metrics.node_calls.labels(route=route).inc()
        try:  # a node without the route (404) or already rid of the request is fine
            await self.client.post(url, timeout=ABORT_TIMEOUT_SECONDS)
        except httpx.HTTPError as exc:
            log.info("%s failed: %r", url, exc)
