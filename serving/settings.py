"""Limits, keys and per-team policies of one server (serving/server.py builds them from a `ServeConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, Field, model_validator

from teamtr.client.protocol import REWARD_BOUND

SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "stop")  # what a team may pin per role


@dataclass
class TeamPolicy:
    """How one team is served: its admission bounds and the sampling settings it pins per role.

    `pinned`: role -> {field: value} for fields in SAMPLING_FIELDS; a request cannot override them
    (serving/sampling.py). `exploration_share` of the episodes (drawn one by one) sample at
    `exploration_temperature` instead, for training on their feedback (serving/exploration.py). `max_in_flight` episodes run at once; `max_waiting` more wait in its queue;
    beyond that a request gets 429 (serving/limits.py)."""

    max_in_flight: int = 64
    max_waiting: int = 256
    pinned: dict[str, dict[str, object]] = field(default_factory=dict)
    # the share of episodes sampled at `exploration_temperature` (serving/exploration.py); 0: all as served
    exploration_share: float = 0.0
    exploration_temperature: float = 1.0
    exploration_seed: int | None = None  # None: the draws are seeded from the OS


class ApiLimits(BaseModel):
    """The API's keys and limits, as a `ServeConfig` (serving/server.py) names them and the app reads them:
    written once, so a serve option cannot be read by the config and then dropped on its way to the app."""

    api_keys: list[str] = Field(default_factory=list)  # Bearer keys accepted by the chat API; empty: none needed
    admin_key: str | None = None  # Bearer key of the /admin endpoints; None = they answer 403
    max_body_bytes: int = Field(1_000_000, ge=1)  # larger request bodies get 413
    max_n: int = Field(8, ge=1)  # a request's `n` (episodes, one choice each) above this gets 400
    rate_limit_rpm: float | None = Field(None, gt=0)  # requests per minute per API key (token bucket); None: off
    rate_limit_burst: int | None = Field(None, ge=1)  # the bucket's size; None = one minute's worth
    request_timeout_s: float = Field(600.0, gt=0)  # default deadline of a request, and the most it may ask
    drain_timeout_s: float = Field(30.0, ge=0)  # on shutdown, in-flight requests get this long to finish
    reward_range: tuple[float, float] = (-REWARD_BOUND, REWARD_BOUND)  # /v1/feedback outside it: 400

    @model_validator(mode="after")
    def _reward_range_in_bounds(self) -> ApiLimits:
        low, high = self.reward_range
        if not -REWARD_BOUND <= low < high <= REWARD_BOUND:
            raise ValueError(f"reward_range must be low < high within +-{REWARD_BOUND:g}")
        return self


class ServeSettings(ApiLimits):
    """Defaults: an open chat API, admin endpoints off (no admin key), no rate limit, open pages, pushes
    from anywhere. `ServeConfig(preset="production")` (serving/server.py) keys everything but liveness and
    readiness and confines pushes to adapter roots. The fields beyond `ApiLimits` are derived by the server
    (a prompt budget from the model's context, the teams' policies, the preset's pages and roots)."""

    max_prompt_tokens: int = 256  # the task (with folded context) in tokens; longer gets 400
    max_tokens_limit: int = 4096  # a request's max_tokens above this gets 400
    max_conversations: int = 100_000  # conversation ids remembered for /v1/feedback
    teams: dict[str, TeamPolicy] = Field(default_factory=dict)  # team -> policy (default: TeamPolicy())
    probe_timeout_s: float = 10.0  # /health/ready: the engine's one-token probe must answer in this
    # /docs, /redoc, /openapi.json, /health and /metrics need a key (API or admin); liveness and
    # readiness stay open
    protect_pages: bool = False
    adapter_roots: tuple[str, ...] | None = None  # pushed adapter paths must be under one; None: anywhere

    def policy(self, team: str) -> TeamPolicy:
        return self.teams.get(team) or TeamPolicy()
