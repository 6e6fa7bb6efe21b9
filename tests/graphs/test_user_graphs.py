"""A user's own LangGraph graphs (examples/review_loop.py, examples/parallel_merge.py) trained with the
TeamTR schedule and served, from their configs alone (docs/graphs.md, "From a config"), on a seconds-sized
random Llama; and the config's bad-input errors.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
import yaml

from teamtr.graphs.run_layout import read_metrics
from teamtr.graphs.spec import SpecError
from teamtr.training.config import TrainConfig
from teamtr.training.run_dir import RunDir, RunDirError
from tests.support.example_graphs import ROOT, example_config, train

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from teamtr.training.warmstart import tiny_random_model

    return str(tiny_random_model(tmp_path_factory.mktemp("tiny") / "model"))


def assert_resampled_after_each_update(records: list[dict], order: list[str]) -> None:
    updates = [r for r in records if r["kind"] in ("update", "skipped")]
    assert [u["role"] for u in updates] == order
    done = [u for u in updates if u["kind"] == "update"]
    assert done, "no role was updated"
    for prev, cur in zip(done, done[1:], strict=False):
        # update i's batch was sampled after update i-1 was swapped in: its turns carry the new version
        assert cur["batch_key"] != prev["batch_key"] and cur["fresh"]
        if prev["adapter"] in cur["batch_turn_versions"]:
            assert cur["batch_turn_versions"][prev["adapter"]] == [prev["version_after"]]
        assert cur["versions_before"][prev["adapter"]] == prev["version_after"]


def test_review_loop_trains_with_teamtr_in_its_own_order(tiny_model, tmp_path):
    cfg = example_config("review_loop", tiny_model, tmp_path / "run")
    records = train(cfg)
    assert_resampled_after_each_update(records, ["solver", "reviewer", "planner", "finalizer"])
    updates = [r for r in records if r["kind"] == "update"]
    # the loop ran: solver turns in a batch outnumber planner turns whenever the checker failed
    assert all(u["messages"] > 0 for u in updates)
    for role in ("planner", "solver", "finalizer"):
        assert (Path(cfg.run_dir) / "adapters" / role / "v0").is_dir()


def test_parallel_merge_trains_on_private_views(tiny_model, tmp_path):
    records = train(example_config("parallel_merge", tiny_model, tmp_path / "run"))
    assert_resampled_after_each_update(records, ["reader_a", "reader_b", "merger"])


def test_team_train_updates_only_the_roles_it_names(tiny_model, tmp_path):
    cfg = example_config("parallel_merge", tiny_model, tmp_path / "run", **{"team.train": ["merger"]})
    records = train(cfg)
    assert_resampled_after_each_update(records, ["merger"])
    adapters = Path(cfg.run_dir) / "adapters"
    assert sorted(p.name for p in (adapters / "reader_a").iterdir()) == ["v0"]  # never moved
    (merger,) = [r for r in records if r["kind"] == "update"]
    assert merger["versions_before"]["reader_a"] == 0


def test_team_train_naming_no_role_is_refused(tiny_model, tmp_path):
    for train_ in (["mergr"], []):
        cfg = example_config("parallel_merge", tiny_model, tmp_path / "run", **{"team.train": train_})
        with pytest.raises(SpecError, match=r"team.train .* must name some of the roles"):
            train(cfg)
    cfg = example_config(
        "parallel_merge", tiny_model, tmp_path / "run", **{"team.train": ["merger"], "team.shared_adapter": True}
    )
    with pytest.raises(SpecError, match=r"team.train with team.shared_adapter"):
        train(cfg)


# ---- bad input --------------------------------------------------------------------------------------

BAD_SOURCE = """
import math
from examples.parallel_merge import build as _build

def not_a_graph(models):
    return {"nodes": []}

def asks_for_nobody(models):
    async def node(state):
        await models.model("nobody").ainvoke("hi")
        return {}
    from langgraph.graph import StateGraph, START, END
    from examples.parallel_merge import MergeState
    g = StateGraph(MergeState)
    g.add_node("lonely", node)
    g.add_edge(START, "lonely")
    g.add_edge("lonely", END)
    return g.compile()

