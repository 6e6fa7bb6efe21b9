"""Prometheus metrics of one server (`GET /metrics`), on a registry of its own (several servers can live
in one process, e.g. in tests).

Recorded as they happen: requests by team and status (`RequestMetrics` middleware; 499 = the client
went away before an answer), episode, turn and time-to-first-content latencies, generated tokens.
Read at scrape time: queue depth and in-flight episodes per team (serving/limits.py), the adapter
version in use per adapter, swaps, refused pushes and rollbacks (serving/registry.py's counters).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from teamtr.serving.limits import AdmissionGate
from teamtr.serving.registry import AdapterRegistry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TEAM_STATE_KEY = "teamtr_team"  # the route puts the request's team in the ASGI scope's state


class _LiveState(Collector):
    def __init__(self, gates: dict[str, AdmissionGate], registry: AdapterRegistry) -> None:
        self.gates, self.registry = gates, registry

    def collect(self) -> Iterator[Metric]:
        queue = GaugeMetricFamily("teamtr_queue_depth", "episodes waiting for admission", labels=["team"])
        running = GaugeMetricFamily("teamtr_in_flight_episodes", "episodes running", labels=["team"])
        for team, gate in sorted(self.gates.items()):
            queue.add_metric([team], gate.waiting)
            running.add_metric([team], gate.in_flight)
        yield queue
        yield running
        version = GaugeMetricFamily(
            "teamtr_adapter_version", "the version new episodes of this adapter run on", labels=["adapter"]
        )
        for adapter, v in sorted(self.registry.current_versions().items()):
            version.add_metric([adapter], v)
        yield version
        for name, counts, doc in (
            ("teamtr_adapter_swaps", self.registry.swaps, "versions promoted over a serving one"),
            ("teamtr_adapter_refused", self.registry.refused, "pushed versions refused"),
            ("teamtr_adapter_rollbacks", self.registry.rollbacks, "rollbacks"),
        ):
            family = CounterMetricFamily(name, doc, labels=["adapter"])
            for adapter in self.registry.adapters():
                family.add_metric([adapter], counts[adapter])
            yield family


class ServingMetrics:
    def __init__(self, gates: dict[str, AdmissionGate], registry: AdapterRegistry) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "teamtr_requests", "chat completion requests", ["team", "status"], registry=self.registry
        )
        self.episode_seconds = Histogram(
            "teamtr_episode_seconds",
            "one episode, start to end",
            ["team"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.turn_seconds = Histogram(
            "teamtr_turn_seconds",
            "one agent turn (a chat-model call)",
            ["team", "role"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_content_seconds = Histogram(
            "teamtr_time_to_first_content_seconds",
            "streamed requests: arrival to the first content chunk",
            ["team"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "teamtr_generated_tokens", "completion tokens sampled", ["team", "role"], registry=self.registry
        )
        self.registry.register(_LiveState(gates, registry))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def turn_observer(self, team: str) -> Callable[[str, float, int], None]:
        def observe(role: str, seconds: float, completion_tokens: int) -> None:
            self.turn_seconds.labels(team, role).observe(seconds)
            self.tokens.labels(team, role).inc(completion_tokens)

        return observe


class RequestMetrics:
    """ASGI middleware: counts `POST /v1/chat/completions` by team and the status sent (499 if none)."""

    def __init__(self, app: ASGIApp, metrics: Callable[[], ServingMetrics | None]) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != "/v1/chat/completions":
            return await self.app(scope, receive, send)
        status: list[int] = []

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            metrics = self.metrics()
            if metrics is not None:
                state: dict[str, Any] = scope.get("state") or {}
                team = state.get(TEAM_STATE_KEY, "unknown")
                metrics.requests.labels(team, str(status[0] if status else 499)).inc()
