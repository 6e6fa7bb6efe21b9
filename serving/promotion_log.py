"""The promotion log: what a server promoted, loaded as candidates, rolled back and abandoned, and where every version
came from, one JSON line per event in the run directory (`RUN/promotions.jsonl`), appended, flushed and
fsynced before the change it records takes effect (never rewritten). The adapter registry writes it
(serving/registry.py); a server started on the run reads it back (`replay`), so after any restart,
kill -9 included, it serves the last promoted team with every version's state and lineage.

Events (each with `event`, `time` (ISO) and `time_ns`):

    registered  a version loaded for the first time: adapter, version, dir, base, lineage
    started     a server started: `stacks` (adapter -> its promoted versions, top = serving)
    pushed | rolled_back_role | promoted | promotion_rolled_back | restored
                what serves changed: `stacks`, `current`, and the versions it concerns
    loaded      a candidate: `versions`, `incumbent`, `lineage`, `shadow`
    share       the candidate's canary share was set: `share`
    candidate_rolled_back | abandoned
                a candidate dropped (by its canary's decision, or otherwise): `versions`, `reason`

Only the changes (`pushed` ... `restored`) decide what a restarted server serves: a log with `started`
lines alone leaves the run's newest versions in charge. Its `teams` are the promoted teams (each a
version per adapter) in order, which `teamtr adapters restore` returns to.

Several replicas (`teamtr serve --db postgresql://...`) share one log, `SharedPromotionLog`: the rows of
the `promotion_events` table in commit order, the same records. A replica reads the log's head before
each new episode and replays what it has not applied (serving/registry.py `follow`), so a change made
through any replica is served by every replica's next episode.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from teamtr.graphs.run_layout import append_record, read_records  # the run's JSONL event logs
from teamtr.serving.pg_store import PgStore, redacted

PROMOTION_LOG = "promotions.jsonl"
CHANGES = ("pushed", "rolled_back_role", "promoted", "promotion_rolled_back", "restored")
# a version's state, as `teamtr adapters list` shows it ("serving" and "candidate" are computed live)
STATUS_OF_EVENT = {"candidate_rolled_back": "rolled_back", "abandoned": "abandoned"}


@dataclass
class VersionRecord:
    adapter: str
    version: int
    path: str
    base: str
    lineage: dict[str, Any] = field(default_factory=dict)
    status: str = "promoted"  # promoted | candidate | rolled_back | abandoned


@dataclass
class History:
    """A promotion log read back: every version, the promoted stacks, the promoted teams."""

    versions: dict[str, dict[int, VersionRecord]] = field(default_factory=dict)
    stacks: dict[str, list[int]] | None = None  # None: no change recorded, the run's newest serve
    teams: list[dict[str, int]] = field(default_factory=list)
    promotions: list[dict[str, int]] = field(default_factory=list)  # candidates promoted, not undone
    pending: dict[str, int] | None = None  # a candidate loaded and never decided (the server died)
    pending_record: dict[str, Any] | None = None  # its `loaded` record (incumbent, lineage, shadow)
    share: float = 0.0  # the pending candidate's canary share

    def version(self, adapter: str, version: int) -> VersionRecord | None:
        return self.versions.get(adapter, {}).get(version)


def _set_status(history: History, versions: dict[str, int], status: str) -> None:
    for adapter, version in versions.items():
        found = history.version(adapter, int(version))
        if found is not None:
            found.status = status


def replay(records: list[dict[str, Any]]) -> History:
    h = History()
    for r in records:
        event = r["event"]
        if event == "registered":
            v = VersionRecord(r["adapter"], int(r["version"]), r["dir"], r["base"], r.get("lineage") or {})
            h.versions.setdefault(v.adapter, {})[v.version] = v
        elif event == "loaded":
            h.pending = {a: int(v) for a, v in r["versions"].items()}
            h.pending_record, h.share = r, float(r.get("share", 0.0))
            _set_status(h, h.pending, "candidate")
        elif event == "share":
            h.share = float(r["share"])
        elif event in STATUS_OF_EVENT:
            _set_status(h, r["versions"], STATUS_OF_EVENT[event])
            h.pending = h.pending_record = None
        if "stacks" not in r:
            continue
        stacks = {a: [int(v) for v in vs] for a, vs in r["stacks"].items()}
        if event in CHANGES:
            h.stacks = stacks
            _set_status(h, r.get("retired") or {}, "rolled_back")
            _set_status(h, {a: vs[-1] for a, vs in stacks.items() if vs}, "promoted")
        if event == "promoted":
            h.pending = h.pending_record = None
            h.promotions.append({a: int(v) for a, v in r["versions"].items()})
        elif event == "promotion_rolled_back" and h.promotions:
            h.promotions.pop()
        current = {a: vs[-1] for a, vs in stacks.items() if vs}
        if event in ("started", "pushed", "promoted") and (not h.teams or h.teams[-1] != current):
            h.teams.append(current)
    return h


class PromotionLog:
    """The log of one server's registry (appends only)."""

    shared = False  # other servers append to it too (SharedPromotionLog)

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        return append_record(self.path, event, **fields)

    def history(self) -> History:
        return replay(read_records(self.path))


class SharedPromotionLog(PromotionLog):
    """The promotion log of several replicas, in the shared store's `promotion_events` table: one row per
    event, numbered in commit order (`head` is the newest number)."""

    shared = True

    def __init__(self, store: PgStore) -> None:
        self.store = store
        self.path = Path(redacted(store.url))  # what messages name it by

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        now = time.time_ns()
        record = {
            "event": event,
            "time": datetime.fromtimestamp(now / 1e9, UTC).isoformat(),
            "time_ns": now,
            **fields,
        }
        with self.store.connection() as conn:  # autocommit: durable before the change it records
            conn.execute("INSERT INTO promotion_events (record) VALUES (%s)", (json.dumps(record, default=str),))
        return record

    def head(self) -> int:
        """The number of the newest event (0: none yet)."""
        with self.store.connection() as conn:
            (seq,) = conn.execute("SELECT coalesce(max(seq), 0) FROM promotion_events").fetchone()
        return int(seq)

    def records(self) -> tuple[int, list[dict[str, Any]]]:
        """Every event in order, and the newest one's number, read in one statement."""
        with self.store.connection() as conn:
            rows = conn.execute("SELECT seq, record FROM promotion_events ORDER BY seq").fetchall()
        return (int(rows[-1][0]) if rows else 0), [json.loads(r) for _, r in rows]

    def history(self) -> History:
        return replay(self.records()[1])
