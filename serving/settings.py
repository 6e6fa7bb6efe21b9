"""Limits, keys and per-team policies of one server (cli/server.py builds them from a `ServeConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "stop")  # what a team may pin per role


@dataclass
class TeamPolicy:
    """How one team is served: its admission bounds and the sampling settings it pins per role.

    `pinned`: role -> {field: value} for fields in SAMPLING_FIELDS; a request cannot override them
    (serving/sampling.py). `max_in_flight` episodes run at once; `max_waiting` more wait in its queue;
    beyond that a request gets 429 (serving/limits.py)."""

    max_in_flight: int = 64
    max_waiting: int = 256
    pinned: dict[str, dict[str, object]] = field(default_factory=dict)


@dataclass
class ServeSettings:
    """Defaults: an open chat API, admin endpoints off (no admin key), no rate limit."""

    api_keys: tuple[str, ...] = ()  # Bearer keys accepted by the chat API; empty = no key needed
    admin_key: str | None = None  # Bearer key of the /admin endpoints; None = they answer 403
    max_body_bytes: int = 1_000_000  # larger request bodies get 413
    max_prompt_tokens: int = 256  # the task (with folded context) in tokens; longer gets 400
    max_tokens_limit: int = 4096  # a request's max_tokens above this gets 400
    max_conversations: int = 100_000  # conversation ids remembered for /v1/feedback
    max_n: int = 8  # a request's `n` above this gets 400
    teams: dict[str, TeamPolicy] = field(default_factory=dict)  # team -> policy (default: TeamPolicy())
    rate_limit_rpm: float | None = None  # requests per minute per API key (token bucket); None = off
    rate_limit_burst: int | None = None  # the bucket's size; None = one minute's worth
    request_timeout_s: float = 600.0  # default deadline of a request, and the most a request may ask
    drain_timeout_s: float = 30.0  # on shutdown, in-flight requests get this long to finish
    probe_timeout_s: float = 10.0  # /health/ready: the engine's one-token probe must answer in this

    def policy(self, team: str) -> TeamPolicy:
        return self.teams.get(team) or TeamPolicy()
