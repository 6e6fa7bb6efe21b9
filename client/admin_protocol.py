"""The wire format of the admin API (serving/admin.py, client/admin_client.py): adapter versions pushed,
rolled back and listed; a candidate team loaded, shared, decided; promoted teams restored; what
`teamtr improve --watch` reports; and the served episodes and feedback trajectories `teamtr improve` reads.
The chat API's own shapes: client/protocol.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class AdapterPushRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1, max_length=4096, description="peft adapter directory on the server")
    version: int | None = Field(None, ge=0, description="default: from a v<N> directory name, or next")


class AdapterRollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(min_length=1, max_length=128)


class AdapterVersionInfo(BaseModel):
    role: str
    version: int
    engine_name: str
    path: str
    live: bool
    in_flight: int
    current: bool
    candidate: bool = False  # loaded under canary, never current (serving/canary.py)
    lineage: dict[str, Any] = Field(default_factory=dict)  # run, data window, incumbent it came from
    # serving | candidate | promoted (earlier) | rolled_back | abandoned (serving/registry.py `state`)
    state: str = "promoted"


class CandidateInfo(BaseModel):
    versions: dict[str, int]  # adapter -> candidate version
    incumbent: dict[str, int]  # adapter -> the current version it would replace
    lineage: dict[str, Any] = Field(default_factory=dict)
    share: float  # of new episodes pinned to it
    episodes: int  # drawn since the share was set
    canary_episodes: int  # of them, on the candidate
    total_canary_episodes: int
    shadow: bool = False  # each canary episode also answered by the incumbent (serving/episodes.py)


class AdapterListResponse(BaseModel):
    roles: dict[str, list[AdapterVersionInfo]]
    current: dict[str, int]
    candidate: CandidateInfo | None = None
    teams: list[dict[str, int]] = Field(default_factory=list)  # every promoted team, oldest first


ReportKey = Annotated[str, Field(min_length=1, max_length=64)]


class ImproveReport(BaseModel):
    """What `teamtr improve --watch` is doing (`POST /admin/improve`), shown on /metrics."""

    model_config = ConfigDict(extra="forbid")

    team: str = Field(min_length=1, max_length=128)
    phase: str = Field(min_length=1, max_length=64, description="waiting | backing_off | running")
    rounds: int = Field(0, ge=0, description="rounds finished by this watch")
    attempt: int = Field(0, ge=0, description="the improve attempt of the last or current round")
    outcomes: dict[ReportKey, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, max_length=16, description="rounds by outcome"
    )
    last_decision: str | None = Field(None, max_length=64, description="promoted | refused | ...")
    figures: dict[ReportKey, Annotated[float, Field(allow_inf_nan=False)]] = Field(
        default_factory=dict, max_length=64, description="the last decision's figures (finite)"
    )
    setbacks: int = Field(0, ge=0, description="refusals / rollbacks / no-changes in a row")
    backoff_s: float = Field(0.0, ge=0, allow_inf_nan=False, description="the wait after the last round")
    not_before_s: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="unix time before which no round starts"
    )
    new_episodes: int = Field(0, ge=0, description="served episodes since the last round's window")
    new_feedback: int = Field(0, ge=0, description="... of them with feedback")

    @field_validator(
        "rounds",
        "attempt",
        "setbacks",
        "new_episodes",
        "new_feedback",
        "backoff_s",
        "not_before_s",
        mode="before",
    )
    @classmethod
    def _a_number(cls, v: Any) -> Any:
        if isinstance(v, bool | str):  # JSON true/"3" would be 1/3 otherwise; integral floats are integers
            raise ValueError("must be a JSON number")
        return v

    @field_validator("outcomes", "figures", mode="before")
    @classmethod
    def _numbers(cls, v: Any) -> Any:
        if isinstance(v, dict) and any(isinstance(x, bool | str) for x in v.values()):
            raise ValueError("values must be JSON numbers")
        return v


class CandidateAbandonRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rolled_back: bool = Field(False, description="its canary decided against it (listed as rolled back)")
    reason: str | None = Field(None, max_length=2000)


class TeamRestoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    team: int = Field(ge=0, description="index into the listing's promoted teams")

    @field_validator("team", mode="before")
    @classmethod
    def _not_a_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):  # JSON true/false would be 1/0 otherwise
            raise ValueError("team must be an integer, not a boolean")
        return v


class CandidateVersion(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=4096, description="peft adapter directory on the server")
    version: int | None = Field(None, ge=0)


class CandidateLoadRequest(BaseModel):
    """Stage a candidate team: a version of each adapter it changes, none of them current."""

    model_config = ConfigDict(extra="forbid")

    versions: dict[str, CandidateVersion] = Field(min_length=1)
    lineage: dict[str, Any] = Field(default_factory=dict)
    share: float = Field(0.0, ge=0, le=1, description="share of new episodes it serves at once")
    shadow: bool = Field(
        False,
        description="answer each canary request again with the incumbent (a shadow episode, not returned)",
    )


class CanaryShareRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    share: float = Field(ge=0, le=1)


class CandidateDecision(BaseModel):
    decision: Literal["promoted", "abandoned", "rolled_back", "restored"]
    versions: dict[str, int]
    current: dict[str, int]


class ServedEpisode(BaseModel):
    """One served episode as its span store has it (serving/served_episodes.py)."""

    completion_id: str
    conversation_id: str
    team: str
    prompt: str
    final_answer: str | None
    adapter_versions: dict[str, int]  # role -> version it ran on
    start_ns: int
    end_ns: int
    reward: float | None = None  # the conversation's latest feedback, if any
    exploration: bool = False  # sampled at the training temperature (serving/exploration.py)
    # a canary episode and the incumbent's shadow answer to the same request share a pair id; the shadow
    # was never returned (listed only when asked for: GET /admin/episodes?shadows=true)
    pair_id: str | None = None
    shadow: bool = False


class ServedEpisodesResponse(BaseModel):
    episodes: list[ServedEpisode]


EXPLORATION_KEY = "exploration"  # an exploratory episode's trajectory metadata flag (serving/exploration.py)


class FeedbackTrajectoriesResponse(BaseModel):
    """Exploratory episodes with feedback, as graphs/trajectory.py Trajectory dicts (turns with token
    ids and behaviour log-probs, the feedback as reward)."""

    trajectories: list[dict[str, Any]]
