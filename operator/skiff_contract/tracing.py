"""OpenTelemetry traces shared by the router and the runtime: off unless an OTLP endpoint is given.

Both processes take `--otlp-traces-endpoint URL` (default: $SKIFF_OTLP_TRACES_ENDPOINT), export spans over
OTLP/HTTP (protobuf) to it and carry the trace across hops in W3C `traceparent`/`tracestate` headers. A URL
without a path gets OTLP's `/v1/traces`. The SDK and exporter are the `tracing` extra; they are imported
only when tracing is turned on, so this module itself needs nothing beyond the standard library.
The SDK's own environment settings apply (OTEL_BSP_SCHEDULE_DELAY, OTEL_RESOURCE_ATTRIBUTES, ...)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

ENDPOINT_ENV = "SKIFF_OTLP_TRACES_ENDPOINT"
ENDPOINT_HELP = (
    f"export OpenTelemetry traces over OTLP/HTTP to this URL (default: ${ENDPOINT_ENV}; unset: off)"
)


class TracingUnavailable(RuntimeError):
    """Tracing was asked for but cannot run (packages missing, a bad URL)."""


def traces_url(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TracingUnavailable(f"--otlp-traces-endpoint must be an http(s) URL, got {endpoint!r}")
    return endpoint if parts.path not in ("", "/") else endpoint.rstrip("/") + "/v1/traces"


@dataclass
class Tracing:
    """A tracer with its provider, and W3C propagation to and from HTTP headers."""

    tracer: Any
    provider: Any
    propagator: Any

    def extract(self, headers: Mapping[str, str]) -> Any:
        """The context a request's `traceparent` names (the root context when it has none)."""
        return self.propagator.extract(carrier={k.lower(): v for k, v in headers.items()})

    def inject(self, span: Any) -> dict[str, str]:
        """Headers that make `span` the parent of the next hop's spans."""
        from opentelemetry import trace

        headers: dict[str, str] = {}
        self.propagator.inject(headers, context=trace.set_span_in_context(span))
        return headers

    def start(self, name: str, parent: Any = None, kind: str = "internal", **kw: Any) -> Any:
        """A span under `parent` (a Context or a Span); `kw` as for Tracer.start_span."""
        from opentelemetry import trace

        context = trace.set_span_in_context(parent) if isinstance(parent, trace.Span) else parent
        return self.tracer.start_span(name, context=context, kind=getattr(trace.SpanKind, kind.upper()), **kw)

    def shutdown(self) -> None:
        """Export what is buffered, then stop (call once, at process exit)."""
        self.provider.shutdown()


def check_available(endpoint: str | None = None) -> None:
    """Raise TracingUnavailable if tracing is asked for (the argument, else the environment) and could not
    run here: a bad URL, or the SDK not installed. Creates nothing."""
    endpoint = endpoint or os.environ.get(ENDPOINT_ENV) or None
    if endpoint is not None:
        traces_url(endpoint)
        _sdk()


def _sdk() -> None:
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as e:
        raise TracingUnavailable(
            f"--otlp-traces-endpoint needs the OpenTelemetry SDK and OTLP exporter "
            f"(pip install 'skiff[tracing]'): {e}"
        ) from e


def configure(service_name: str, endpoint: str | None = None) -> Tracing | None:
    """Tracing for this process, or None when no endpoint is set (the default)."""
    endpoint = endpoint or os.environ.get(ENDPOINT_ENV) or None
    if endpoint is None:
        return None
    url = traces_url(endpoint)
    _sdk()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    return Tracing(provider.get_tracer("skiff"), provider, TraceContextTextMapPropagator())
