"""Foundation: a team written as a LangGraph graph, run on the embedded engine, yields trajectories."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from langgraph.graph import END

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.random_adapters import randomise_adapters
from teamtr.graphs.chain_team import chain_roles, chain_team
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role
from teamtr.graphs.team import RoundRobin, Team, TeamError
from teamtr.tasks import get_task

ROLES = ("adder1", "adder2", "adder3")


@pytest.fixture
def engine(tiny_model_dir):
    eng = EmbeddedEngine(tiny_model_dir, adapters={r: None for r in ROLES}, threads=1)
    randomise_adapters(eng, ROLES, std=0.3, seed=1)  # adapters that differ from the base and each other
    return eng


def test_behaviour_logprobs_equal_score_recomputation(engine):
    task = get_task("chain")
    team = chain_team(engine)
    trajs = team.run(task.generate(4, seed=0), group_size=3, verifier=task, seed=7)
    assert len(trajs) == 12
    for traj in trajs:
        assert [t.role for t in traj.turns] == list(ROLES)
        for turn in traj.turns:
            assert turn.completion_ids and len(turn.logprobs) == len(turn.completion_ids)
            rescored = engine.score([turn.prompt_ids], [turn.completion_ids], turn.adapter)[0]
            assert max(abs(a - b) for a, b in zip(rescored, turn.logprobs, strict=True)) < 1e-4


def test_each_role_acts_on_the_shared_transcript(engine):
    """Each role's recorded prompt is the task plus every earlier message, in order."""
    task = get_task("chain")
    traj = chain_team(engine).run(task.generate(1, seed=3), seed=1)[0]
    tok = engine.tokenizer()
    for k, turn in enumerate(traj.turns):
        context = tok.decode(turn.prompt_ids)
        earlier = "".join(t.text.split("\n")[0] + "\n" for t in traj.turns[:k])
        assert context.endswith(task.generate(1, seed=3)[0].prompt + "\n" + earlier)
        assert tok.decode(turn.completion_ids, skip_special_tokens=True) == turn.text


def test_concurrent_episodes_are_batched(engine):
    task = get_task("chain")
    team = chain_team(engine)
    before_batches, before_calls = engine.decode_batches, engine.generate_calls
    trajs = team.run(task.generate(8, seed=1), group_size=4, seed=3)
    turns = sum(len(t.turns) for t in trajs)
    assert engine.generate_calls - before_calls == turns == 96
    # 32 episodes x 3 turns in lock step: one batch per turn position, far fewer than turns
    assert engine.decode_batches - before_batches <= 6


def test_seeded_rollouts_are_reproducible(engine):
    task = get_task("chain")
    team = chain_team(engine)
    a = team.run(task.generate(3, seed=2), group_size=2, seed=11)
    b = team.run(task.generate(3, seed=2), group_size=2, seed=11)
    c = team.run(task.generate(3, seed=2), group_size=2, seed=12)
    ids = lambda ts: [t.completion_ids for tr in ts for t in tr.turns]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)


def test_round_robin_rounds_and_max_turns(engine):
    roles = chain_roles(2)
    team = Team.from_engine(roles, engine, router=RoundRobin(rounds=3))
    traj = team.run(get_task("chain").generate(1, seed=0), seed=0)[0]
    assert [t.role for t in traj.turns] == ["adder1", "adder2"] * 3

    def never_ends(state) -> Literal["adder1", "adder2"]:
        return "adder2" if len(state["transcript"]) % 3 else "adder1"

    team = Team.from_engine(roles, engine, router=never_ends, max_turns=5)
    traj = team.run(get_task("chain").generate(1, seed=0), seed=0)[0]
    assert [t.role for t in traj.turns] == ["adder1", "adder2", "adder2", "adder1", "adder2"]


def test_final_answer_rule_ends_episode(engine):
    team = Team.from_engine(chain_roles(3), engine, is_final=lambda text: True)
    traj = team.run(get_task("chain").generate(2, seed=0), seed=0)[0]
    assert len(traj.turns) == 1 and traj.final_answer == traj.turns[0].text.rstrip("\n")


