"""Tracing: one OpenTelemetry trace per request across router, prefill and decode (docs/router.md, tracing).

The router's span for a request (FastAPI's server span) is the root (or continues the client's `traceparent`); every node call made
for it carries W3C trace context, and the node's span for the call continues that trace. Spans go over
OTLP/HTTP (protobuf) to the endpoint configured: `--otlp-traces-endpoint`, else the standard
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; sampling follows the standard `OTEL_TRACES_SAMPLER(_ARG)` (default: every
trace, a node following the router's decision). With no endpoint nothing is configured: the API's no-op
tracer stands in, `enabled()` is False, FastAPI's own tracing (`fastapi_telemetry`) stays idle and no phase span
is built, so tracing off costs nothing per request.

Phases that the nodes already time for their metrics (a prefill's queue, compute and transfer; a decode's wait
for KV, first step and stream) become spans after the fact, from those timestamps (`record_phases`): one clock
reading serves both.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
_tracer = trace.get_tracer("kvferry")
_enabled = False


def add_tracing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--otlp-traces-endpoint", default=os.environ.get(ENDPOINT_ENV) or None,
                        help=f"export spans over OTLP/HTTP to this URL, e.g. http://collector:4318/v1/traces "
                        f"(default ${ENDPOINT_ENV}; none: tracing off)")


def configure_tracing(service_name: str, endpoint: str | None, instance: str | None = None) -> None:
    """Export this process's spans to `endpoint` (OTLP/HTTP); None leaves tracing off. `instance`: the node's
    name, so that a trace shows which node served each part."""
    global _enabled
    if not endpoint:
        return
    # Imported here: a process with tracing off never loads the SDK.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {"service.name": service_name, **({"service.instance.id": instance} if instance else {})}
    provider = TracerProvider(resource=Resource.create(attributes))  # flushed at exit (shutdown_on_exit)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)
    _enabled = True


def fastapi_telemetry(prefix: str, continued_only: bool) -> dict[str, Any]:
    """`FastAPI(telemetry=...)`: FastAPI's own server span for each request under `prefix` (current while the
    request is handled, ended with its last byte, so a stream's lasts as long as the stream), once this
    process has a tracer provider. `continued_only`: only requests that carry a trace context (a node: its
    spans belong to the router's traces; a call without one is not traced on its own). No per-dependency
    spans (the phases are ours), no OpenTelemetry metrics or logs (Prometheus and kvferry/logs.py have them)."""

    def excluded(scope: MutableMapping[str, Any]) -> bool:
        if not scope.get("path", "").startswith(prefix):
            return True  # probes, /metrics, /stats: not requests anybody follows
        return continued_only and not any(key == b"traceparent" for key, _ in scope.get("headers", ()))

    return {"tracing": True, "metrics": False, "logs": False, "operation_spans": False, "exclude": excluded}


def enabled() -> bool:
    return _enabled


def tracer() -> trace.Tracer:
    return _tracer


def headers_for(span: trace.Span) -> dict[str, str]:
    """W3C trace context naming `span` as the parent of a call made under it; none while tracing is off."""
    if not _enabled:
        return {}
    from opentelemetry import propagate  # loads the propagators' entry points: only where tracing is on

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def set_attributes(attributes: Mapping[str, str | int | bool]) -> None:
    """Attributes of the current span (the request's), where tracing is on."""
    if _enabled:
        trace.get_current_span().set_attributes(attributes)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """A child span of the current one around a block (a no-op span while tracing is off)."""
    with _tracer.start_as_current_span(name):
        yield


def record_phases(phases: Sequence[tuple[str, float, float]], attributes: Mapping[str, str | int] | None = None,
                  parent: trace.Span | None = None) -> None:
    """Spans for phases timed already: (name, start, end) in `time.perf_counter()` seconds, as children of
    `parent` (default the current span). Nothing is built while tracing is off or the parent is not recorded
    (without that check, a node's call that carries no trace would start traces of its own phases)."""
    parent = parent if parent is not None else trace.get_current_span()
    if not _enabled or not parent.is_recording():  # off, a call nobody traces, or a trace not sampled
        return
    context = trace.set_span_in_context(parent)
    offset_ns = time.time_ns() - time.perf_counter_ns()  # the two clocks' difference, read once for every phase
    for name, start, end in phases:
        span = _tracer.start_span(name, context=context, start_time=offset_ns + round(start * 1e9),
                                  attributes=dict(attributes or {}))
        span.end(end_time=offset_ns + round(end * 1e9))
