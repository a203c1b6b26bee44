"""free_port: loopback ports for child processes, drawn below the kernel's ephemeral range, whose ports any
outgoing connection may take before the child binds one."""

from __future__ import annotations

import socket

from kvferry.cli import ports
from kvferry.cli.ports import HIGHEST_PORT, LOWEST_PORT, free_port


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    ports = [free_port() for _ in range(40)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST_PORT <= port < HIGHEST_PORT for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))


def test_a_port_in_use_or_handed_out_before_is_skipped(monkeypatch):
    with socket.socket() as busy, socket.socket() as probe:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        probe.bind(("127.0.0.1", 0))
        taken, candidate = busy.getsockname()[1], probe.getsockname()[1]
        probe.close()
        given = free_port()
        draws = iter([taken, given, candidate])  # in use, handed out already, then free
        monkeypatch.setattr(ports.random, "randrange", lambda low, high: next(draws))
        monkeypatch.setattr(ports, "_ephemeral_start", lambda: 65000)
        monkeypatch.setattr(ports, "HIGHEST_PORT", 65000)
        monkeypatch.setattr(ports, "LOWEST_PORT", 1024)
        assert free_port() == candidate


def test_with_no_room_below_the_ephemeral_range_the_kernel_chooses(tmp_path, monkeypatch):
    low_range = tmp_path / "ip_local_port_range"
    low_range.write_text("1024\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", low_range)
    port = free_port()
    assert port >= 1024
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
