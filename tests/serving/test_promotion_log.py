"""Durable promotion (serving/promotion_log.py, serving/registry.py `attach_log`): what the admin API
promoted, loaded as candidates, rolled back and abandoned is in the run's promotion log, written before each switch;
a server started again on the run, after SIGKILL too, serves the last promoted team and lists every
version's state and lineage; `teamtr adapters restore` returns to an earlier promoted team."""

from __future__ import annotations

import signal

import httpx
from typer.testing import CliRunner

from teamtr.cli.serve import app as cli_app
from teamtr.client.admin_client import AdminClient
from teamtr.engines.embedded import EmbeddedEngine
from teamtr.graphs.run_layout import read_records, version_dirs
from teamtr.serving.promotion_log import PromotionLog
from teamtr.serving.registry import AdapterRegistry
from tests.support.serve_process import serve_process
from tests.support.serving import ROLES, make_run_dir, write_versions


async def registry_on(model_dir, run_dir, log) -> AdapterRegistry:
    """A server's registry as `build_server` makes it: the run's newest versions, then the log."""
    registry = AdapterRegistry(EmbeddedEngine(model_dir, threads=1))
    for role in ROLES:
        version, path = version_dirs(run_dir, role)[-1]
        await registry.push(role, path, version)
    await registry.attach_log(log)
    return registry


async def test_a_registry_replays_its_log(tiny_model_dir, tmp_path):
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    cand = write_versions(tiny_model_dir, tmp_path / "cand", range(2, 4), roles=("adder2", "adder3"))
    log = PromotionLog(run / "promotions.jsonl")
    first = await registry_on(tiny_model_dir, run, log)
    v = {k: {a: (cand / "adapters" / a / f"v{k}", k) for a in ("adder2", "adder3")} for k in (2, 3)}
    await first.load_candidate(v[2], {"run": "attempt-1", "attempt_id": "a1"})
    await first.promote_candidate()
    await first.load_candidate({"adder2": v[3]["adder2"]}, {"attempt_id": "a2"})
    await first.abandon_candidate(rolled_back=True, reason="canary: worse")
    await first.load_candidate({"adder3": v[3]["adder3"]}, {"attempt_id": "a3"})  # the server dies here
    assert first.current_versions() == {"adder1": 1, "adder2": 2, "adder3": 2}

    again = await registry_on(tiny_model_dir, run, log)
    assert again.current_versions() == {"adder1": 1, "adder2": 2, "adder3": 2}
    assert again.candidate is None
    states = {(a, v.version): again.state(v) for a in ROLES for v in again.versions(a)}
    assert states == {
        ("adder1", 1): "serving",
        ("adder2", 1): "promoted",
        ("adder2", 2): "serving",
        ("adder2", 3): "rolled_back",
        ("adder3", 1): "promoted",
        ("adder3", 2): "serving",
        ("adder3", 3): "abandoned",  # loaded when the server died
    }
    assert again.versions("adder2")[1].lineage == {"run": "attempt-1", "attempt_id": "a1", "incumbent": 1}
    assert again.teams == [{r: 1 for r in ROLES}, {"adder1": 1, "adder2": 2, "adder3": 2}]
    engine_names = set(again.engine.adapters())
    assert engine_names == {"adder1@v1", "adder2@v2", "adder3@v2"}  # the run's v1 unloaded again
    assert await again.rollback_promotion() == {"adder2": 1, "adder3": 1}  # the promotion, undone
    assert again.current_versions() == {r: 1 for r in ROLES}
    third = await registry_on(tiny_model_dir, run, log)
    assert third.current_versions() == {r: 1 for r in ROLES}
    assert third.state(third.versions("adder2")[1]) == "rolled_back"
    assert await third.restore_team(1) == {"adder1": 1, "adder2": 2, "adder3": 2}
    events = [r["event"] for r in read_records(log.path)]
    assert events.count("started") == 3 and events[-1] == "restored"


def test_a_server_killed_after_a_promotion_serves_it_again(tiny_model_dir, tmp_path):
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    cand = write_versions(tiny_model_dir, tmp_path / "cand", range(2, 3), roles=("adder2", "adder3"))
    versions = {a: (cand / "adapters" / a / "v2", 2) for a in ("adder2", "adder3")}
    lineage = {"run": str(tmp_path / "cand"), "data_window": "last 24", "attempt_id": "a1"}
    promoted = {"adder1": 1, "adder2": 2, "adder3": 2}
    args = (str(run), "--admin-key", "adm", "--team-name", "chain")
    with serve_process(*args, stop_signal=signal.SIGKILL) as url:
        client = AdminClient(url, "adm")
        client.load_candidate(versions, lineage, share=0.5)
        metrics = httpx.get(url + "/metrics").text  # the candidate's state, for dashboards
        assert 'teamtr_candidate_version{adapter="adder2"} 2.0' in metrics
        assert "teamtr_canary_share 0.5" in metrics
        assert client.promote_candidate().current == promoted
        metrics = httpx.get(url + "/metrics").text
        assert 'teamtr_candidate_decisions_total{decision="promoted"} 1.0' in metrics
        assert "teamtr_canary_share 0.0" in metrics
    with serve_process(*args, stop_signal=signal.SIGKILL) as url:  # after kill -9
        client = AdminClient(url, "adm")
        listed = client.list_versions()
        assert listed.current == promoted and listed.candidate is None
        (v2,) = [v for v in listed.roles["adder2"] if v.version == 2]
        assert v2.state == "serving" and v2.live and v2.lineage == {**lineage, "incumbent": 1}
        assert [v.state for v in listed.roles["adder2"]] == ["promoted", "serving"]
        assert listed.teams == [{r: 1 for r in ROLES}, promoted]
        env = {"TEAMTR_URL": url, "TEAMTR_ADMIN_KEY": "adm"}
        result = CliRunner().invoke(cli_app, ["adapters", "list"], env=env)
        assert result.exit_code == 0, result.output
        text = " ".join(result.output.split())
        assert "promoted team 1: adder1 v1, adder2 v2, adder3 v2 (serving)" in text
        assert "serving" in text.split("promoted team")[0] and "promoted" in text.split("promoted team")[0]
        chat = client._request(
            "POST",
            "/v1/chat/completions",
            {"model": "chain", "messages": [{"role": "user", "content": "1+2"}]},
        )
        assert chat["teamtr"]["adapter_versions"] == promoted  # the span's numbers are the folder's
        result = CliRunner().invoke(cli_app, ["adapters", "restore", "--team", "0"], env=env)
        assert result.exit_code == 0, result.output
    with serve_process(*args) as url:
        listed = AdminClient(url, "adm").list_versions()
        assert listed.current == {r: 1 for r in ROLES}
        assert [v.state for v in listed.roles["adder3"]] == ["serving", "rolled_back"]
