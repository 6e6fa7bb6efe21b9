"""Behaviour log-probs at the sampling temperature (graphs/engine.py SamplingParams) and the trainer's
temperature guard (training/behaviour.py).

A turn sampled at T > 0 records log softmax(logits / T) of its tokens (renormalised over the nucleus
when top_p < 1), computed here independently with transformers, one unpadded forward per prefix; a
greedy turn records the T = 1 log-probs and says it is greedy. The trainer trains pi_T at the rollout
temperature (its own log pi_cur at T matches the behaviour log-probs) and refuses greedy turns, turns
of another temperature, nucleus turns and turns of unknown temperature, served ones included.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.graphs.chain_team import chain_team
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.trajectory import Trajectory
from teamtr.tasks import get_task
from teamtr.training.behaviour import OffPolicyTurnsError, require_on_policy, why_not_on_policy
from tests.support import trainer_task
from tests.support.logprobs import expected_logprobs
from tests.support.serving import make_run_dir, serve_in_background
from tests.support.trainer import small_config, train  # importing it registers the trainer tests' task

torch.set_num_threads(1)
ROLES = ("adder1", "adder2", "adder3")


@pytest.fixture(scope="module")
def base_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


@pytest.fixture
def engine(tiny_model_dir):
    return EmbeddedEngine(tiny_model_dir, adapters={r: None for r in ROLES}, threads=1)


def _episodes(engine, sampling: SamplingParams, n: int = 3) -> list[Trajectory]:
    task = get_task("chain")
    return chain_team(engine, sampling=sampling).run(
        task.generate(n, seed=0), group_size=2, verifier=task, seed=5
    )


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (0.7, 0.8), (1.6, 1.0)])
def test_recorded_logprobs_are_those_of_the_tempered_distribution(engine, base_model, temperature, top_p):
    sampling = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=6, stop=("\n",))
    turns = [t for traj in _episodes(engine, sampling) for t in traj.turns]
    untempered_gap = 0.0
    for turn in turns:
        assert (turn.temperature, turn.top_p) == (temperature, top_p) and turn.is_behaviour_sample
        exact = expected_logprobs(base_model, turn.prompt_ids, turn.completion_ids, temperature, top_p)
        assert turn.logprobs == pytest.approx(exact, abs=1e-4)
        at_t1 = expected_logprobs(base_model, turn.prompt_ids, turn.completion_ids, 1.0)
        untempered_gap = max(
            untempered_gap, max(abs(a - b) for a, b in zip(turn.logprobs, at_t1, strict=True))
        )
    assert untempered_gap > 1e-2  # the T = 1 log-probs would have been measurably different
    # the trainer's scoring path at T gives the same log-probs (its pi_cur is pi_T)
    turn = turns[0]
    if top_p == 1.0:
        scored = engine.token_logprobs(
            [turn.prompt_ids], [turn.completion_ids], turn.adapter, temperature=temperature
        )
        assert scored[0].tolist() == pytest.approx(turn.logprobs, abs=1e-4)


def test_greedy_turns_record_untempered_logprobs_and_are_not_behaviour_samples(engine, base_model):
    turns = [
        t
        for traj in _episodes(engine, SamplingParams(temperature=0.0, top_p=0.5, max_new_tokens=6))
        for t in traj.turns
    ]
    for turn in turns:
        assert turn.temperature == 0.0 and not turn.is_behaviour_sample
        assert turn.logprobs == pytest.approx(
            expected_logprobs(base_model, turn.prompt_ids, turn.completion_ids, 0.0), abs=1e-4
        )
        assert "greedily" in why_not_on_policy(turn, 1.0)


def test_the_guard_refuses_what_is_not_a_sample_of_the_trained_policy(engine):
    at_07 = _episodes(engine, SamplingParams(temperature=0.7, max_new_tokens=4))
    require_on_policy(at_07, 0.7)  # samples of pi_0.7: accepted
    with pytest.raises(
        OffPolicyTurnsError, match=r"18 of 18 turns .*temperature 0.7, the trainer trains pi at T = 1.0"
    ):
        require_on_policy(at_07, 1.0)
    with pytest.raises(OffPolicyTurnsError, match="top_p = 0.9 < 1"):
        require_on_policy(
            _episodes(engine, SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=4)), 0.7
        )
    with pytest.raises(OffPolicyTurnsError, match="greedily"):
        require_on_policy(_episodes(engine, SamplingParams(temperature=0.0, max_new_tokens=4)), 1.0)
    # a trajectory saved before turns stored their temperature still loads, and is refused
    old = at_07[0].to_dict()
    for t in old["turns"]:
        del t["temperature"], t["top_p"]
    legacy = Trajectory.from_dict(json.loads(json.dumps(old)))
    assert legacy.turns[0].temperature is None and legacy.turns[0].logprobs == at_07[0].turns[0].logprobs
    with pytest.raises(OffPolicyTurnsError, match="unknown"):
        require_on_policy([legacy], 1.0)


def test_trainer_trains_pi_at_the_rollout_temperature(tmp_path):
    """At rollout.temperature 0.7 the trainer's own log pi_cur equals the engine's behaviour log-probs (the
    ratios are pi_new_T / pi_cur_T), and a team whose roles sample with top_p < 1 is refused."""
    from teamtr.training.warmstart import tiny_random_model

    model = str(tiny_random_model(tmp_path / "model"))
    updates = train(small_config(model, tmp_path / "t07", **{"rollout.temperature": 0.7}))
    assert len(updates) == 3
    for u in updates:
        assert u["logprob_gap"] < 1e-4, u["logprob_gap"]
        assert u["d_hat"] <= u["delta"] or not u["accepted"]

    original = trainer_task.roles
    from teamtr.graphs.chain_team import chain_roles

    trainer_task.roles = lambda: chain_roles(
        sampling=SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=4, stop=("\n",))
    )
    try:
        with pytest.raises(OffPolicyTurnsError, match="top_p = 0.9"):
            train(small_config(model, tmp_path / "nucleus"))
    finally:
        trainer_task.roles = original


def test_served_turns_are_greedy_and_refused_by_the_trainer(tiny_model_dir, tmp_path):
    from teamtr.serving.server import ServeConfig
    from teamtr.serving.tracing import trajectories_from_store

    run_dir = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    db = tmp_path / "traces.db"
    recorded: list[Trajectory] = []
    config = ServeConfig.from_run_dir(run_dir, "chain", tracing={"sqlite_path": str(db)})
    server = serve_in_background(config, on_trajectory=recorded.append)
    with server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="chain", messages=[{"role": "user", "content": "3+4+5+6"}]
        )
        assert (
            httpx.post(
                server.url + "/v1/feedback", json={"conversation_id": reply.id, "reward": 1.0}
            ).status_code
            == 200
        )
        server.server.tracer.flush()
    (served,) = recorded
    assert served.turns and all(t.temperature == 0.0 for t in served.turns)
    (back,) = trajectories_from_store(db)
    assert [t.temperature for t in back.turns] == [0.0] * len(served.turns)  # the trace keeps it
    with pytest.raises(OffPolicyTurnsError, match="greedily"):
        require_on_policy([back], 1.0)
