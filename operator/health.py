"""A liveness endpoint that answers while the process runs, leader or standby.

kopf's own liveness endpoint only exists while kopf runs, i.e. on the leader; a standby replica waiting
for the lease must not be restarted by its liveness probe for doing exactly what it should.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def start_health_server(host: str, port: int, is_leader: Callable[[], bool]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            found = self.path == "/healthz"
            body = json.dumps(
                {"ok": True, "leader": is_leader()} if found else {"error": "not found"}
            ).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the operator's log

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
