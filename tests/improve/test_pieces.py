"""The improve loop's pure pieces (improve/): the served-data window and split, reward sources,
the confidence sequence the gate and canary decide on, canary arms and the sequential decision, the
judges, the promotion log."""

from __future__ import annotations

import json

import numpy as np
import pytest

from teamtr.client.admin_protocol import ServedEpisode
from teamtr.graphs.run_layout import append_record, read_records
from teamtr.improve.canary import CanaryConfig, arm_of, decide, tally
from teamtr.improve.data import (
    ImproveDataError,
    ServedTasks,
    select_episodes,
    split_prompts,
    verifier_reward,
)
from teamtr.improve.judge import resolve_judges
from teamtr.improve.stats import confidence_sequence
from teamtr.tasks import get_task


def episode(
    prompt: str,
    t: int,
    versions: dict[str, int],
    answer: str = "",
    reward: float | None = None,
    pair: str | None = None,
    shadow: bool = False,
):
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
        pair_id=pair,
        shadow=shadow,
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


def test_confidence_sequence_bounds_and_error_rate():
    b = confidence_sequence([0.0] * 10, -1, 1, alpha=0.05)
    assert b.mean == 0.0 and b.lower < 0 < b.upper
    assert confidence_sequence([1.0] * 8, -1, 1, 0.05, sides=1).lower <= 0  # 8 wins: not yet shown
    assert confidence_sequence([1.0] * 12, -1, 1, 0.05, sides=1).lower > 0  # 12: shown better
    assert confidence_sequence([1.0] * 12, -1, 1, 0.05, sides=1).upper == np.inf
    with pytest.raises(ValueError, match="range"):
        confidence_sequence([2.0], -1, 1, 0.05)
    # the stated error rate, peeking after every pair: a candidate as good as the incumbent (Bernoulli
    # 0.5 rewards both) is ever "shown better" in at most alpha / 2 of the sequences
    rng = np.random.default_rng(0)
    wrong = 0
    for _ in range(200):
        d = (rng.random(100) < 0.5).astype(float) - (rng.random(100) < 0.5)
        wrong += any(confidence_sequence(list(d[:n]), -1, 1, 0.05).lower > 0 for n in range(5, 101, 5))
    assert wrong / 200 <= 0.025


def test_judges_are_not_the_training_reward_unless_allowed():
    loaded = []

    def load(spec):
        loaded.append(spec)
        return lambda p, r: 1.0

    train = lambda p, r: 0.0  # noqa: E731
    kw = dict(task="chain", load=load, training_reward=train, allow_training_reward=False)
    j = resolve_judges("m:poisoned", "auto", "auto", has_feedback=False, **kw)
    assert (j.gate_name, j.canary_name) == ("verifier", "verifier") and j.gate is not train
    j = resolve_judges("m:poisoned", "auto", "auto", has_feedback=True, **kw)
    assert j.canary is None and j.canary_name == "feedback"  # the served episodes' feedback
    with pytest.raises(ImproveDataError, match="training reward"):
        resolve_judges("verifier", "auto", "auto", has_feedback=True, **kw)
    with pytest.raises(ImproveDataError, match="training reward"):
        resolve_judges("verifier", "verifier:chain", "auto", has_feedback=False, **kw)
    with pytest.raises(ImproveDataError, match="feedback scores only served"):
        resolve_judges("m:f", "feedback", "auto", has_feedback=True, **kw)
    allowed = resolve_judges(
        "verifier", "auto", "auto", has_feedback=False, **{**kw, "allow_training_reward": True}
    )
    assert allowed.gate is train and "training reward" in allowed.notes[0]


