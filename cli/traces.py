"""`teamtr traces list|show|to-trajectories`: the span store of `teamtr serve` (traces.db, or the replicas'
shared PostgreSQL store), read back.

    teamtr traces list runs/demo/run --role adder2 --version 3 --since 2h   # the run's traces.db
    teamtr traces show runs/demo/run/traces.db chatcmpl-1a2b          # an episode, or a whole conversation
    teamtr traces to-trajectories runs/demo/run/traces.db --out served.jsonl

`list` prints one row per served episode, `show` every turn of the episodes it names (node, step, role,
adapter version, tokens, text); both filter by conversation, episode, role, version, team and time, and
print JSON with `--json`. The reading is serving/trace_query.py.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from teamtr.serving.pg_store import is_database_url

app = typer.Typer(
    help="Stored traces: list and show served episodes, or turn them into trajectories.", no_args_is_help=True
)

def _store_path(path: str) -> str | Path:
    """A directory (the run or serve directory `teamtr serve` wrote it in) stands for its traces.db; a
    postgresql:// URL (the replicas' shared store, `teamtr serve --db`) stays as it is."""
    if is_database_url(path):
        return path
    return Path(path) / "traces.db" if Path(path).is_dir() else Path(path)


_DB = typer.Argument(
    ...,
    help="the SQLite span store (traces.db, beside conversations.db), the directory holding it, or the "
    "postgresql:// URL several replicas share (teamtr serve --db)",
    callback=_store_path,
)
_CONVERSATION = typer.Option(None, "--conversation", "-c", help="only this conversation (an id or its prefix)")
_ROLE = typer.Option(None, "--role", "-r", help="only episodes where this role (or adapter) spoke")
_VERSION = typer.Option(None, "--version", "-v", help="... at this adapter version (of --role, if given)")
_TEAM = typer.Option(None, "--team", help="only this served team")
_SINCE = typer.Option(None, help="started at or after: an ISO time (2026-12-01T21:00) or an age (30m, 2h, 1d)")
_UNTIL = typer.Option(None, help="started before: an ISO time or an age")
_JSON = typer.Option(False, "--json", help="print JSON instead of tables")

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_LAST_NS = 2**63 - 1


def parse_time(text: str | None, option: str) -> int | None:
    """Nanoseconds since the epoch of `--since` / `--until`: an age ('30m': that long ago) or an ISO time
    (local time unless it names its zone)."""
    if text is None:
        return None
    age = _AGE.match(text)
    if age:
        return time.time_ns() - int(float(age.group(1)) * _SECONDS[age.group(2)] * 1e9)
    try:
        ns = int(datetime.fromisoformat(text).timestamp() * 1e9)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: want an ISO time (2026-12-01T21:00) or an age (90s, 30m, 2h, 1d)", param_hint=option
        ) from None
    return max(0, min(ns, _LAST_NS))  # SQLite integers are 64-bit: years past 2262 do not fit


def _where(conversation, episode, role, version, team, since, until):
    from teamtr.serving.trace_query import TraceFilter

    return TraceFilter(
        conversation=conversation,
        episode=episode,
        role=role,
        version=version,
        team=team,
        since_ns=parse_time(since, "--since"),
        until_ns=parse_time(until, "--until"),
    )


def _clock(ns: int) -> str:
    """The time of day for today's episodes, else the date and minute (narrow: it is a table column)."""
    when = datetime.fromtimestamp(ns / 1e9)
    return when.strftime("%H:%M:%S" if when.date() == datetime.now().date() else "%m-%d %H:%M")


def short_id(value: str, keep: int = 8) -> str:
    """`chatcmpl-1a2b3c4d` of a long id (as git shortens hashes): what `show` and `-c` / `-e` take."""
    head, sep, tail = value.rpartition("-")
    return value if len(tail) <= keep + 2 else f"{head}{sep}{tail[:keep]}"


def _seconds(start_ns: int, end_ns: int) -> str:
    return f"{(end_ns - start_ns) / 1e9:.2f}"


def _one_line(text: str | None, width: int = 60) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def versions_text(versions: dict[str, int]) -> str:
    """`v2` when every role ran on version 2, else `adder1@v2 adder2@v3`."""
    if len(set(versions.values())) == 1:
        return f"v{next(iter(versions.values()))}"
    return " ".join(f"{r}@v{v}" for r, v in sorted(versions.items()))


