"""Where kvferry keeps what it fetches or builds once per machine: models, the test cluster's binaries."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$KVFERRY_CACHE, else ~/.cache/kvferry (the Makefile's CACHE), read at each call so tests can move it."""
    return Path(os.environ.get("KVFERRY_CACHE") or Path.home() / ".cache" / "kvferry")
