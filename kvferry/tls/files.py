"""The serving certificate flags, one definition for the router and the nodes."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class ServingFiles:
    """A PEM certificate (chain) and its private key: with them a server speaks HTTPS only."""

    cert: str
    key: str

    @classmethod
    def from_flags(cls, cert: str | None, key: str | None) -> ServingFiles | None:
        """None without either; raises ValueError for one without the other, OSError for an unreadable file
        (said now, naming the file, not later as the SSL library's error)."""
        if (cert is None) != (key is None):
            raise ValueError("--tls-cert-file and --tls-key-file go together")
        if cert is None or key is None:
            return None
        for path in (cert, key):
            with open(path, "rb"):
                pass
        return cls(cert, key)


def add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-cert-file",
        default=None,
        help="serve HTTPS only with this PEM certificate (chain), reloaded when the file changes; "
        "needs --tls-key-file",
    )
    parser.add_argument("--tls-key-file", default=None, help="the PEM private key of --tls-cert-file")
