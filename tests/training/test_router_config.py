"""`team.router: module:function` (training/config.py) decides who speaks in a run's rollouts and when
the run is served (graphs/spec.py `build_team`, serving/server.py `served_team`); a bad spec is one
clear SpecError line.

The router below is this module's own: the chain team's roles in reverse order, once each, where
round-robin would give adder1, adder2, adder3.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import openai
import pytest

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.evals.teams import load_eval_team
from teamtr.graphs.spec import SpecError, build_team
from teamtr.graphs.trajectory import load_jsonl
from teamtr.serving.server import ServeConfig, ServedTeamConfig, served_team
from teamtr.training.run_dir import RunDir, RunDirError
from tests.support import trainer_task
from tests.support.serving import serve_in_background
from tests.support.trainer import small_config, train  # noqa: F401  (registers the test task)

REVERSED = ["adder3", "adder2", "adder1"]


def reversed_chain(state) -> Literal["adder3", "adder2", "adder1", "__end__"]:
    """adder3, adder2, adder1, then END."""
    k = len(state["transcript"])
    return REVERSED[k] if k < len(REVERSED) else "__end__"


def to_nobody(state) -> Literal["nobody", "__end__"]:
    return "nobody"


ROUTER = f"{__name__}:reversed_chain"


def test_a_run_trains_and_serves_with_its_configured_router(tiny_model, tmp_path):  # noqa: F811
    cfg = small_config(tiny_model, tmp_path / "run", **{"team.router": ROUTER})
    updates = train(cfg)
    assert len(updates) == 3
    # the rollout batches the trainer checkpointed are the router's turn order, not round-robin
    batches = sorted((tmp_path / "run" / "checkpoints").glob("step-*/batches/*.jsonl"))
    trajectories = [t for path in batches for t in load_jsonl(path)]
    assert trajectories
    assert all([turn.role for turn in t.turns] == REVERSED for t in trajectories)

    # `teamtr eval RUN_DIR` builds its teams with the run's router too
    eval_team = load_eval_team(str(tmp_path / "run"), "test-digit-start")
    assert eval_team.team_options == {"router": reversed_chain}

    config = ServeConfig.from_run_dir(tmp_path / "run", "chain")  # no router given: the run's
    served = []
    with serve_in_background(config, on_trajectory=served.append) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="chain", messages=[{"role": "user", "content": "1+2"}])
    assert [t["role"] for t in r.model_extra["teamtr"]["turns"]] == REVERSED
    assert [t.role for t in served[0].turns] == REVERSED


@pytest.mark.parametrize(
    ("router", "message"),
    [
        ("nomodule:x", "cannot import module 'nomodule'"),
        ("os:sep", "has no callable 'sep'"),
        ("os.path:join", "a custom router must declare where it can route"),
        (f"{__name__}:to_nobody", "router names unknown roles ['nobody']"),
    ],
)
def test_a_bad_router_is_one_clear_error(tiny_model, tmp_path, router, message):  # noqa: F811
    cfg = small_config(tiny_model, tmp_path / "run", **{"team.router": router})
    roles = RunDir.create(small_config(tiny_model, tmp_path / "run")).roles
    engine = EmbeddedEngine(tiny_model, adapters={r.adapter: None for r in roles}, threads=1)
    with pytest.raises(SpecError) as err:
        build_team(cfg.team, roles, engine, name="t")
    assert message in str(err.value) and "team.router" in str(err.value)
    assert "\n" not in str(err.value)
    if router.startswith("nomodule"):  # a router that cannot be imported fails when the run is opened
        cfg.run_dir = str(tmp_path / "other")
        with pytest.raises(RunDirError, match="config.yaml: team.router: .*nomodule"):
            RunDir.create(cfg)


def test_a_served_team_router_and_max_turns_override_the_runs(tiny_model):  # noqa: F811
    """ServedTeamConfig.router / max_turns, over a run's (or round-robin's) defaults."""
    roles = trainer_task.roles()
    engine = EmbeddedEngine(tiny_model, adapters={r.adapter: None for r in roles}, threads=1)
    spec = ServedTeamConfig(router=ROUTER, max_turns=2)
    team = served_team("t", spec, None, roles, engine)
    trajectory = asyncio.run(team.arun("1+2", seed=0))
    assert [t.role for t in trajectory.turns] == REVERSED[:2]
    plain = served_team("t", ServedTeamConfig(), None, roles, engine)
    assert [t.role for t in asyncio.run(plain.arun("1+2", seed=0)).turns] == ["adder1", "adder2", "adder3"]
    with pytest.raises(SpecError, match="team 't': team.router: .*nomodule"):
        served_team("t", ServedTeamConfig(router="nomodule:x"), None, roles, engine)
