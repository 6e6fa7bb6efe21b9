"""A small typed HTTP client of a running server's /admin endpoints (the `teamtr adapters` commands use it).

The endpoints' bodies are client/admin_protocol.py's; the server side is serving/admin.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from teamtr.client.admin_protocol import (
    AdapterListResponse,
    AdapterVersionInfo,
    CandidateDecision,
    CandidateInfo,
    FeedbackTrajectoriesResponse,
    ImproveReport,
    ServedEpisode,
    ServedEpisodesResponse,
)
from teamtr.graphs.trajectory import Trajectory

DEFAULT_URL = "http://127.0.0.1:8000"


class ServerUnreachableError(Exception):
    """No HTTP answer at all (wrong URL, server down)."""


class AdminRequestError(Exception):
    """The server answered with an error (4xx/5xx); `message` is the OpenAI-shaped error's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class AdminClient:
    def __init__(
        self, url: str = DEFAULT_URL, admin_key: str | None = None, timeout_s: float = 120.0
    ) -> None:
        self.url, self.admin_key, self.timeout_s = url.rstrip("/"), admin_key, timeout_s

    def push(self, role: str, path: str | Path, version: int | None = None) -> AdapterVersionInfo:
        """Validate and promote the adapter at `path` (a directory on the server's machine)."""
        body = {"role": role, "path": str(path), "version": version}
        return AdapterVersionInfo.model_validate(self._request("POST", "/admin/adapters", body))

    def rollback(self, role: str) -> AdapterVersionInfo:
        """The previously promoted version of `role`'s adapter serves again; returns it."""
        return AdapterVersionInfo.model_validate(
            self._request("POST", "/admin/adapters/rollback", {"role": role})
        )

    def list_versions(self) -> AdapterListResponse:
        return AdapterListResponse.model_validate(self._request("GET", "/admin/adapters"))

    # ---- candidate team under canary (serving/canary.py) ----
    def candidate(self) -> CandidateInfo | None:
        data = self._request("GET", "/admin/candidate")
        return CandidateInfo.model_validate(data) if data else None

    def load_candidate(
        self,
        versions: dict[str, tuple[str | Path, int | None]],
        lineage: dict[str, Any] | None = None,
        share: float = 0.0,
        shadow: bool = False,
    ) -> CandidateInfo:
        """Validate and load a candidate version of each adapter (adapter -> (path, version)), none current;
        `shadow`: each canary request is answered again by the incumbent (not returned), for pairing."""
        body = {
            "versions": {a: {"path": str(p), "version": v} for a, (p, v) in versions.items()},
            "lineage": lineage or {},
            "share": share,
            "shadow": shadow,
        }
        return CandidateInfo.model_validate(self._request("POST", "/admin/candidate", body))

    def set_canary_share(self, share: float) -> CandidateInfo:
        return CandidateInfo.model_validate(self._request("POST", "/admin/candidate/share", {"share": share}))

    def promote_candidate(self) -> CandidateDecision:
        return CandidateDecision.model_validate(self._request("POST", "/admin/candidate/promote"))

    def rollback_promotion(self) -> CandidateDecision:
        """The last promoted candidate team goes back to the versions it replaced, all roles at once."""
        return CandidateDecision.model_validate(self._request("POST", "/admin/candidate/rollback"))

    def abandon_candidate(self, rolled_back: bool = False, reason: str | None = None) -> CandidateDecision:
        """Drop the candidate; `rolled_back`: its canary decided against it."""
        body = {"rolled_back": rolled_back, "reason": reason}
        return CandidateDecision.model_validate(self._request("POST", "/admin/candidate/abandon", body))

    def restore_team(self, team: int) -> CandidateDecision:
        """The promoted team `list_versions().teams[team]` serves again, every adapter at once."""
        return CandidateDecision.model_validate(self._request("POST", "/admin/teams/restore", {"team": team}))

    def report_improve(self, report: ImproveReport) -> ImproveReport:
        """`teamtr improve --watch`'s state, for the server's /metrics."""
        return ImproveReport.model_validate(self._request("POST", "/admin/improve", report.model_dump()))

    def episodes(
        self, team: str | None = None, since_ns: int = 0, limit: int | None = None, shadows: bool = False
    ) -> list[ServedEpisode]:
        """`shadows`: with the canary's shadow episodes (the incumbent's unreturned answers)."""
        query = _query(team, since_ns, limit) + ("&shadows=true" if shadows else "")
        data = self._request("GET", f"/admin/episodes?{query}")
        return ServedEpisodesResponse.model_validate(data).episodes

    def feedback_episodes(
        self, team: str | None = None, since_ns: int = 0, limit: int | None = None
    ) -> list[Trajectory]:
        """Exploratory served episodes with feedback, as trajectories (GET /admin/feedback-episodes)."""
        data = self._request("GET", f"/admin/feedback-episodes?{_query(team, since_ns, limit)}")
        found = FeedbackTrajectoriesResponse.model_validate(data).trajectories
        return [Trajectory.from_dict(t) for t in found]

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}
        try:
            r = httpx.request(method, self.url + path, json=body, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as e:
            raise ServerUnreachableError(f"cannot reach {self.url}: {e}") from None
        is_json = r.headers.get("content-type", "").startswith("application/json")
        data = r.json() if is_json else {}
        if r.status_code >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            message = error.get("message", r.text) if isinstance(error, dict) else r.text
            raise AdminRequestError(r.status_code, message)
        return data


def _query(team: str | None, since_ns: int, limit: int | None) -> str:
    pairs = (("team", team), ("since_ns", since_ns), ("limit", limit))
    return "&".join(f"{k}={v}" for k, v in pairs if v is not None)