def test_canary_arms_tally_and_decision():
    candidate, incumbent = {"adder2": 5, "adder3": 5}, {"adder2": 1, "adder3": 1}
    role_of = {"adder1": "adder1", "adder2": "adder2", "adder3": "adder3"}
    cand = {"adder1": 1, "adder2": 5, "adder3": 5}
    inc = {"adder1": 1, "adder2": 1, "adder3": 1}
    assert arm_of(episode("1+2", 0, cand), role_of, candidate, incumbent) == "candidate"
    assert arm_of(episode("1+2", 0, inc), role_of, candidate, incumbent) == "incumbent"
    assert arm_of(episode("1+2", 0, {**inc, "adder3": 5}), role_of, candidate, incumbent) == "mixed"
    reward = verifier_reward(get_task("chain"))
    # a reward function judges: each canary episode is paired with its shadow (the incumbent on the same
    # request); incumbent episodes of their own do not enter the pairs
    eps = [episode("1+2", i, cand, "3", pair=f"p{i}") for i in range(4)] + [episode("1+2", 9, inc, "4")]
    eps.append(episode("1+2", 1, inc, "4", pair="p0", shadow=True))
    t = tally(eps, role_of, candidate, incumbent, reward)
    assert t.paired and t.differences == [1.0]  # one canary episode has its shadow; the next ones wait
    assert t.figures()["candidate_reward"] == 1.0 and t.figures()["incumbent_reward"] == 0.0
    cfg = CanaryConfig(max_episodes=40)
    assert decide(t, cfg) is None  # one pair proves nothing yet
    assert decide(tally(eps[:4], role_of, candidate, incumbent, reward), cfg) is None  # no pair yet

    def pairs(cand_answer: str, inc_answer: str, n: int) -> list[ServedEpisode]:
        both = [episode("1+2", 2 * i, cand, cand_answer, pair=f"p{i}") for i in range(n)]
        return both + [
            episode("1+2", 2 * i + 1, inc, inc_answer, pair=f"p{i}", shadow=True) for i in range(n)
        ]

    def arms(cand_answer: str, inc_answer: str, n: int):
        return tally(pairs(cand_answer, inc_answer, n), role_of, candidate, incumbent, reward)

    better = decide(arms("3", "4", 16), cfg)  # every pair won: promoted at the 13th (stopped early)
    assert better[0] is True and better[1].startswith("shown better at pair 13")
    worse = decide(arms("9", "3", 16), cfg)
    assert worse[0] is False and worse[1].startswith("shown worse at pair 13")
    assert decide(arms("3", "3", 39), cfg) is None  # a tie: undecided until the cap ...
    capped = decide(arms("3", "3", 40), cfg)  # ... rolled back at the cap
    assert capped[1].startswith("not shown better within 40 pairs")
    assert decide(arms("3", "3", 40), CanaryConfig(max_episodes=40, non_inferiority=0.5))[0] is True
    # a shadow that never came stops the pairs behind it until SHADOW_LOST later shadows ended: left out
    missing = [e for e in pairs("3", "4", 40) if not (e.shadow and e.pair_id == "p0")]
    t = tally(missing, role_of, candidate, incumbent, reward)
    assert t.lost == 1 and len(t.differences) == 39 and arms("3", "4", 40).lost == 0
    few = [e for e in missing if not e.shadow or int(e.pair_id[1:]) <= 15]  # 15 shadows after it: waits
    t = tally(few, role_of, candidate, incumbent, reward)
    assert t.lost == 0 and t.differences == []
    # feedback judges: unpaired, the k-th canary episode against the k-th incumbent one; episodes without
    # feedback are not scored yet
    fed = tally(
        [episode("1+2", 0, cand, reward=0.5), episode("1+2", 1, cand), episode("3+4", 2, inc, reward=0.0)],
        role_of,
        candidate,
        incumbent,
        None,
    )
    assert fed.rewards["candidate"] == [0.5] and fed.unscored == 1
    assert not fed.paired and fed.differences == [0.5]
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


def test_watch_starts_a_round_on_new_traffic_and_backs_off_after_setbacks(tmp_path):
    from teamtr.improve.timeline import write_timeline
    from teamtr.improve.watch import WatchConfig, backoff, due, new_traffic

    cfg = WatchConfig(new_episodes=3, new_feedback=2, backoff_s=60, max_backoff_s=200)
    eps = [episode("1+2", t, {}) for t in range(5)]
    assert due(*new_traffic(eps, 1), cfg) and not due(*new_traffic(eps, 2), cfg)  # 3 new, then 2
    fed = [episode("1+2", t, {}, reward=1.0) for t in range(3, 5)]
    assert due(*new_traffic(fed, 2), cfg)  # 2 new with feedback
    assert [backoff(n, cfg) for n in range(5)] == [0, 60, 120, 200, 200]

    log = tmp_path / "decisions.jsonl"
    append_record(log, "gate", attempt=1, decision="refused", figures={"lower_bound": -0.4})
    append_record(log, "gate", attempt=2, decision="passed", figures={"lower_bound": 0.2})
    append_record(log, "canary_started", attempt=2)
    append_record(log, "promoted", attempt=2, figures={"lower_bound": 0.1, "upper_bound": 0.9, "pairs": 14})
    png = write_timeline(log, tmp_path / "timeline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_a_role_whose_weights_did_not_move_is_not_changed(tiny_model_dir, tmp_path):
    import shutil

    from teamtr.improve.train import same_weights
    from tests.support.serving import write_versions

    run = write_versions(tiny_model_dir, tmp_path / "run", range(1, 3), roles=("adder2",))
    v1, v2 = run / "adapters/adder2/v1", run / "adapters/adder2/v2"
    shutil.copytree(v1, run / "adapters/adder2/v3")  # an "update" that saved the same weights again
    assert same_weights(v1, run / "adapters/adder2/v3") and not same_weights(v1, v2)


def test_improve_rolls_out_on_the_runs_engine_or_refuses(tiny_model_dir, tmp_path):
    """rollout.engine: vllm with no server to reach: a clear error, never the embedded engine instead."""
    from teamtr.improve.data import ServedTasks
    from teamtr.improve.train import ServedTrainer, improve_config, incumbent_engine
    from teamtr.training.run_dir import RunDir, RunDirError
    from tests.support.improve import served_run

    served = RunDir(served_run(tiny_model_dir, tmp_path / "t"))
    settings = {"rollout.engine": "vllm", "rollout.vllm_url": "http://127.0.0.1:9"}
    cfg = improve_config(served, tmp_path / "attempt-1", settings)
    incumbent = {a: (v, str(p)) for a, (v, p) in served.saved_adapters().items()}
    engine = incumbent_engine(served, incumbent, threads=1)
    with pytest.raises(RunDirError, match="rollout.engine vllm: cannot reach a vLLM server"):
        ServedTrainer(cfg, ServedTasks(["1+2", "3+4"], lambda p, r: 0.0), engine).train()