CALLS = []
LIMIT = [math.inf]

def flaky_reward(task, state):
    CALLS.append(task.id)
    return math.nan if len(CALLS) > LIMIT[0] else float(bool(state.get("answer")))
"""
bad = types.ModuleType("teamtr_test_bad_graphs")
sys.modules["teamtr_test_bad_graphs"] = bad
exec(textwrap.dedent(BAD_SOURCE), bad.__dict__)


def test_a_factory_that_returns_no_graph_is_one_error_naming_it(tiny_model, tmp_path):
    cfg = example_config(
        "parallel_merge", tiny_model, tmp_path / "run", **{"team.graph": "teamtr_test_bad_graphs:not_a_graph"}
    )
    with pytest.raises(SpecError, match=r"team.graph 'teamtr_test_bad_graphs:not_a_graph' returned a dict"):
        train(cfg)


def test_an_unknown_role_fails_the_batch_by_name_and_is_recorded(tiny_model, tmp_path):
    cfg = example_config(
        "parallel_merge",
        tiny_model,
        tmp_path / "run",
        **{"team.graph": "teamtr_test_bad_graphs:asks_for_nobody", "eval.stage_episodes": 0},
    )
    with pytest.raises(RunDirError, match=r"stage 1 rollout 0 failed: EpisodeError: .*role 'nobody'"):
        train(cfg)
    (failed,) = read_metrics(cfg.run_dir, kind="failed")
    assert "nobody" in failed["error"] and failed["where"] == "stage 1 rollout 0"


def test_a_non_finite_reward_fails_the_batch_and_the_run_resumes(tiny_model, tmp_path):
    cfg = example_config(
        "parallel_merge",
        tiny_model,
        tmp_path / "run",
        stages=2,
        # the sampled check draws no probe episodes, whose count depends on which updates had signal
        **{"team.reward": "teamtr_test_bad_graphs:flaky_reward", "trust_region.check": "sampled"},
    )
    # stage 0: the held-out evaluation before it, 3 fresh rollouts of 2 x 3 episodes, the evaluation after
    bad.LIMIT[0] = 2 + 3 * 6 + 2
    with pytest.raises(
        RunDirError, match=r"stage 2 rollout 0 failed: RewardError: .*flaky_reward.* returned nan"
    ):
        train(cfg)
    assert read_metrics(cfg.run_dir, kind="failed")
    assert [s["stage"] for s in read_metrics(cfg.run_dir, kind="stage")] == [1]
    bad.LIMIT[0] = math.inf  # fixed: the same config resumes at stage 1
    records = train(cfg)
    assert [s["stage"] for s in read_metrics(cfg.run_dir, kind="stage")] == [1, 2]
    assert [u["stage"] for u in records if u["kind"] == "update"] == [1, 1, 1, 2, 2, 2]
    assert all(math.isfinite(e["accuracy"]) for e in read_metrics(cfg.run_dir, kind="eval"))


def test_an_endless_episode_fails_the_batch_naming_its_limit(tiny_model, tmp_path):
    cfg = example_config(
        "review_loop", tiny_model, tmp_path / "run", **{"team.recursion_limit": 3, "eval.stage_episodes": 0}
    )
    with pytest.raises(
        RunDirError, match=r"stage 1 rollout 0 failed: EpisodeLimitError: .*recursion limit \(3"
    ):
        train(cfg)
    assert read_metrics(cfg.run_dir, kind="failed")


def test_a_role_the_graph_never_calls_is_reported_not_updated(tiny_model, tmp_path):
    # a fourth role in the team that the graph never speaks as
    extra = types.ModuleType("teamtr_test_extra_roles")
    from examples.parallel_merge import roles as merge_roles
    from teamtr.graphs.roles import Role

    extra.roles = lambda: [*merge_roles(), Role("idle", "You are never asked.", adapter="idle")]
    sys.modules["teamtr_test_extra_roles"] = extra
    cfg = example_config(
        "parallel_merge",
        tiny_model,
        tmp_path / "run",
        **{
            "team.roles": "teamtr_test_extra_roles:roles",
            "team.order": ["idle", "reader_a", "reader_b", "merger"],
        },
    )
    with pytest.warns(UserWarning, match="role 'idle' made no trainable call"):
        records = train(cfg)
    (skipped,) = [r for r in records if r["kind"] == "skipped"]
    assert skipped["role"] == "idle" and skipped["messages"] == 0 and not skipped["accepted"]
    assert not (Path(cfg.run_dir) / "adapters" / "idle" / "v1").exists()
    assert [u["role"] for u in records if u["kind"] == "update"] == ["reader_a", "reader_b", "merger"]


def test_graph_keys_without_a_graph_are_refused():
    with pytest.raises(ValueError, match="team.order applies to a user graph only"):
        TrainConfig.from_dict({"team": {"order": ["a"]}})
    assert json.dumps(TrainConfig().to_dict())  # an old config's dict still dumps (new keys are None)


# ---- serving ----------------------------------------------------------------------------------------


def _train_yaml(cfg: TrainConfig, path: Path) -> Path:
    cfg.to_yaml(path)
    return path


def test_a_trained_graph_is_served_from_its_training_config(tiny_model, tmp_path):
    import httpx
    import openai

    from teamtr.serving.server import ServeConfig
    from teamtr.serving.span_reader import stored_spans
    from tests.support.serving import serve_in_background

    cfg = example_config("parallel_merge", tiny_model, tmp_path / "parallel_merge")
    train(cfg)
    config = ServeConfig.from_yaml(_train_yaml(cfg, tmp_path / "train.yaml"))
    recorded = []
    with serve_in_background(config, on_trajectory=recorded.append) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["parallel_merge"]
        r = client.chat.completions.create(
            model="parallel_merge", messages=[{"role": "user", "content": "start a1, 2 tables"}]
        )
        (trajectory,) = recorded
        # the graph answered: its output mapping (the merger's message) is the chat answer
        assert trajectory.turns[-1].role == "merger"
        assert trajectory.final_answer == trajectory.turns[-1].text.removesuffix("\n")  # the stop string
        assert (r.choices[0].message.content or "").strip() == trajectory.final_answer.strip()
        turns = r.model_extra["teamtr"]["turns"]
        # one node ("reader") speaks as two roles: each turn carries the role, not the node's name
        assert sorted(t["role"] for t in turns[:2]) == ["reader_a", "reader_b"]
        assert [t["role"] for t in turns] == [t.role for t in trajectory.turns]
        assert {t.node for t in trajectory.turns} == {"reader", "merger"}
        versions = {t.role: t.adapter_version for t in trajectory.turns}
        assert r.model_extra["teamtr"]["adapter_versions"] == versions
        assert versions == {a: v for a, (v, _) in RunDir(cfg.run_dir).saved_adapters().items()}

        # hot-swap: a new merger version is live for the next episode, the readers' stay as they were
        server.call(
            server.server.registry.push, "merger", Path(cfg.run_dir) / "adapters" / "merger" / "v0", 7
        )
        client.chat.completions.create(
            model="parallel_merge", messages=[{"role": "user", "content": "start a2, 2 tables"}]
        )
        swapped = {t.role: t.adapter_version for t in recorded[1].turns}
        assert swapped == {**versions, "merger": 7}

        # a request's own sampling: a variant of the graph built over re-sampled role models answers
        sampled = client.chat.completions.create(
            model="parallel_merge", messages=[{"role": "user", "content": "start a3"}], max_tokens=2, seed=3
        )
        assert {t.role for t in recorded[2].turns} == {"reader_a", "reader_b", "merger"}
        assert all(t["completion_tokens"] <= 2 for t in sampled.model_extra["teamtr"]["turns"])

        ok = httpx.post(
            server.url + "/v1/feedback", json={"conversation_id": r.id, "reward": 1.0}, timeout=30
        )
        assert ok.status_code == 200, ok.text
    chats = list(stored_spans(Path(cfg.run_dir) / "traces.db", operation="chat"))
    assert sorted(s.attributes["gen_ai.agent.name"] for s in chats) == sorted(
        t.role for trajectory in recorded for t in trajectory.turns
    )


def test_serving_a_training_config_before_training_says_so(tmp_path):
    from teamtr.serving.server import ServeConfig

    cfg = TrainConfig.from_dict({"run_dir": str(tmp_path / "nothing"), "team": {"graph": "examples.x:y"}})
    with pytest.raises(RunDirError, match="train it first"):
        ServeConfig.from_yaml(_train_yaml(cfg, tmp_path / "train.yaml"))


@pytest.mark.slow
def test_teamtr_train_and_serve_the_review_loop_from_its_yaml(tiny_model, tmp_path):
    """`teamtr train examples/review_loop.yaml` from the repository root (the config's modules and data
    resolve there), then the run served: the answer comes through the loop and its checker."""
    import subprocess

    import openai

    from teamtr.serving.server import ServeConfig
    from tests.support.serving import serve_in_background

    run_dir = tmp_path / "review_loop"
    sets = {
        "run_dir": str(run_dir),
        "stages": 1,
        "team.model": tiny_model,
        "team.lora_rank": 4,
        "rollout.prompts_per_update": 2,
        "rollout.group_size": 2,
        "optim.epochs": 1,
        "trust_region.heldout_episodes": 0,
        "eval.stage_episodes": 2,
        "eval.final_episodes": 2,
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    done = subprocess.run(
        [str(Path(sys.executable).parent / "teamtr"), "train", "examples/review_loop.yaml", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    updates = read_metrics(run_dir, kind="update")
    assert [u["role"] for u in updates] == ["solver", "reviewer", "planner", "finalizer"]

    recorded = []
    with serve_in_background(ServeConfig.from_run_dir(run_dir), on_trajectory=recorded.append) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(
            model="review_loop", messages=[{"role": "user", "content": "2+3*4"}]
        )
    (trajectory,) = recorded
    roles = [t.role for t in trajectory.turns]
    # planner, then solver attempts with a review between them until the calculator passes or 2 rounds
    assert roles[0] == "planner" and roles[-1] == "finalizer"
    assert roles[1:-1] in (["solver"], ["solver", "reviewer", "solver"])
    assert [t["role"] for t in r.model_extra["teamtr"]["turns"]] == roles


MESSAGES_SOURCE = """
from langgraph.graph import END, START, MessagesState, StateGraph
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role

