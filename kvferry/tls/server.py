"""uvicorn over HTTPS that takes a rotated certificate without a restart.

A Secret's rotated files reach a pod's volume within a minute or so; a server reading them only at start would
serve the old certificate until it expires. So the serving context loads the files again when they change:
connections made after that get the new certificate, the open ones keep theirs. Nothing restarts, so a node
keeps its model and KV cache through a rotation.
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn

from kvferry.tls.files import ServingFiles
from kvferry.tls.watch import FileWatch

CHECK_TICKS = 100  # uvicorn ticks every 0.1 s: the files are looked at every 10 s
STARTUP_FAILURE = 3  # uvicorn.run's exit status when the server never started


class _ReloadingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, files: ServingFiles) -> None:
        super().__init__(config)
        self.files = files
        self.watch: FileWatch | None = None

    async def startup(self, sockets: Any = None) -> None:
        assert self.config.ssl is not None  # loaded by now, from the files
        context = self.config.ssl
        self.watch = FileWatch(
            (self.files.cert, self.files.key),
            lambda: context.load_cert_chain(self.files.cert, self.files.key),
        )
        await super().startup(sockets)

    async def on_tick(self, counter: int) -> bool:
        # On the event loop, between handshakes: an SSLContext is not to be changed from another thread.
        if counter % CHECK_TICKS == 0 and self.watch is not None:
            self.watch.check()
        return await super().on_tick(counter)


def serve(app: Any, files: ServingFiles | None, **config: Any) -> None:
    """uvicorn.run(app, **config), over HTTPS with `files` (reloaded when they change), else plain HTTP. With
    TLS a plain HTTP request on the port gets a failed handshake, never an answer."""
    if files is None:
        uvicorn.run(app, **config)
        return
    server = _ReloadingServer(
        uvicorn.Config(app, ssl_certfile=files.cert, ssl_keyfile=files.key, **config), files
    )
    # uvicorn raises a captured SIGINT again once it has shut down; uvicorn.run swallows it, and so does this.
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)
