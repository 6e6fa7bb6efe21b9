"""Learning from feedback without a verifier (serving/exploration.py, improve/feedback.py,
feedback_team.py, llm_judge.py; docs/improve.md "Learning from feedback"):

- the exploration draw honours its share within a binomial bound; exploratory served episodes carry
  their temperature and behaviour log-probs, their spans say so, and GET /admin/feedback-episodes gives
  them back as trajectories;
- a feedback episode with a greedy turn, or a turn without behaviour log-probs, is refused with a clear
  error; the truncated importance weights on hand-computable numbers;
- the LLM judge: p(yes) / (p(yes) + p(no)) of a real (tiny) model, as `Engine.score` gives it;
- end to end: a served team whose only signal is its client's feedback (computed by a verifier the
  improve process never receives) is trained on its exploratory episodes alone, promoted, and its
  accuracy on 32 never-served prompts, measured through the API before and after, rises.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from scipy.stats import binom, binomtest

from teamtr.client.admin_client import AdminClient
from teamtr.engines.embedded import EmbeddedEngine
from teamtr.graphs.engine import DEFAULT_BASE
from teamtr.graphs.run_layout import read_records
from teamtr.graphs.trajectory import Trajectory, Turn
from teamtr.improve.data import ImproveDataError
from teamtr.improve.feedback import (
    FeedbackEpisodeError,
    feedback_episodes,
    trajectory_from_dict,
    truncated_weights,
)
from teamtr.improve.llm_judge import LLMJudge, read_template
from teamtr.improve.stats import confidence_sequence
from teamtr.serving.exploration import ExplorationDraw
from teamtr.serving.server import ServeConfig
from teamtr.training.behaviour import OffPolicyTurnsError
from tests.support.improve import UNVERIFIABLE, LowStart, served_run
from tests.support.serving import serve_in_background

REPO = Path(__file__).resolve().parents[2]  # `tests.support.improve:...` names import from here
FAMILY = LowStart()
ALPHA = 1e-4  # the binomial test's error rate: a fair draw fails it this rarely


def verdict(answer: str) -> float:
    """The verifier the improve process never sees (LowStart's: the answer starts before 'P')."""
    return FAMILY.verify(FAMILY.generate(1, seed=0)[0], answer)


# ---- the exploration draw ---------------------------------------------------------------------------


@pytest.mark.parametrize("share", [0.1, 0.5])
def test_exploration_draw_honours_its_share(share):
    n = 4000
    draw = ExplorationDraw(share=share, seed=3)
    explored = sum(draw.draw() for _ in range(n))
    low, high = binom.ppf(ALPHA / 2, n, share), binom.isf(ALPHA / 2, n, share)
    assert low <= explored <= high and draw.explored == explored and draw.episodes == n
    assert not any(ExplorationDraw(share=0.0).draw() for _ in range(100))
    with pytest.raises(ValueError, match="share"):
        ExplorationDraw(share=1.5)


def test_served_exploratory_episodes_are_recorded_and_given_back(tiny_model_dir, tmp_path):
    """Share 1: every episode explores unless its request sets a temperature; spans, `GET
    /admin/episodes` and `GET /admin/feedback-episodes` say which, with the turns' tokens and log-probs."""
    from tests.support.serving import make_run_dir

    run = make_run_dir(tiny_model_dir, tmp_path / "run")
    config = ServeConfig.from_run_dir(run, "t", admin_key="adm", tracing={"sqlite_path": "traces.db"})
    config.teams["t"].exploration_share, config.teams["t"].exploration_seed = 1.0, 0
    with serve_in_background(config) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        explored = [ask(client, f"{i}+1", max_tokens=2) for i in range(3)]
        greedy = ask(client, "9+1", max_tokens=2, temperature=0.0)
        assert {s["temperature"] for s in explored[0]["teamtr"]["sampling"].values()} == {1.0}
        assert {s["temperature"] for s in greedy["teamtr"]["sampling"].values()} == {0.0}
        for body in [*explored[:2], greedy]:
            conversation = body["teamtr"]["conversation_id"]
            assert client.post(
                "/v1/feedback", json={"conversation_id": conversation, "reward": 1.0}
            ).is_success
        admin = AdminClient(server.url, "adm")
        assert [e.exploration for e in admin.episodes(team="t")] == [True, True, True, False]
        found = admin.feedback_episodes(team="t")  # explored and rated: the first two
        assert [e.metadata["prompt"] for e in found] == ["0+1", "1+1"] and all(e.reward == 1.0 for e in found)
        turns = [t for e in found for t in e.turns]
        assert turns and all(t.temperature == 1.0 and len(t.logprobs) == len(t.completion_ids) for t in turns)
        assert feedback_episodes(found, server.server.registry.current_versions(), 1.0).episodes == found


# ---- feedback episodes and their weights -------------------------------------------------------------


def turn(temperature: float | None, logprobs: list[float] | None = None, version: int = 1) -> Turn:
    return Turn(
        role="j",
        adapter="j",
        adapter_version=version,
        prompt_ids=[1, 2],
        completion_ids=[3, 4],
        logprobs=[-0.5, -0.25] if logprobs is None else logprobs,
        text="x",
        temperature=temperature,
        top_p=1.0,
    )


def episode(*turns: Turn, exploration: bool = True) -> Trajectory:
    meta = {"exploration": True, "prompt": "p"} if exploration else {"prompt": "p"}
    return Trajectory(task_id="e1", turns=list(turns), reward=1.0, group_id="g", metadata=meta)


def test_feedback_episodes_refuse_greedy_and_missing_logprobs():
    ok = feedback_episodes([episode(turn(1.0)), episode(turn(0.0), exploration=False)], {"j": 1}, 1.0)
    assert len(ok.episodes) == 1 and ok.not_exploratory == 1  # greedy traffic is left out, not used
    other = feedback_episodes([episode(turn(1.0, version=2))], {"j": 1}, 1.0)
    assert other.episodes == [] and other.other_versions == 1  # not a sample of the incumbent
    with pytest.raises(OffPolicyTurnsError, match="greedily"):  # flagged exploratory, a greedy turn
        feedback_episodes([episode(turn(1.0), turn(0.0))], {"j": 1}, 1.0)
    with pytest.raises(OffPolicyTurnsError, match="temperature"):
        feedback_episodes([episode(turn(0.7))], {"j": 1}, 1.0)
    recorded = episode(turn(1.0)).to_dict()
    recorded["turns"][0]["logprobs"] = []
    with pytest.raises(FeedbackEpisodeError, match="no behaviour log-probs"):
        trajectory_from_dict(recorded)
    with pytest.raises(FeedbackEpisodeError, match="no behaviour log-probs"):
        feedback_episodes([recorded], {"j": 1}, 1.0)


def test_truncated_importance_weights_by_hand():
    # rho = pi_now / mu of each episode: 0.5, 1, 2, e^3; truncated at 1 and at 1.5
    log_rho = np.log([0.5, 1.0, 2.0, math.e**3])
    assert np.allclose(truncated_weights(log_rho, 1.0), [0.5, 1.0, 1.0, 1.0])
    assert np.allclose(truncated_weights(log_rho, 1.5), [0.5, 1.0, 1.5, 1.5])
    assert np.allclose(truncated_weights(np.array([800.0]), 2.0), [2.0])  # no overflow
    with pytest.raises(ValueError, match="cap"):
        truncated_weights(log_rho, 0.0)


def test_feedback_weights_of_a_moved_policy(tiny_model_dir):
    """The ratio pi_now / mu of a message, by the trainer's own forward pass: 1 before any update, and
    exp(sum of the token log-prob changes) after one (computed here by hand from the engine)."""
    import torch

    from teamtr.improve.feedback import BehaviourLogProbs, episode_log_ratios
    from teamtr.training.policy import AdapterPolicy

    engine = EmbeddedEngine(tiny_model_dir, adapters={"j": None}, threads=1)
    params = engine.adapter_parameters("j")
    policy = AdapterPolicy(engine, "j", DEFAULT_BASE, params, torch.optim.SGD(list(params.values()), lr=0.1))
    episodes = [episode(turn(1.0)), episode(turn(1.0), turn(1.0))]
    mu = BehaviourLogProbs.of(episodes, {"j": policy})
    assert np.allclose(episode_log_ratios(episodes, mu, {"j": policy}, []), 0.0)
    assert np.allclose(episode_log_ratios(episodes, mu, {"j": policy}, ["j"]), 0.0)
    before = float(policy.score([[1, 2]], [[3, 4]])[0].sum())
    with torch.no_grad():
        for name, p in params.items():
            if "lora_B" in name:
                p.add_(0.05)
    after = float(policy.score([[1, 2]], [[3, 4]])[0].sum())
    log_rho = episode_log_ratios(episodes, mu, {"j": policy}, ["j"])
    # float32 sums of log-probs near -9, scored in different batches: they agree to a few ULPs (~1e-6), not
    # bit for bit (an atol of 1e-6 failed by 2e-6 on another CPU); the move itself is 0.14
    assert after != before and np.allclose(log_rho, [after - before, 2 * (after - before)], atol=1e-5)


# ---- the LLM judge ------------------------------------------------------------------------------------


def test_llm_judge_scores_p_yes_against_p_no(tiny_model_dir, tmp_path):
    template = tmp_path / "judge.txt"
    template.write_text("Task: {prompt}\nAnswer: {response}\nCorrect?")
    engine = EmbeddedEngine(tiny_model_dir, adapters={}, threads=1)
    judge = LLMJudge(read_template(template), engine)
    score = judge("1+1", "2")
    tok = engine.tokenizer()
    ids = tok("Task: 1+1\nAnswer: 2\nCorrect?", add_special_tokens=False)["input_ids"]
    yes, no = (tok(w, add_special_tokens=False)["input_ids"] for w in (" yes", " no"))
    lp_yes, lp_no = (sum(s) for s in engine.score([ids, ids], [yes, no], None))
    assert 0 < score < 1 and math.isclose(score, math.exp(lp_yes) / (math.exp(lp_yes) + math.exp(lp_no)))
    assert judge("1+1", "2") == score and judge("1+1", "7") != score  # deterministic, reads the answer
    for bad, why in (
        ("no fields", "must use"),
        ("{response} {answer}", "unknown"),
        ("{response", "template"),
    ):
        template.write_text(bad)
        with pytest.raises(ImproveDataError, match=why):
            read_template(template)


# ---- end to end ----------------------------------------------------------------------------------------


TRAIN = [t.prompt for t in FAMILY.generate(16, seed=11)]  # 16 distinct prompts, 4 of them held out
ROUNDS = 12  # each prompt served this often: ~9 exploratory episodes per prompt at share 0.75
HELD_OUT = [t.prompt for t in FAMILY.generate(32, seed=23)]  # never served before the first measurement
SAMPLES = 8  # answers per held-out prompt, at the training temperature, same seeds before and after
ALPHA_GAIN = 0.05  # the gain test's error rate
SHARE = 0.75
LEARN = [
    "--stages",
    "4",
    "--set",
    "optim.epochs=6",
    "--set",
    "optim.lr=0.05",
    "--set",
    "trust_region.delta=0.5",
]
# the gate's judge is an LLM judge on the tiny random base model (noise), so the gate and the canary are
# opened explicitly: this test is about learning from feedback, test_loop.py about the decisions
OPEN = ["--non-inferiority", "2", "--canary-non-inferiority", "2", "--canary-min-episodes", "6"]


def ask(client: httpx.Client, prompt: str, **fields: float) -> dict:
    body = {"model": "t", "messages": [{"role": "user", "content": prompt}], **fields}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def serve_and_rate(client: httpx.Client, prompt: str, seed: int | None = None) -> None:
    """One served episode, and the client's feedback on it: the verifier's verdict."""
    body = ask(client, prompt, **({"seed": seed} if seed is not None else {}))
    reward = verdict(body["choices"][0]["message"]["content"])
    conversation = body["teamtr"]["conversation_id"]
    f = client.post("/v1/feedback", json={"conversation_id": conversation, "reward": reward})
    assert f.status_code == 200, f.text


def sampled_verdicts(client: httpx.Client) -> list[float]:
    """The verifier's verdict on SAMPLES answers of the served team to each held-out prompt at the
    training temperature (what a policy gradient on the feedback raises), every answer with its own seed,
    the same before and after (so answer k before and answer k after are a pair). A request that sets
    its temperature is never explored."""
    out = []
    for i, p in enumerate(HELD_OUT):
        body = ask(client, p, temperature=1.0, n=SAMPLES, seed=1000 + i)
        out += [verdict(c["message"]["content"]) for c in body["choices"]]
    return out


def greedy_answers(client: httpx.Client) -> list[str]:
    return [ask(client, p, temperature=0.0)["choices"][0]["message"]["content"] for p in HELD_OUT]


@pytest.mark.slow
def test_improve_learns_from_feedback_alone(tiny_model_dir, tmp_path):
    """The served team's only signal is its client's feedback (the verifier's verdict, computed in this
    process; the run's task gives the loop no verifier). `teamtr improve --reward feedback` trains on the
    exploratory episodes alone and is promoted; the served team's probability of a right answer on 32
    never-served prompts (8 answers each at the training temperature, through the API, the same seeds
    before and after) rises: McNemar's exact one-sided test on the paired answers at 5%. Everything the
    training sees is seeded (the exploration draw, every request), so the run is one fixed computation;
    the 5% is the chance that a team no better than before passes. The greedy answer (printed) is one
    character shared by every prompt on this tiny random model, so it is not what is asserted."""
    run = served_run(tiny_model_dir, tmp_path / "t", task=UNVERIFIABLE)  # no verifier the loop could use
    config = ServeConfig.from_run_dir(run, "t", admin_key="adm", tracing={"sqlite_path": "traces.db"})
    config.teams["t"].exploration_share, config.teams["t"].exploration_seed = SHARE, 0
    judge = tmp_path / "judge.txt"
    judge.write_text("Task: {prompt}\nAnswer: {response}\nIs the answer right?")
    with serve_in_background(config) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        before, greedy_before = sampled_verdicts(client), greedy_answers(client)
        for r in range(ROUNDS):
            for i, prompt in enumerate(TRAIN):
                serve_and_rate(client, prompt, seed=100 * r + i)
        admin = AdminClient(server.url, "adm")
        served = [e for e in admin.episodes(team="t") if e.prompt in TRAIN]
        explored, n = sum(e.exploration for e in served), len(served)
        assert binom.ppf(ALPHA / 2, n, SHARE) <= explored <= binom.isf(ALPHA / 2, n, SHARE)
        episodes = admin.feedback_episodes(team="t")
        assert len(episodes) == explored and all(
            t.temperature == 1.0 and t.top_p == 1.0 and len(t.logprobs) == len(t.completion_ids)
            for e in episodes
            for t in e.turns
        )

        stop = threading.Event()

        def traffic() -> None:  # live traffic with feedback for the canary, once improve has its window
            with httpx.Client(base_url=server.url, timeout=120) as c:
                i = 0
                while not stop.is_set():
                    serve_and_rate(c, TRAIN[i % len(TRAIN)])
                    i += 1

        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        env.update({"OMP_NUM_THREADS": "1", "TEAMTR_TORCH_THREADS": "1"})
        command = [sys.executable, "-m", "teamtr.cli.main", "improve", str(run), "--url", server.url]
        command += ["--admin-key", "adm", "--team", "t", "--last", str(n), "--reward", "feedback"]
        command += ["--gate-judge", f"judge:{judge}", "--allow-training-reward-judge", *LEARN, *OPEN]
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        thread = threading.Thread(target=traffic, daemon=True)
        work = run / "improve"
        try:
            while not (work / "state.json").is_file() and process.poll() is None:
                stop.wait(0.2)
            thread.start()
            out, _ = process.communicate(timeout=900)
        finally:
            stop.set()
            if thread.is_alive():
                thread.join(120)
        assert process.returncode == 0 and out.strip().endswith("promoted"), out[-4000:]
        after, greedy_after = sampled_verdicts(client), greedy_answers(client)
    # McNemar's exact test on the discordant pairs: one-sided, a team no better than before (a pair
    # improves no more often than it worsens) passes with probability at most ALPHA_GAIN
    up = sum(a > b for a, b in zip(after, before, strict=True))
    down = sum(a < b for a, b in zip(after, before, strict=True))
    p_value = binomtest(up, up + down, 0.5, alternative="greater").pvalue if up + down else 1.0
    bound = confidence_sequence(
        [a - b for a, b in zip(after, before, strict=True)], -1, 1, alpha=0.05, sides=1
    )
    report = f"held-out P(right) {np.mean(before):.3f} -> {np.mean(after):.3f} over {len(after)} answers: "
    report += f"{up} pairs up, {down} down, McNemar p {p_value:.2g}, 95% CS lower bound {bound.lower:+.3f}"
    records = read_records(work / "decisions.jsonl")
    lines = (Path(records[0]["run"]) / "metrics.jsonl").read_text().splitlines()
    weights = [r for r in map(json.loads, lines) if r["kind"] == "feedback_weights"]
    greedy = f"greedy right {np.mean([verdict(a) for a in greedy_before]):.3f} -> "
    greedy += f"{np.mean([verdict(a) for a in greedy_after]):.3f} (answers {sorted(set(greedy_before))} -> "
    greedy += f"{sorted(set(greedy_after))})"
    print(report, greedy)  # for docs/improve.md (pytest -s)
    print(f"{n} served, {explored} explored, {len(episodes)} with feedback;", "weights (mean, min)",
          [(round(w["mean"], 3), round(w["min"], 3)) for w in weights])  # fmt: skip
    assert records[0]["figures"]["judge"] == f"judge:{judge}" and records[-1]["event"] == "promoted"
    state = json.loads((work / "state.json").read_text())
    assert state["feedback"]["episodes"] > 0 and state["feedback"]["left_out_held_out"] >= 0
    assert p_value < ALPHA_GAIN, report


def test_feedback_trained_on_judges_neither_gate_nor_canary_unless_allowed():
    from teamtr.improve.judge import resolve_judges

    def load(spec):
        if spec == "verifier":
            raise ImproveDataError("no answer_for")
        return lambda p, r: 1.0

    kw = dict(
        task="t", load=load, training_reward=lambda p, r: 0.0, has_feedback=True, trained_on_feedback=True
    )
    with pytest.raises(ImproveDataError, match="nothing to judge the gate"):
        resolve_judges("feedback", "auto", "auto", allow_training_reward=False, **kw)
    with pytest.raises(ImproveDataError, match="trained on"):
        resolve_judges("feedback", "judge:j.txt", "auto", allow_training_reward=False, **kw)
    j = resolve_judges("feedback", "judge:j.txt", "auto", allow_training_reward=True, **kw)
    assert (j.gate_name, j.canary_name, j.canary) == ("judge:j.txt", "feedback (a training reward)", None)
    j = resolve_judges("feedback", "judge:j.txt", "judge:j.txt", allow_training_reward=False, **kw)
    assert j.canary_name == "judge:j.txt"