def roles():
    return [Role("solo", "unused", adapter="solo",
                 sampling=SamplingParams(temperature=1.0, max_new_tokens=4, stop=("\\\\n",)))]

def build(models):
    async def answer(state):
        return {"messages": [await models.model("solo").ainvoke(state["messages"])]}
    g = StateGraph(MessagesState)
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    return g.compile()
"""


def test_a_messages_state_graph_gets_the_chat_messages_themselves(tiny_model, tmp_path):
    import openai

    from teamtr.serving.server import ServeConfig
    from tests.support.serving import serve_in_background, write_versions

    module = types.ModuleType("teamtr_test_messages_graph")
    exec(textwrap.dedent(MESSAGES_SOURCE), module.__dict__)
    sys.modules[module.__name__] = module
    run = tmp_path / "solo"
    write_versions(Path(tiny_model), run, range(1), roles=("solo",))
    team = {"model": tiny_model, "graph": f"{module.__name__}:build", "roles": f"{module.__name__}:roles"}
    (run / "config.yaml").write_text(yaml.safe_dump({"team": team}))
    recorded = []
    with serve_in_background(ServeConfig.from_run_dir(run), on_trajectory=recorded.append) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hello"}]
        r = client.chat.completions.create(model="solo", messages=messages)
        tokenizer = server.server.engine.tokenizer("base")
    (turn,) = recorded[0].turns
    # the graph's MessagesState input is the two messages (a Team would see "system: Be terse.\nhello")
    assert tokenizer.decode(turn.prompt_ids).startswith("Be terse.\nhello\n")
    assert r.model_extra["teamtr"]["turns"][0]["role"] == "solo"
