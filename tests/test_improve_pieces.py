"""The improve loop's pure pieces (training/improve/): the served-data window and split, reward sources,
the paired bootstrap of the gate, canary arms and the canary decision, the promotion log."""

from __future__ import annotations

import json

import pytest

from teamtr.evals.tasks import get_task
from teamtr.serving.promotion_log import append_record, read_records
from teamtr.serving.protocol import ServedEpisode
from teamtr.training.improve.canary import CanaryConfig, arm_of, decide, tally
from teamtr.training.improve.data import (
    ImproveDataError,
    ServedTasks,
    select_episodes,
    split_prompts,
    verifier_reward,
)
from teamtr.training.improve.gate import paired_bootstrap_lower_bound


def episode(prompt: str, t: int, versions: dict[str, int], answer: str = "", reward: float | None = None):
    return ServedEpisode(
        completion_id=f"c{t}",
        conversation_id=f"c{t}",
        team="chain",
        prompt=prompt,
        final_answer=answer,
        adapter_versions=versions,
        start_ns=t,
        end_ns=t + 1,
        reward=reward,
    )


def test_window_and_held_out_split_keep_the_newest_prompts_for_the_gate():
    eps = [episode(p, t, {}) for t, p in enumerate(["a", "b", "a", "c", "d", "e", "d", "f", "g", "h"])]
    chosen = select_episodes(eps, last=8, since_ns=1)
    assert [e.start_ns for e in chosen] == list(range(2, 10))
    data = split_prompts(chosen, "chain", 0.25)
    # 7 distinct prompts in the order first served; the newest quarter (2) is held out
    assert data.train == ["a", "c", "d", "e", "f"] and data.held_out == ["g", "h"]
    assert data.window.episodes == 8 and data.window.since_ns == 2 and data.window.until_ns == 9
    with pytest.raises(ImproveDataError, match="distinct served prompts"):
        split_prompts(eps[:2], "chain", 0.25)


def test_verifier_reward_scores_bare_served_prompts():
    reward = verifier_reward(get_task("chain"))
    assert reward("3+7+9+5", "24") == 1.0 and reward("3+7+9+5", "23") == 0.0
    assert reward("not a sum", "24") == 0.0
    tasks = ServedTasks(["1+2", "3+4"], reward)
    picked = tasks.generate(5, seed=0)
    assert {t.prompt for t in picked} <= {"1+2", "3+4"} and len(picked) == 5
    assert tasks.verify(tasks.instance("3+4"), "7") == 1.0
    assert tasks.instance("3+4").id == tasks.instance("3+4").id != tasks.instance("1+2").id


def test_paired_bootstrap_bound():
    mean, lower = paired_bootstrap_lower_bound([0.0] * 10, 0.9, 500, 0)
    assert mean == 0.0 and lower == 0.0
    mean, lower = paired_bootstrap_lower_bound([-1.0] * 3 + [0.0] * 7, 0.9, 2000, 0)
    assert mean == pytest.approx(-0.3) and lower < mean  # the bound is below the mean
    _, wide = paired_bootstrap_lower_bound([-1.0] * 3 + [0.0] * 7, 0.99, 2000, 0)
    assert wide < lower  # more confidence, a lower bound further down


def test_canary_arms_tally_and_decision():
    candidate, incumbent = {"adder2": 5, "adder3": 5}, {"adder2": 1, "adder3": 1}
    role_of = {"adder1": "adder1", "adder2": "adder2", "adder3": "adder3"}
    cand = {"adder1": 1, "adder2": 5, "adder3": 5}
    inc = {"adder1": 1, "adder2": 1, "adder3": 1}
    assert arm_of(episode("1+2", 0, cand), role_of, candidate, incumbent) == "candidate"
    assert arm_of(episode("1+2", 0, inc), role_of, candidate, incumbent) == "incumbent"
    assert arm_of(episode("1+2", 0, {**inc, "adder3": 5}), role_of, candidate, incumbent) == "mixed"
    reward = verifier_reward(get_task("chain"))
    eps = [episode("1+2", i, cand, "3") for i in range(4)] + [episode("1+2", 9, inc, "4")]
    t = tally(eps, role_of, candidate, incumbent, reward)
    assert t.figures()["candidate_reward"] == 1.0 and t.figures()["incumbent_reward"] == 0.0
    cfg = CanaryConfig(episodes=4, margin=0.1)
    assert decide(t, cfg)[0] is True
    assert decide(t, CanaryConfig(episodes=5)) is None  # not enough canary episodes yet
    worse = tally(
        [episode("1+2", i, cand, "9") for i in range(4)] + [episode("1+2", 9, inc, "3")],
        role_of,
        candidate,
        incumbent,
        reward,
    )
    assert decide(worse, cfg)[0] is False
    # feedback as the canary's reward: episodes without feedback are not scored yet
    fed = tally(
        [episode("1+2", 0, cand, reward=0.5), episode("1+2", 1, cand)], role_of, candidate, incumbent, None
    )
    assert fed.rewards["candidate"] == [0.5] and fed.unscored == 1
    mixed = tally([*eps, episode("1+2", 20, {**inc, "adder3": 5})], role_of, candidate, incumbent, reward)
    assert decide(mixed, cfg) == (False, "1 episodes ran a mixed team")


def test_promotion_log_is_append_only_and_survives_a_torn_line(tmp_path):
    log = tmp_path / "promotions.jsonl"
    append_record(log, "gate", decision="passed", figures={"kl": {"adder2": 0.01}})
    append_record(log, "promoted", candidate={"adder2": 2})
    with open(log, "a") as f:
        f.write('{"event": "rolled_')  # a crash mid-write
    records = read_records(log)
    assert [r["event"] for r in records] == ["gate", "promoted"]
    assert records[0]["figures"]["kl"]["adder2"] == 0.01 and records[1]["time_ns"] >= records[0]["time_ns"]
    assert json.loads(log.read_text().splitlines()[0])["decision"] == "passed"
