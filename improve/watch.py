"""`teamtr improve --watch`: the loop run continuously. A round starts when enough new served episodes
(or new feedback) have arrived since the last round's window; after a refusal, a rollback or no change
it backs off (doubling, capped) before the next; an unfinished round (a kill) is continued first. Each
round's outcome goes to the decisions log as any attempt's does, and the timeline PNG is redrawn.

The watch's state (phase, rounds by outcome, the last decision and its figures, the back-off, the new
traffic counted) is posted to the server (`POST /admin/improve`), which shows it on /metrics, and kept
in `WORK/watch.jsonl` (a line whenever it changes).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from teamtr.client.admin_client import AdminRequestError, ServerUnreachableError
from teamtr.client.admin_protocol import ImproveReport
from teamtr.graphs.run_layout import append_record
from teamtr.improve.data import ImproveDataError
from teamtr.improve.loop import LOG_FILE, ImproveLoop
from teamtr.improve.timeline import write_timeline

SETBACKS = ("refused", "rolled_back", "no_change")
WATCH_LOG = "watch.jsonl"


@dataclass
class WatchConfig:
    new_episodes: int = 200  # served episodes since the last window that start a round ...
    new_feedback: int = 50  # ... or episodes with feedback
    poll_s: float = 30.0
    backoff_s: float = 600.0  # after a setback: wait this long, doubled per setback in a row ...
    max_backoff_s: float = 6 * 3600.0  # ... up to this
    rounds: int | None = None  # stop after this many rounds (None: run until killed)


def backoff(setbacks: int, cfg: WatchConfig) -> float:
    """Seconds to wait after `setbacks` refusals / rollbacks / no-changes in a row (0 after a promotion)."""
    return 0.0 if setbacks == 0 else min(cfg.backoff_s * 2 ** (setbacks - 1), cfg.max_backoff_s)


def new_traffic(episodes: list[Any], since_ns: int) -> tuple[int, int]:
    """(episodes started after `since_ns`, how many of them have feedback)."""
    new = [e for e in episodes if e.start_ns > since_ns]
    return len(new), sum(e.reward is not None for e in new)


def due(new_episodes: int, new_feedback: int, cfg: WatchConfig) -> bool:
    """Enough new traffic for a round (`new_traffic`'s counts): episodes or feedback past their threshold."""
    return new_episodes >= cfg.new_episodes or new_feedback >= cfg.new_feedback


def decision_figures(state: dict[str, Any]) -> dict[str, float]:
    """The round's numeric figures, flat: the gate's as gate_* (its per-role KL as gate_kl_<adapter>), the
    canary's as canary_*; non-finite values are left out (JSON and the report carry finite numbers)."""
    out: dict[str, float] = {}
    for prefix in ("gate", "canary"):
        for key, value in (state.get(prefix) or {}).items():
            items = value.items() if isinstance(value, dict) and key == "kl" else [("", value)]
            for sub, v in items:
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                    out[f"{prefix}_{key}{'_' + sub if sub else ''}"] = float(v)
    return out


class Watch:
    def __init__(
        self,
        loop: ImproveLoop,
        cfg: WatchConfig,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.loop, self.cfg, self.sleep, self.clock = loop, cfg, sleep, clock
        self.outcomes: Counter[str] = Counter()
        self.report = ImproveReport(team=loop.cfg.team, phase="waiting")
        self._logged: dict[str, Any] | None = None

    def publish(self, **changes: Any) -> None:
        """Update the report; send it to the server (a server that is away misses it) and log a change."""
        self.report = self.report.model_copy(update={**changes, "outcomes": dict(self.outcomes)})
        record = self.report.model_dump()
        if record != self._logged:
            append_record(self.loop.work / WATCH_LOG, "watch", **record)
            self._logged = record
        try:
            self.loop.client.report_improve(self.report)
        except (ServerUnreachableError, AdminRequestError) as e:
            self.loop.say(f"watch: report not sent: {e}")

    def run(self) -> list[str]:
        """Rounds until `cfg.rounds` (forever when None); returns their outcomes."""
        outcomes: list[str] = []
        setbacks, not_before = 0, 0.0
        while self.cfg.rounds is None or len(outcomes) < self.cfg.rounds:
            state = self.loop.load_state()
            unfinished = state is not None and state.get("phase") != "done"
            since = int(state["window"]["until_ns"]) if state and "window" in state else 0
            if not unfinished:
                try:
                    n, feedback = new_traffic(self.loop.episodes(since), since)
                except ServerUnreachableError as e:
                    self.loop.say(f"watch: {e}")
                    self.sleep(self.cfg.poll_s)
                    continue
                ready = due(n, feedback, self.cfg)
                waiting = "backing_off" if self.clock() < not_before else "waiting"
                self.publish(
                    phase="running" if ready and waiting == "waiting" else waiting,
                    new_episodes=n,
                    new_feedback=feedback,
                )
                if waiting == "backing_off" or not ready:
                    self.sleep(self.cfg.poll_s)
                    continue
            else:
                self.publish(phase="running")
            try:
                state = self.loop.run()
            except (ImproveDataError, ServerUnreachableError) as e:  # too few prompts yet; server away
                self.loop.say(f"watch: {e}")
                self.publish(phase="waiting")
                self.sleep(self.cfg.poll_s)
                continue
            outcome = str(state.get("outcome") or state.get("decision"))
            outcomes.append(outcome)
            self.outcomes[outcome] += 1
            setbacks = setbacks + 1 if outcome in SETBACKS else 0
            wait = backoff(setbacks, self.cfg)
            not_before = self.clock() + wait
            self.publish(
                phase="backing_off" if wait > 0 else "waiting",
                rounds=len(outcomes),
                attempt=int(state.get("attempt", 0)),
                last_decision=outcome,
                figures=decision_figures(state),
                setbacks=setbacks,
                backoff_s=wait,
                not_before_s=not_before,
                new_episodes=0,
                new_feedback=0,
            )
            write_timeline(self.loop.work / LOG_FILE, self.loop.work / "timeline.png")
            self.loop.say(f"watch: round {len(outcomes)} {outcome}; next no sooner than {wait:g} s")
        return outcomes
