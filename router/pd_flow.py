"""The P/D flow of one completion (docs/internals.md): reserve on the decode node, prefill on the prefill
node with its handle, then stream the decode node's NDJSON. Without a prefill node (colocated mode, or
none up) the decode node runs the whole request through /generate.

Faults: a prefill node that answers 5xx, cannot be reached or times out -> the decode node prefills
locally (counted); a 4xx from it is passed through unchanged; KV that never arrived -> local prefill too.
A client that leaves (the stream is closed or cancelled) -> abort on the decode and the prefill node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import orjson

from kvferry.internal_api import API_PREFIX, SamplingSpec
from kvferry.router.cluster import ClusterState
from kvferry.router.errors import APIError, overloaded
from kvferry.router.metrics import RouterMetrics
from kvferry.router.node_streams import NodeStreams, StreamErrors, ndjson_batches
from kvferry.router.scheduling import Decision

log = logging.getLogger(__name__)
CONTROL_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
ABORT_TIMEOUT_SECONDS = 2.0


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


def local_id(request_id: str) -> str:
    """The decode node's id for a request it prefills itself after the P/D path failed."""
    return f"{request_id}-local"


class PDFlow:
    def __init__(self, client: httpx.AsyncClient, streams: NodeStreams, cluster: ClusterState, metrics: RouterMetrics,
                 prefill_timeout_seconds: float) -> None:
        """`client` makes the control calls (reserve, prefill, abort), `streams` reads the token streams; both
        send the cluster token."""
        self.client, self.streams, self.cluster, self.metrics = client, streams, cluster, metrics
        self.prefill_timeout = httpx.Timeout(prefill_timeout_seconds, connect=5.0)
        self._aborts: set[asyncio.Task] = set()

    async def stream(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec,
                     decision: Decision) -> AsyncIterator[list[dict[str, Any]]]:
        """The decode node's chunks (internal_api.StreamChunk as dicts), in order, in batches of those that
        arrived together."""
        decode = decision.decode
        sampling = spec.model_dump()
        with self.cluster.track(decode.url):
            first: dict[str, Any] | None = None
            if decision.prefill is not None:
                first = await self._prefill_remotely(request_id, prompt_ids, sampling, decision)
            elif not decision.colocated:
                self.metrics.fallback("no_prefill_node")
            # A local prefill after a failed remote one runs under an id of its own: an abort of the
            # reservation that is still on its way (queued on a busy node) must not stop it.
            running_id = request_id if first is not None or decision.prefill is None else local_id(request_id)
            if first is not None:
                call = self.streams.post(f"{decode.url}{API_PREFIX}/decode", {"request_id": request_id, **first})
            else:
                call = self._generate(decode.url, running_id, prompt_ids, sampling)
            finished = False
            try:
                async with call as response:
                    if response.status == 409 and first is not None:
                        # The KV did not arrive in time (lease over): the decode node prefills itself.
                        self.metrics.fallback("kv_not_arrived")
                        await response.read()
                        running_id = local_id(request_id)
                        async with self._generate(decode.url, running_id, prompt_ids, sampling) as retry:
                            async for batch in self._batches(retry, decode.url):
                                finished = batch[-1].get("finish_reason") is not None
                                yield batch
                        return
                    async for batch in self._batches(response, decode.url):
                        finished = batch[-1].get("finish_reason") is not None
                        yield batch
            except StreamErrors as exc:
                self.cluster.health.record_failure(decode.url)
                raise APIError(502, f"decode node {decode.name} failed: {exc!r}") from None
            finally:
                if not finished:  # the client left, or the stream broke: free what D holds
                    self._abort_later(decode.url, running_id)

    def _generate(self, url: str, request_id: str, prompt_ids: list[int], sampling: dict) -> Any:
        body = {"request_id": request_id, "prompt_token_ids": prompt_ids, "sampling": sampling}
        return self.streams.post(f"{url}{API_PREFIX}/generate", body)

    async def _batches(self, response: aiohttp.ClientResponse, url: str) -> AsyncIterator[list[dict[str, Any]]]:
        if response.status != 200:
            raise _passed_through(response.status, await response.read(), f"decode node {url}")
        async with contextlib.aclosing(ndjson_batches(response.content)) as batches:
            async for batch in batches:
                if batch[-1].get("finish_reason") == "error":  # an error line ends a stream: it is the last
                    # The node's engine failed (its own in-band report): an internal error, not a bad gateway.
                    raise APIError(500, f"decode node {url} failed mid-stream: {batch[-1].get('error')}")
                yield batch

    async def _prefill_remotely(self, request_id: str, prompt_ids: list[int], sampling: dict,
                                decision: Decision) -> dict[str, Any] | None:
        """Reserve on D, prefill on P. The first token for D's /decode, or None: D must prefill itself."""
        decode, prefill = decision.decode, decision.prefill
        assert prefill is not None
        body = {"request_id": request_id, "prompt_token_ids": prompt_ids, "sampling": sampling}
        try:
            reserve = await self.client.post(f"{decode.url}{API_PREFIX}/reserve", json=body, timeout=CONTROL_TIMEOUT)
        except httpx.HTTPError as exc:
            self.cluster.health.record_failure(decode.url)
            raise overloaded(503, f"decode node {decode.name} cannot be reached: {exc!r}") from None
        if reserve.status_code == 503:
            raise overloaded(503, f"decode node {decode.name} has no room: {_detail(reserve.content)}")
        if reserve.status_code != 200:
            raise _passed_through(reserve.status_code, reserve.content, f"decode node {decode.name}")
        handle = reserve.json()["handle"]
        reason: str | None = None
        answered = False
        try:
            with self.cluster.track(prefill.url):
                response = await self.client.post(f"{prefill.url}{API_PREFIX}/prefill", json={**body, "handle": handle},
                                                  timeout=self.prefill_timeout)
            answered = True
        except httpx.TimeoutException:
            reason = "prefill_timeout"
        except httpx.HTTPError:
            reason = "prefill_unreachable"
            self.cluster.health.record_failure(prefill.url)
        finally:
            if not answered:  # timed out, unreachable, or the client left while P worked
                self._abort_later(prefill.url, request_id)
                if reason is None:
                    self._abort_later(decode.url, request_id)
        if reason is None and response.status_code >= 500:
            reason = "prefill_error"
        if reason is not None:
            detail = f" {response.status_code} {_detail(response.content)}" if answered else ""
            log.warning("prefill of %s on %s failed (%s%s): %s prefills locally", request_id, prefill.name, reason,
                        detail, decode.name)
            self.metrics.fallback(reason)
            # Awaited: the reservation's blocks are free again before the local prefill needs them.
            await self._abort(decode.url, request_id)
            return None
        if response.status_code != 200:
            self._abort_later(decode.url, request_id)
            raise _passed_through(response.status_code, response.content, f"prefill node {prefill.name}")
        first = response.json()
        return {"first_token": first["first_token"], "logprobs": first.get("logprobs")}

    async def aclose(self) -> None:
        await self.streams.aclose()

    def _abort_later(self, url: str, request_id: str) -> None:
        """Abort in a task of its own: it must run even when the caller is being cancelled."""
        task = asyncio.get_running_loop().create_task(self._abort(url, request_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _abort(self, url: str, request_id: str) -> None:
        try:  # a node without the route (404) or already rid of the request is fine
            await self.client.post(f"{url}{API_PREFIX}/abort/{request_id}", timeout=ABORT_TIMEOUT_SECONDS)
        except httpx.HTTPError as exc:
            log.info("abort of %s on %s failed: %r", request_id, url, exc)
