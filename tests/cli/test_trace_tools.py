"""Trace tools on a real served team: every turn span carries its graph node and step (so trajectories
rebuilt from traces have them), `teamtr traces list` / `show` read the SQLite span store with their
filters, and the serve banner names the span and conversation stores."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from typer.testing import CliRunner

from teamtr.cli.main import app
from teamtr.cli.serve import stores_line
from teamtr.graphs.trajectory import load_jsonl
from teamtr.serving.server import ServeConfig
from tests.support.serving import make_run_dir, serve_in_background

cli = CliRunner()


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    """Three episodes on two conversations (one continued), feedback on one; the store and the
    trajectories the server recorded."""
    root = tmp_path_factory.mktemp("traced")
    run_dir = make_run_dir(tiny_model_dir, root / "run", versions=2)
    db = root / "traces.db"
    config = ServeConfig.from_run_dir(run_dir, "chain", tracing={"sqlite_path": str(db)})
    recorded = []
    with serve_in_background(config, on_trajectory=recorded.append) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        first = client.chat.completions.create(
            model="chain", messages=[{"role": "user", "content": "12+7+30+5"}], metadata={"conversation_id": "c-a"}
        )
        client.chat.completions.create(
            model="chain", messages=[{"role": "user", "content": "3+4+5+6"}], metadata={"conversation_id": "c-b"}
        )
        client.chat.completions.create(
            model="chain", messages=[{"role": "user", "content": "1+1+1+1"}], metadata={"conversation_id": "c-a"}
        )
        ok = httpx.post(server.url + "/v1/feedback", json={"conversation_id": "c-b", "reward": 0.5}, timeout=30)
        assert ok.status_code == 200, ok.text
        assert server.server.tracer.flush()
    return {"db": db, "recorded": recorded, "first": first.id, "run_dir": run_dir}


def _json(args: list[str]) -> list[dict]:
    result = cli.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_trajectories_from_traces_carry_node_and_step(served, tmp_path):
    out = tmp_path / "t.jsonl"
    result = cli.invoke(app, ["traces", "to-trajectories", str(served["db"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    back = {t.task_id: t for t in load_jsonl(out)}
    assert len(back) == len(served["recorded"]) == 3
    for traj in served["recorded"]:
        turns = back[traj.task_id].turns
        # the chain team's graph: one node per role, one superstep each, in order
        assert [t.node for t in turns] == [t.node for t in traj.turns] == ["adder1", "adder2", "adder3"]
        assert [t.step for t in turns] == [t.step for t in traj.turns]
        assert all(isinstance(t.step, int) for t in turns) and [t.step for t in turns] == sorted(
            t.step for t in turns
        )


def test_list_filters_by_conversation_role_version_and_time(served):
    db = str(served["db"])
    everything = _json(["traces", "list", db])
    assert [e["conversation_id"] for e in everything] == ["c-a", "c-b", "c-a"]  # oldest first
    versions = {"adder1": 2, "adder2": 2, "adder3": 2}
    assert all(e["turns"] == 3 and e["adapter_versions"] == versions for e in everything)
    assert [e["reward"] for e in everything] == [None, 0.5, None]
    assert [e["conversation_id"] for e in _json(["traces", "list", db, "-c", "c-a"])] == ["c-a", "c-a"]
    assert len(_json(["traces", "list", db, "--role", "adder2", "--version", "2"])) == 3
    assert _json(["traces", "list", db, "--role", "adder2", "--version", "1"]) == []
    assert _json(["traces", "list", db, "--role", "nobody"]) == []
    assert len(_json(["traces", "list", db, "--since", "1h"])) == 3
    assert _json(["traces", "list", db, "--since", "2999-01-01T00:00"]) == []
    assert _json(["traces", "list", db, "--until", "2000-01-01"]) == []
    assert [e["episode_id"] for e in _json(["traces", "list", db, "--limit", "1"])] == [
        everything[-1]["episode_id"]
    ]
    assert [e["episode_id"] for e in _json(["traces", "list", db, "-e", served["first"]])] == [served["first"]]


def test_list_and_show_print_tables(served):
    db = str(served["db"])
    wide = {"COLUMNS": "200"}  # a terminal's width (CliRunner's default is 80)
    listed = cli.invoke(app, ["traces", "list", db], env=wide)
    assert listed.exit_code == 0, listed.output
    assert "3 episode(s) of chain" in listed.output and "c-b" in listed.output
    assert " v2 " in listed.output  # every role on version 2
    short = served["first"][: len("chatcmpl-") + 8]  # the short id the table shows, which `show` takes
    assert short in listed.output and served["first"] not in listed.output
    shown = cli.invoke(app, ["traces", "show", db, short], env=wide)
    assert shown.exit_code == 0, shown.output
    first = next(t for t in served["recorded"] if t.task_id == served["first"])
    assert "node" in shown.output and "step" in shown.output and "12+7+30+5" in shown.output
    for turn in first.turns:
        assert turn.node in shown.output and f"{turn.adapter}@v{turn.adapter_version}" in shown.output
    # a conversation id shows each of its episodes; role and version filter the turns shown
    (one, two) = _json(["traces", "show", db, "c-a", "--role", "adder3"])
    assert [t["role"] for t in one["turns"] + two["turns"]] == ["adder3", "adder3"]
    assert one["turns"][0]["node"] == "adder3" and one["turns"][0]["text"] == first.turns[2].text


def test_show_and_list_say_what_is_wrong(served, tmp_path):
    missing = cli.invoke(app, ["traces", "show", str(served["db"]), "no-such-id"])
    assert missing.exit_code != 0 and "no episode or conversation 'no-such-id'" in missing.output
    no_store = cli.invoke(app, ["traces", "list", str(tmp_path / "none.db")])
    assert no_store.exit_code == 1 and "no span store at" in no_store.output
    by_directory = _json(["traces", "list", str(served["db"].parent)])  # the directory holding traces.db
    assert len(by_directory) == 3
    bad_time = cli.invoke(app, ["traces", "list", str(served["db"]), "--since", "yesterday"])
    assert bad_time.exit_code != 0 and "want an ISO time" in bad_time.output


def test_the_serve_banner_names_both_stores(served):
    config = ServeConfig.from_run_dir(served["run_dir"], "chain")
    line = stores_line(config)
    run = served["run_dir"].resolve()
    assert f"traces: {run / 'traces.db'}" in line and f"conversations: {run / 'conversations.db'}" in line
    config.tracing.sqlite_path = None
    config.conversations_path = None
    assert stores_line(config) == "traces: off (teamtr traces list ...); conversations: in memory"
