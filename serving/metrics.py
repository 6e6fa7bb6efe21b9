"""Prometheus metrics of one server (`GET /metrics`), on a registry of its own (several servers can live
in one process, e.g. in tests).

Recorded as they happen: requests by team and status (`RequestMetrics` middleware; 499 = the client
went away before an answer), episode, turn and time-to-first-content latencies, generated tokens.
Read at scrape time: queue depth and in-flight episodes per team (serving/limits.py), the adapter
version in use per adapter, versions promoted over a serving one (exported as `teamtr_adapter_promotions`, the
name dashboards read), refused pushes and rollbacks (serving/adapter_slots.py's counters), the
candidate under canary, and what `teamtr improve --watch` last reported (`POST /admin/improve`).
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
            ("teamtr_adapter_promotions", self.registry.version_promotions, "versions promoted over a serving one"),
            ("teamtr_adapter_refused", self.registry.refused, "pushed versions refused"),
            ("teamtr_adapter_rollbacks", self.registry.rollbacks, "rollbacks"),
        ):
            family = CounterMetricFamily(name, doc, labels=["adapter"])
            for adapter in self.registry.adapters():
                family.add_metric([adapter], counts[adapter])
            yield family
        yield from self._candidate()
        yield from self._improve()

    def _candidate(self) -> Iterator[Metric]:
        """The candidate under canary (`teamtr improve`) and the decisions on candidates so far."""
        c = self.registry.candidate
        version = GaugeMetricFamily(
            "teamtr_candidate_version", "the loaded candidate's version (0: none)", labels=["adapter"]
        )
        for adapter in self.registry.adapters():
            version.add_metric([adapter], (c.versions.get(adapter, 0) if c is not None else 0))
        yield version
        yield GaugeMetricFamily(
            "teamtr_canary_share", "share of new episodes on the candidate", value=c.share if c else 0.0
        )
        yield GaugeMetricFamily(
            "teamtr_canary_episodes",
            "episodes the candidate served",
            value=c.total_canary_episodes if c else 0,
        )
        decisions = CounterMetricFamily(
            "teamtr_candidate_decisions",
            "candidates promoted, rolled back, abandoned; teams restored",
            labels=["decision"],
        )
        for decision in ("promoted", "rolled_back", "abandoned", "promotion_rolled_back", "restored"):
            decisions.add_metric([decision], self.registry.decisions[decision])
        yield decisions

    def _improve(self) -> Iterator[Metric]:
        """Each team's `teamtr improve --watch`: its phase, rounds, last decision and that decision's figures."""
        reports = sorted(self.registry.improve_reports.items())
        phase = GaugeMetricFamily("teamtr_improve_phase", "1 for the watch's phase", labels=["team", "phase"])
        rounds = CounterMetricFamily("teamtr_improve_rounds", "rounds finished", labels=["team", "outcome"])
        last = GaugeMetricFamily(
            "teamtr_improve_last_decision", "1 for the last round's outcome", labels=["team", "decision"]
        )
        figures = GaugeMetricFamily(
            "teamtr_improve_last_decision_figure",
            "the last decision's figures: gate_* (difference, lower_bound, prompts, kl_<adapter>), "
            "canary_* (rewards, pairs, bounds)",
            labels=["team", "figure"],
        )
        scalars = {
            name: GaugeMetricFamily(f"teamtr_improve_{name}", doc, labels=["team"])
            for name, doc in (
                ("attempt", "the improve attempt of the last or current round"),
                ("setbacks", "refusals, rollbacks and no-changes in a row"),
                ("backoff_seconds", "the wait after the last round (doubles per setback)"),
                ("not_before_seconds", "unix time before which no round starts"),
                ("new_episodes", "served episodes since the last round's window"),
                ("new_feedback", "of them, with feedback"),
            )
        }
        for team, r in reports:
            phase.add_metric([team, r.phase], 1)
            for outcome, n in sorted(r.outcomes.items()):
                rounds.add_metric([team, outcome], n)
            if r.last_decision is not None:
                last.add_metric([team, r.last_decision], 1)
            for name, value in sorted(r.figures.items()):
                figures.add_metric([team, name], value)
            for name, value in (
                ("attempt", r.attempt),
                ("setbacks", r.setbacks),
                ("backoff_seconds", r.backoff_s),
                ("not_before_seconds", r.not_before_s),
                ("new_episodes", r.new_episodes),
                ("new_feedback", r.new_feedback),
            ):
                scalars[name].add_metric([team], value)
        yield from (phase, rounds, last, figures, *scalars.values())


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
