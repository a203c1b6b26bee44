"""A fake prefill node for the router's fault tests (it has no model): it answers /health, records every
call, and holds each /prefill open, like a prefill node that hangs, until `stall_seconds` pass; then it
answers 503. Abort calls get 404, as from a node without that route."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kvferry.internal_api import API_PREFIX


class StallingPrefillNode:
    def __init__(self, stall_seconds: float = 30.0) -> None:
        self.calls: list[tuple[str, str]] = []  # (path, request_id or "")
        self._released = threading.Event()
        node = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the router gave up on us first
                    pass

            def do_GET(self) -> None:
                self._answer(200 if self.path == "/health" else 404, {"status": "ok"})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request_id = json.loads(raw).get("request_id", "") if raw else ""
                node.calls.append((self.path, request_id))
                if self.path == f"{API_PREFIX}/prefill":
                    node._released.wait(stall_seconds)
                    self._answer(503, {"detail": "stalled"})
                else:
                    self._answer(404, {"detail": "Not Found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def prefill_ids(self) -> list[str]:
        return [request_id for path, request_id in self.calls if path.endswith("/prefill")]

    def aborted(self, request_id: str) -> bool:
        return (f"{API_PREFIX}/abort/{request_id}", "") in self.calls

    def stop(self) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()
