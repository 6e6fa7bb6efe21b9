"""The promotion log: one JSON line per gate decision, canary start, promotion or rollback, appended and
flushed to disk before the step it records is reported (never rewritten), so a team's history of
versions, the data each came from, the figures and the decisions survive any crash.

`teamtr improve` (training/improve/loop.py) writes it; a line is a dict with at least `event`, `time`
(ISO) and `time_ns`.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def append_record(path: str | Path, event: str, **fields: Any) -> dict[str, Any]:
    now = time.time_ns()
    record = {
        "event": event,
        "time": datetime.fromtimestamp(now / 1e9, UTC).isoformat(),
        "time_ns": now,
        **fields,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return record


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line (a line cut short by a crash mid-write is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