def _reward(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


@app.command("list")
def traces_list(
    db: str = _DB,
    conversation: str = _CONVERSATION,
    episode: str = typer.Option(None, "--episode", "-e", help="an episode's completion or trace id (prefix)"),
    role: str = _ROLE,
    version: int = _VERSION,
    team: str = _TEAM,
    since: str = _SINCE,
    until: str = _UNTIL,
    limit: int = typer.Option(50, min=1, help="the newest N episodes that match"),
    as_json: bool = _JSON,
) -> None:
    """One row per served episode: when, conversation, team, roles at their versions, tokens, reward."""
    from teamtr.serving.trace_query import traced_episodes

    where = _where(conversation, episode, role, version, team, since, until)
    episodes = traced_episodes(db, where, limit=limit)
    if as_json:
        typer.echo(json.dumps([{**e.as_dict(), "turns": len(e.turns)} for e in episodes], indent=2))
        return
    teams = sorted({e.team for e in episodes})
    title = f"{db}: {len(episodes)} episode(s)" + (f" of {teams[0]}" if len(teams) == 1 else "")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in ("started", "episode", "conversation", *(["team"] if len(teams) > 1 else [])):
        table.add_column(column, no_wrap=True)  # a short id: `show` and the filters take prefixes
    for column in ("turns", "versions", "tokens", "s", "reward"):
        table.add_column(column, justify="left" if column == "versions" else "right", no_wrap=True)
    table.add_column("answer", overflow="fold")
    for e in episodes:
        table.add_row(
            _clock(e.start_ns),
            short_id(e.episode_id),
            short_id(e.conversation_id),
            *([e.team] if len(teams) > 1 else []),
            str(len(e.turns)),
            versions_text(e.adapter_versions),
            f"{e.input_tokens}/{e.output_tokens}",
            _seconds(e.start_ns, e.end_ns),
            _reward(e.reward),
            Text(_one_line(e.final_answer, 40)) if e.status != "ERROR" else Text("ERROR", style="red"),
        )
    Console().print(table)
    if not episodes:
        Console(stderr=True).print("no episodes match (spans reach the store a few seconds after an episode)")


@app.command("show")
def traces_show(
    db: str = _DB,
    id_: str = typer.Argument(
        ..., metavar="ID", help="an episode's completion or trace id, or a conversation's (ids or prefixes)"
    ),
    role: str = _ROLE,
    version: int = _VERSION,
    since: str = _SINCE,
    until: str = _UNTIL,
    full: bool = typer.Option(False, "--full", help="whole turn texts (default: the first 200 characters)"),
    as_json: bool = _JSON,
) -> None:
    """Every turn of an episode (or of each episode of a conversation): node, step, role, adapter version,
    tokens, time, text; then the final answer and the conversation's feedback."""
    from teamtr.serving.trace_query import traced_episodes

    episodes = traced_episodes(db, _where(None, id_, role, version, None, since, until), turns_only=True)
    if not episodes:  # not an episode id: a conversation's
        episodes = traced_episodes(db, _where(id_, None, role, version, None, since, until), turns_only=True)
    if not episodes:
        raise typer.BadParameter(f"no episode or conversation {id_!r} in {db} (see `teamtr traces list`)")
    if as_json:
        typer.echo(json.dumps([e.as_dict() for e in episodes], indent=2))
        return
    console = Console()
    width = None if full else 200
    for e in episodes:
        console.rule(f"episode {e.episode_id}  ({e.team}, conversation {e.conversation_id})", align="left")
        took = _seconds(e.start_ns, e.end_ns)
        console.print(f"started {_clock(e.start_ns)}, {took} s, status {e.status}, trace {e.trace_id}")
        console.print(Text(f"task: {e.task}"))
        table = Table(show_lines=True)
        for column in ("#", "node", "step", "role", "adapter", "tokens in/out", "s"):
            table.add_column(column, justify="right" if column in ("#", "step", "s") else "left")
        table.add_column("text", overflow="fold", min_width=20)
        for t in e.turns:
            adapter = f"{t.adapter}@v{t.version}" if t.adapter else t.base_model
            text = t.text if width is None or len(t.text) <= width else t.text[: width - 1] + "…"
            table.add_row(
                str(t.index),
                t.node or "",
                "" if t.step is None else str(t.step),
                t.role,
                adapter,
                f"{t.input_tokens}/{t.output_tokens}",
                _seconds(t.start_ns, t.end_ns),
                Text(text.rstrip("\n")),
            )
        console.print(table)
        console.print(Text(f"answer: {e.final_answer}"))
        if e.reward is not None:
            comment = f" ({e.feedback_comment})" if e.feedback_comment else ""
            console.print(Text(f"feedback reward: {_reward(e.reward)}{comment}"))


@app.command("to-trajectories")
def traces_to_trajectories(
    db: str = _DB,
    out: Path = typer.Option(..., "--out", help="JSONL of Trajectory records, as training reads them"),
    require_reward: bool = typer.Option(False, help="only episodes whose conversation got feedback"),
    group_by_prompt: bool = typer.Option(
        False, help="episodes of the same prompt share a group id (non-zero group-normalised advantages)"
    ),
) -> None:
    """Stored spans + feedback rewards -> the Trajectory objects training consumes (each turn with the
    graph node and step it was made in)."""
    from teamtr.graphs.trajectory import save_jsonl
    from teamtr.serving.tracing import trajectories_from_store

    if not is_database_url(db) and not Path(db).is_file():
        raise typer.BadParameter(f"no span store at {db}")
    trajectories = trajectories_from_store(db, require_reward, group_by_prompt)
    save_jsonl(trajectories, out)
    Console(stderr=True).print(f"{len(trajectories)} trajectories -> {out}")
