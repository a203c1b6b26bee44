"""How the router trusts its nodes over TLS: only the cluster's CA, and one name for every node.

The router dials nodes at their pod IPs, which nobody knows when a certificate is issued, so a node's
certificate carries a name instead (the operator's: `<cluster>-nodes.<namespace>.svc`), and every call checks
that name (TLS server name) rather than the address dialled. Without a name, the address is checked (nodes
whose certificates name their addresses: a static list, tests).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from kvferry.tls.watch import FileWatch


@dataclass(frozen=True)
class NodeTrust:
    ca_file: str  # PEM: the CA certificates that sign the nodes' certificates
    server_name: str | None = None  # the name every node's certificate must carry; None: the address dialled

    def context(self) -> ssl.SSLContext:
        """A client context that trusts `ca_file` and nothing else (not the system's CAs: any public
        certificate would otherwise pass for a node)."""
        return ssl.create_default_context(cafile=self.ca_file)

    def watch(self, context: ssl.SSLContext) -> FileWatch:
        """Adds the CA file's certificates to `context` when the file changes. Added, not replaced (an
        SSLContext forgets no CA): while a new CA rolls out, nodes still serving a certificate of the old one
        stay trusted; the old one goes with the router's next restart."""
        return FileWatch((self.ca_file,), lambda: context.load_verify_locations(cafile=self.ca_file))