def test_adapter_isolation(engine, tiny_model_dir):
    """Changing adder1's adapter leaves adder2's outputs (same context, same seed) unchanged."""
    team = chain_team(engine, sampling=SamplingParams(temperature=0.0, max_new_tokens=8, stop=("\n",)))
    traj = team.run(get_task("chain").generate(1, seed=5), seed=0)[0]
    t2 = traj.turns[1]
    before = engine.score([t2.prompt_ids], [t2.completion_ids], "adder2")[0]
    with torch.no_grad():
        for p in engine.adapter_parameters("adder1").values():
            p.add_(torch.randn_like(p))
    assert engine.score([t2.prompt_ids], [t2.completion_ids], "adder2")[0] == before
    assert engine.score([t2.prompt_ids], [t2.completion_ids], "adder1")[0] != before

    import asyncio

    async def greedy_mixed():  # adder2's row decoded in the same batch as an adder1 row
        sp = SamplingParams(temperature=0.0, max_new_tokens=8, stop=("\n",))
        return await asyncio.gather(
            engine.generate(t2.prompt_ids, adapter="adder2", sampling=sp),
            engine.generate(t2.prompt_ids, adapter="adder1", sampling=sp),
        )

    g2, _ = asyncio.run(greedy_mixed())
    assert g2.completion_ids == t2.completion_ids


def test_reference_policy_is_the_base(engine, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompt, completion = [5, 6, 7, 8], [9, 10]
    with torch.no_grad():
        logp = torch.log_softmax(base(torch.tensor([prompt + completion])).logits[0], -1)
    expected = [float(logp[3, 9]), float(logp[4, 10])]
    got = engine.score([prompt], [completion], None)[0]
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"roles": []}, "at least one role"),
        ({"roles": [Role("a", "x"), Role("a", "y")]}, "duplicate role names"),
        ({"router": lambda s: "nobody"}, "must declare"),
        ({"router": lambda s: "ghost", "destinations": ["a", "ghost"]}, "unknown roles"),
    ],
)
def test_malformed_team_fails_when_built(engine, kwargs, message):
    from teamtr.graphs.chat_model import EngineChatModel

    roles = kwargs.pop("roles", [Role("a", "x"), Role("b", "y")])
    models = {r.name: EngineChatModel(engine=engine) for r in roles}
    with pytest.raises(TeamError, match=message):
        Team(roles=roles, models=models, **kwargs)


def test_router_returning_unknown_role_at_runtime_is_clear(engine):
    def liar(state) -> Literal["adder1", "adder2"]:
        return "adder1" if not state["transcript"] else "ghost"

    team = Team.from_engine(chain_roles(2), engine, router=liar)
    with pytest.raises(TeamError, match="unknown role 'ghost'"):
        team.run(get_task("chain").generate(1, seed=0), seed=0)


def test_end_from_custom_router(engine):
    def one_turn(state) -> Literal["adder2", "__end__"]:
        return "adder2" if not state["transcript"] else END

    team = Team.from_engine(chain_roles(2), engine, router=one_turn)
    traj = team.run(get_task("chain").generate(1, seed=0), seed=0)[0]
    assert [t.role for t in traj.turns] == ["adder2"]


def test_threaded_decoding_serves_while_adapters_change(tiny_model_dir, tmp_path):
    """decode_in_thread (serving): episodes keep decoding while an adapter is loaded and unloaded."""
    import asyncio

    eng = EmbeddedEngine(tiny_model_dir, adapters={r: None for r in ROLES}, threads=1, decode_in_thread=True)
    eng.save_adapter("adder1", tmp_path / "a1")
    team = chain_team(eng)
    task = get_task("chain")

    async def serve_and_swap():
        rollouts = asyncio.ensure_future(team.rollout(task.generate(4, seed=0), group_size=4, seed=1))
        for k in range(3):
            await eng.load_adapter(f"adder1@v{k}", str(tmp_path / "a1"))
            await asyncio.sleep(0.01)
            await eng.unload_adapter(f"adder1@v{k}")
        return await rollouts

    trajs = asyncio.run(serve_and_swap())
    assert len(trajs) == 16 and all(len(t.turns) == 3 for t in trajs)
    turn = trajs[0].turns[2]
    rescored = eng.score([turn.prompt_ids], [turn.completion_ids], turn.adapter)[0]
    assert max(abs(a - b) for a, b in zip(rescored, turn.logprobs, strict=True)) < 1e-4
