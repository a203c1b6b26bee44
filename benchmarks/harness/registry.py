"""The transfer engine's file registry for a benchmark process, in a folder of its own."""

from __future__ import annotations

import atexit
import shutil
import tempfile


def temporary_registry() -> str:
    """A `file://` registry in a fresh folder, removed when the process exits: the peers delete their
    entries when they close, but the folder stayed behind, one per run, test runs of the smoke modes
    included."""
    folder = tempfile.mkdtemp(prefix="kvferry-registry-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return f"file://{folder}"
