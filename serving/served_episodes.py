"""Served episodes read back from the span store (serving/span_reader.py: a SQLite file, or the replicas'
shared PostgreSQL store): what `teamtr improve` (improve/) takes as its task distribution and
canary evidence, through `GET /admin/episodes` (serving/admin.py), straight from a serve directory's
traces.db, or from the postgresql:// URL every replica writes to.

One record per finished episode span: team, prompt, final answer, the adapter version each role ran on
(which tells a canary episode from an incumbent one) and the conversation's latest feedback reward.
Shadow episodes (the incumbent answering a canary request again, unreturned: serving/episodes.py) are
left out unless asked for: they are no traffic of their own.
"""

from __future__ import annotations

import json
from pathlib import Path

from teamtr.client.admin_protocol import ServedEpisode
from teamtr.graphs.trajectory import Trajectory
from teamtr.serving.pg_store import is_database_url
from teamtr.serving.span_reader import StoredSpan, episode_spans, feedback_spans, stored_spans
from teamtr.serving.tracing import (
    ADAPTER_VERSIONS,
    AGENT_NAME,
    CONVERSATION_ID,
    EXPLORATION,
    FINAL_ANSWER,
    OP_AGENT,
    OPERATION,
    PAIR_ID,
    REWARD,
    SHADOW,
    TASK_ID,
    TASK_TEXT,
    trajectories_from_spans,
)


def store_exists(store: str | Path) -> bool:
    """A SQLite span store's file exists, or the store is the shared database (its table always does)."""
    return is_database_url(store) or Path(store).is_file()


def served_episodes(
    store: str | Path,
    *,
    team: str | None = None,
    since_ns: int = 0,
    limit: int | None = None,
    shadows: bool = False,
) -> list[ServedEpisode]:
    """Finished episodes that started at or after `since_ns`, oldest first (the newest `limit` of them);
    `shadows`: with the canary's shadow episodes."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if not store_exists(store):
        return []
    rows = episode_spans(store, since_ns=since_ns)
    rewards: dict[str, float] = {}
    for feedback in feedback_spans(store):
        rewards[feedback.attributes[CONVERSATION_ID]] = float(feedback.attributes[REWARD])
    out = []
    for span in rows:
        a, start_ns, end_ns = span.attributes, span.start_ns, span.end_ns
        if span.status == "ERROR" or TASK_ID not in a or (team is not None and a.get(AGENT_NAME) != team):
            continue
        if a.get(SHADOW, False) and not shadows:
            continue
        conversation = a.get(CONVERSATION_ID, "")
        out.append(
            ServedEpisode(
                completion_id=a[TASK_ID],
                conversation_id=conversation,
                team=a.get(AGENT_NAME, ""),
                prompt=a.get(TASK_TEXT, ""),
                final_answer=a.get(FINAL_ANSWER),
                adapter_versions={k: int(v) for k, v in json.loads(a.get(ADAPTER_VERSIONS, "{}")).items()},
                start_ns=int(start_ns),
                end_ns=int(end_ns),
                reward=rewards.get(conversation),
                exploration=bool(a.get(EXPLORATION, False)),
                pair_id=a.get(PAIR_ID),
                shadow=bool(a.get(SHADOW, False)),
            )
        )
    return out[-limit:] if limit is not None else out


def feedback_trajectories(
    store: str | Path, *, team: str | None = None, since_ns: int = 0, limit: int | None = None
) -> list[Trajectory]:
    """The exploratory episodes (`teamtr.exploration`) that got feedback, as trajectories with their
    turns' token ids and behaviour log-probs, rewarded by that feedback and grouped by prompt (what
    `teamtr improve` trains on without a verifier: improve/feedback.py); oldest first, the newest
    `limit` of them. A turn span without token ids (served with capture_tokens off) is an error
    (serving/tracing.py MissingTokensError)."""
    if not store_exists(store):
        return []

    def wanted(span: StoredSpan) -> bool:
        a = span.attributes
        if a.get(OPERATION) != OP_AGENT:
            return True  # turn and feedback spans: trajectories_from_spans pairs them with episodes
        return (
            span.start_ns >= since_ns
            and bool(a.get(EXPLORATION, False))
            and (team is None or a.get(AGENT_NAME) == team)
        )

    found = trajectories_from_spans(
        (s for s in stored_spans(store) if wanted(s)), require_reward=True, group_by_prompt=True
    )
    return found[-limit:] if limit is not None else found
