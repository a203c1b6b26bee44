"""An engine stream as the NDJSON lines of the nodes' internal API (one StreamChunk per step)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

from kvferry.engine import RequestOutput
from kvferry.internal_api import StreamChunk


class FirstToken:
    """When a request's first token came on this node, read once (time.perf_counter()): the stream's first
    line says how long after `started` (when this node could begin) it came, `on_first` gets the same
    seconds (a histogram), and the request's trace phases end and begin there."""

    def __init__(self, started: float, on_first: Callable[[float], None] | None = None) -> None:
        self.started, self._on_first = started, on_first
        self.at: float | None = None

    def read(self) -> float:
        self.at = time.perf_counter()
        seconds = self.at - self.started
        if self._on_first is not None:
            self._on_first(seconds)
        return seconds


async def ndjson_deltas(stream: AsyncIterator[RequestOutput], first: FirstToken,
                        local_prefill: str | None = None) -> AsyncIterator[bytes]:
    """Cumulative engine outputs -> one JSON line per step with only what is new (n == 1). The first line
    carries `first`'s reading and `local_prefill` (why a decode node prefilled a prompt whose KV did not
    come)."""
    sent_tokens, sent_text = 0, 0
    try:
        async for output in stream:
            completion = output.outputs[0]
            chunk = StreamChunk(
                token_ids=completion.token_ids[sent_tokens:],
                text=completion.text[sent_text:],
                finish_reason=completion.finish_reason,
                logprobs=completion.logprobs[sent_tokens:] if completion.logprobs is not None else None,
                local_prefill=None if sent_tokens else local_prefill,
                cached_tokens=None if sent_tokens else output.num_cached_tokens,
                first_step_seconds=None if sent_tokens else first.read(),
            )
            sent_tokens, sent_text = len(completion.token_ids), len(completion.text)
            yield (chunk.model_dump_json() + "\n").encode()
    except Exception as exc:  # noqa: BLE001 - the stream is already open: report in-band, then end
        yield error_line(exc)
    finally:
        # A reader that left closes this generator only: close the engine stream now (it aborts the
        # request), not whenever the garbage collector finalises it.
        await stream.aclose()  # type: ignore[attr-defined]


def error_line(exc: BaseException) -> bytes:
    """The last line of a stream that failed after it opened (its status was sent already)."""
    return (json.dumps({"token_ids": [], "text": "", "finish_reason": "error", "error": str(exc)}) + "\n").encode()
