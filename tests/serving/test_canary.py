"""Candidate teams under canary (serving/registry.py, serving/canary.py): staged versions are never
current, a canary share is drawn once per episode for every adapter the candidate covers (never a mixed
team), promotion switches all of them in one step, abandoning drops them; the admin API, its client and
`teamtr adapters list` show the candidate, its share and lineage; served episodes come back from the span
store (serving/served_episodes.py), and episodes of one prompt share a group (serving/tracing.py)."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from teamtr.cli.serve import app as cli_app
from teamtr.client.admin_client import AdminClient, AdminRequestError
from teamtr.engines.embedded import EmbeddedEngine
from teamtr.graphs.run_layout import version_dirs
from teamtr.graphs.trajectory import prompt_group
from teamtr.serving.adapter_checks import AdapterError
from teamtr.serving.registry import AdapterRegistry
from teamtr.serving.server import ServeConfig
from teamtr.serving.tracing import trajectories_from_store
from teamtr.training.advantages import group_normalised_advantages
from tests.support.serving import ROLES, make_run_dir, serve_in_background, write_versions


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
    return make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=3)


async def test_canary_pins_whole_teams_and_promotes_atomically(tiny_model_dir, run_dir):
    engine = EmbeddedEngine(tiny_model_dir, threads=1)
    registry = AdapterRegistry(engine)
    for role in ROLES:
        await registry.push(role, version_dirs(run_dir, role)[0][1])  # v1 serves
    v2 = {r: (version_dirs(run_dir, r)[1][1], 2) for r in ("adder2", "adder3")}
    candidate = await registry.load_candidate(v2, {"run": "improve-1"})
    assert candidate.incumbent == {"adder2": 1, "adder3": 1}
    assert registry.current_versions() == {r: 1 for r in ROLES}  # staged, never current
    assert registry.current("adder2").version == 1 and registry.is_candidate("adder2", 2)
    assert registry.versions("adder2")[1].lineage == {"run": "improve-1", "incumbent": 1}
    with pytest.raises(AdapterError, match="candidate"):  # no push over a role under canary
        await registry.push("adder2", version_dirs(run_dir, "adder2")[2][1])

    async with registry.pin(list(ROLES)) as pins:  # share 0: staged only
        assert {v for _, v in pins.values()} == {1}
    registry.set_canary_share(0.5)
    seen = []
    held = []
    for _ in range(10):
        cm = registry.pin(list(ROLES))
        pins = await cm.__aenter__()
        held.append(cm)
        seen.append({a: v for a, (_, v) in pins.items()})
    assert sum(s["adder2"] == 2 for s in seen) == 5  # the share is met exactly
    for s in seen:  # every episode is all-candidate or all-incumbent
        assert s in ({"adder1": 1, "adder2": 2, "adder3": 2}, {"adder1": 1, "adder2": 1, "adder3": 1})
    promoted = await registry.promote_candidate()
    assert promoted == {"adder2": 2, "adder3": 2} and registry.candidate is None
    assert registry.current_versions() == {"adder1": 1, "adder2": 2, "adder3": 2}
    assert {"adder2@v1", "adder2@v2"} <= set(engine.adapters())  # v1 still pinned by episodes in flight
    for cm in held:
        await cm.__aexit__(None, None, None)
    assert set(engine.adapters()) == {"adder1@v1", "adder2@v2", "adder3@v2"}

    await registry.load_candidate({"adder2": (version_dirs(run_dir, "adder2")[2][1], 3)})
    registry.set_canary_share(1.0)
    async with registry.pin(list(ROLES)) as pins:
        assert pins["adder2"][1] == 3
        assert await registry.abandon_candidate() == {"adder2": 3}
        assert "adder2@v3" in engine.adapters()  # the canary episode finishes on it
    assert "adder2@v3" not in engine.adapters()
    assert registry.current_versions()["adder2"] == 2
    async with registry.pin(list(ROLES)) as pins:
        assert pins["adder2"][1] == 2
    with pytest.raises(AdapterError, match="no candidate"):
        await registry.promote_candidate()

    # the promoted team rolled back for all its roles in one step (v1 reloaded: it had been unloaded)
    async with registry.pin(list(ROLES)) as pins:
        assert await registry.rollback_promotion() == {"adder2": 1, "adder3": 1}
        assert {a: v for a, (_, v) in pins.items()} == {"adder1": 1, "adder2": 2, "adder3": 2}
    assert registry.current_versions() == {r: 1 for r in ROLES}
    assert set(engine.adapters()) == {"adder1@v1", "adder2@v1", "adder3@v1"}
    with pytest.raises(AdapterError, match="no promoted candidate"):
        await registry.rollback_promotion()


def test_candidate_through_the_admin_api_and_cli(tiny_model_dir, tmp_path):
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    config = ServeConfig.from_run_dir(run, "chain", admin_key="adm", tracing={"sqlite_path": "traces.db"})
    with serve_in_background(config) as server:
        client = AdminClient(server.url, "adm")
        path = write_versions(tiny_model_dir, run, range(2, 3), roles=("adder2",)) / "adapters/adder2/v2"
        lineage = {"run": "runs/improve/r1", "data_window": "last 4", "incumbent": {"adder2": 1}}
        info = client.load_candidate({"adder2": (path, 7)}, lineage, share=1.0)
        assert info.versions == {"adder2": 7} and info.share == 1.0
        chat = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "chain", "messages": [{"role": "user", "content": "1+2+3+4"}], "n": 2},
        ).json()
        assert [c["adapter_versions"]["adder2"] for c in chat["teamtr"]["choices"]] == [7, 7]
        client.set_canary_share(0.0)
        httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "chain", "messages": [{"role": "user", "content": "1+2+3+4"}]},
        ).raise_for_status()
        listed = client.list_versions()
        assert listed.current["adder2"] == 1 and listed.candidate.total_canary_episodes == 2
        assert [v.candidate for v in listed.roles["adder2"]] == [False, True]
        result = CliRunner().invoke(
            cli_app, ["adapters", "list"], env={"TEAMTR_URL": server.url, "TEAMTR_ADMIN_KEY": "adm"}
        )
        assert result.exit_code == 0, result.output
        assert "candidate: adder2 v1 -> v7; canary share 0" in result.output
        assert "run=runs/improve/r1" in " ".join(result.output.split())

        episodes = client.episodes(team="chain")
        assert [e.adapter_versions["adder2"] for e in episodes] == [7, 7, 1]
        assert {e.prompt for e in episodes} == {"1+2+3+4"}
        assert client.episodes(team="chain", limit=1)[0].adapter_versions["adder2"] == 1
        assert client.episodes(team="other") == []

        decision = client.promote_candidate()
        assert decision.current == {"adder1": 1, "adder2": 7, "adder3": 1}
        assert client.rollback_promotion().current == {"adder1": 1, "adder2": 1, "adder3": 1}
        assert client.list_versions().current["adder2"] == 1
        with pytest.raises(AdminRequestError) as e:
            client.abandon_candidate()
        assert e.value.status == 409
        server.server.tracer.flush()
    # served episodes of one prompt share a group, so their group-normalised advantages are not all zero
    trajectories = trajectories_from_store(run / "traces.db", group_by_prompt=True)
    assert {t.group_id for t in trajectories} == {prompt_group("1+2+3+4")}
    assert all(t.metadata["prompt"] == "1+2+3+4" for t in trajectories)
    by_request = trajectories_from_store(run / "traces.db")
    assert len({t.group_id for t in by_request}) == 2  # n = 2 shares a request id; the third is alone
    rewards = [1.0, 0.0, 1.0]
    grouped = group_normalised_advantages(rewards, [t.group_id for t in trajectories])
    alone = group_normalised_advantages(rewards, [str(i) for i in range(3)])
    assert abs(grouped.values).sum() > 1.0 and abs(alone.values).sum() == 0.0


def test_improve_abandon_drops_the_unfinished_attempts_candidate(tiny_model_dir, tmp_path):
    """`teamtr improve --abandon` after a kill mid-canary: the attempt's candidate (known by its id) is
    dropped, the incumbent serves, the promotion log says so; a second --abandon has nothing to do."""
    from teamtr.graphs.run_layout import read_records
    from teamtr.improve.loop import ImproveConfig, ImproveLoop

    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    path = (
        write_versions(tiny_model_dir, tmp_path / "cand", range(2, 3), roles=("adder2",))
        / "adapters/adder2/v2"
    )
    config = ServeConfig.from_run_dir(run, "chain", admin_key="adm", tracing={"sqlite_path": None})
    with serve_in_background(config) as server:
        client = AdminClient(server.url, "adm")
        client.load_candidate({"adder2": (path, 2)}, {"attempt_id": "a1"}, share=0.5)
        work = tmp_path / "work"
        loop = ImproveLoop(
            ImproveConfig(
                run_dir=str(run), work_dir=str(work), team="chain", url=server.url, admin_key="adm"
            ),
            say=lambda _: None,
        )
        window = {"episodes": 4, "since_ns": 0, "until_ns": 1}
        loop.save(
            {
                "attempt": 1,
                "id": "a1",
                "phase": "canary",
                "run_dir": "r",
                "incumbent": {"adder2": [1, "p"]},
                "window": window,
                "candidate_versions": {"adder2": 2},
            }
        )
        state = loop.run(abandon=True)
        assert state["outcome"] == "abandoned" and state["phase"] == "done"
        assert client.candidate() is None and client.list_versions().current["adder2"] == 1
        (record,) = read_records(work / "decisions.jsonl")
        assert (
            record["event"] == "abandoned"
            and record["phase"] == "canary"
            and record["candidate"] == {"adder2": 2}
        )
        assert loop.run(abandon=True)["outcome"] == "abandoned"  # done already: nothing more happens
        assert len(read_records(work / "decisions.jsonl")) == 1


def test_watch_reports_through_the_admin_api_show_on_metrics(tiny_model_dir, tmp_path):
    """`POST /admin/improve` (the watch's state): admin key only, bad figures refused in OpenAI's error
    shape with nothing stored, a report shown on /metrics; a few teams' reports at most."""
    from prometheus_client.parser import text_string_to_metric_families

    from teamtr.client.admin_protocol import ImproveReport
    from teamtr.serving.admin import MAX_REPORTS

    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    with serve_in_background(ServeConfig.from_run_dir(run, "chain", admin_key="adm")) as server:
        body = {"team": "chain", "phase": "backing_off", "figures": {"gate_lower_bound": -0.2}}
        assert httpx.post(server.url + "/admin/improve", json=body).status_code == 401
        bad = httpx.post(
            server.url + "/admin/improve",
            content='{"team": "chain", "phase": "waiting", "figures": {"gate_kl_adder2": NaN}}',
            headers={"Authorization": "Bearer adm", "Content-Type": "application/json"},
        )
        assert bad.status_code == 400 and "error" in bad.json()
        client = AdminClient(server.url, "adm")
        report = ImproveReport(
            team="chain",
            phase="backing_off",
            rounds=3,
            outcomes={"promoted": 1, "refused": 2},
            last_decision="refused",
            figures={"gate_lower_bound": -0.2, "gate_prompts": 12},
            setbacks=2,
            backoff_s=1200,
        )
        assert client.report_improve(report) == report
        text = httpx.get(server.url + "/metrics").text
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("teamtr_improve")
        }
        assert samples[("teamtr_improve_rounds_total", (("outcome", "refused"), ("team", "chain")))] == 2
        assert samples[("teamtr_improve_last_decision", (("decision", "refused"), ("team", "chain")))] == 1
        figure = ("teamtr_improve_last_decision_figure", (("figure", "gate_lower_bound"), ("team", "chain")))
        assert samples[figure] == -0.2
        assert samples[("teamtr_improve_backoff_seconds", (("team", "chain"),))] == 1200
        assert samples[("teamtr_improve_phase", (("phase", "backing_off"), ("team", "chain")))] == 1
        for k in range(MAX_REPORTS - 1):
            client.report_improve(ImproveReport(team=f"t{k}", phase="waiting"))
        with pytest.raises(AdminRequestError) as e:
            client.report_improve(ImproveReport(team="one-too-many", phase="waiting"))
        assert e.value.status == 409
        client.report_improve(report)  # a known team's report still replaces its last
