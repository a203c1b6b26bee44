"""`kvferry operator` parses its flags without loading kopf."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from kvferry.cli import COMMAND_MODULES
from kvferry.operator.command import register


def test_registered_in_the_cli() -> None:
    assert "kvferry.operator.command" in COMMAND_MODULES


def test_flags() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "operator",
            "--kubeconfig",
            "/tmp/kc",
            "--namespace",
            "a",
            "--namespace",
            "b",
            "--lease-duration",
            "5",
            "--test-hook-apply-delay",
            "1.5",
        ]
    )
    assert (args.kubeconfig, args.namespaces, args.lease_duration) == ("/tmp/kc", ["a", "b"], 5.0)
    assert args.test_hook_apply_delay == 1.5
    assert args.standalone is False
    assert args.func.__module__ == "kvferry.operator.command"


def test_cli_does_not_import_kopf() -> None:
    code = (
        "import argparse, sys; from kvferry.operator.command import register;"
        "register(argparse.ArgumentParser().add_subparsers()); print('kopf' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_signing_seed_too_short_to_derive_keys_from_stops_the_operator_at_start(monkeypatch) -> None:
    from kvferry.cli import main

    monkeypatch.setenv("KVFERRY_SIGNING_SEED", "short")
    with pytest.raises(SystemExit, match="KVFERRY_SIGNING_SEED must hold at least 32 bytes"):
        main(["operator", "--standalone"])
