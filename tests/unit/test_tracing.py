"""Tracing's switch and FastAPI's part in it (kvferry/tracing.py). The spans themselves, exported by real
processes, are tests/e2e/test_tracing.py: a tracer provider is global to a process, and this one is shared."""

from __future__ import annotations

import subprocess
import sys
import time

from opentelemetry import trace

from kvferry import tracing
from kvferry.internal_api import API_PREFIX


def _scope(path: str, headers: list[tuple[bytes, bytes]] | None = None) -> dict:
    return {"type": "http", "path": path, "headers": headers or []}


TRACEPARENT = (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


def test_the_router_traces_its_api_requests_only() -> None:
    excluded = tracing.fastapi_telemetry("/v1/", continued_only=False)["exclude"]
    assert not excluded(_scope("/v1/chat/completions")) and not excluded(_scope("/v1/completions", [TRACEPARENT]))
    assert all(excluded(_scope(path)) for path in ("/health", "/ready", "/metrics", "/stats", "/drain"))


def test_a_node_traces_only_internal_calls_that_continue_a_trace() -> None:
    excluded = tracing.fastapi_telemetry(API_PREFIX, continued_only=True)["exclude"]
    assert not excluded(_scope(f"{API_PREFIX}/prefill", [TRACEPARENT]))
    assert excluded(_scope(f"{API_PREFIX}/prefill"))  # the router did not trace this request
    assert excluded(_scope("/metrics", [TRACEPARENT]))


def test_tracing_off_builds_nothing() -> None:
    assert not tracing.enabled()  # no endpoint in this process
    span = tracing.tracer().start_span("dispatch")
    assert not span.is_recording() and tracing.headers_for(span) == {}  # node calls carry no trace context
    now = time.perf_counter()
    with tracing.phase("schedule"):
        tracing.record_phases([("queue", now, now)], parent=span)
        assert not trace.get_current_span().is_recording()


def test_the_endpoint_comes_from_the_flag_or_the_standard_variable() -> None:
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces", "PATH": ""}
    code = ("import argparse; from kvferry.tracing import add_tracing_arguments as a; p = argparse.ArgumentParser(); "
            "a(p); print(p.parse_args([]).otlp_traces_endpoint, p.parse_args(['--otlp-traces-endpoint', 'http://x/v1/traces'])"
            ".otlp_traces_endpoint)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["http://127.0.0.1:4318/v1/traces", "http://x/v1/traces"]
