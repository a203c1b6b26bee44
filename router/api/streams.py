"""Several async streams read as one, each item tagged with its stream's index (n > 1 choices)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


async def merge_streams(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items as they come; the first error ends the merge. Closing it closes every stream, cancelling those
    still running, so that their own cleanup (aborting on a node) runs now, not when the garbage collector
    finalises them: a stream left suspended in a reference cycle can wait for that indefinitely."""
    if len(streams) == 1:  # the common case, without tasks in between
        async with contextlib.aclosing(streams[0]) as stream:  # type: ignore[type-var]
            async for item in stream:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            await queue.put((index, exc))
        await queue.put((index, _DONE))

    tasks = [asyncio.create_task(pump(index, stream)) for index, stream in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:  # a stream whose pump never started was never entered: close it too
            await stream.aclose()  # type: ignore[attr-defined]
