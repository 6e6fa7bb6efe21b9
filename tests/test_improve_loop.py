"""`teamtr improve` end to end (training/improve/, docs/improve.md): a served team, a client sending traffic
and verifier feedback the whole time, the improve command as its own process.

- the loop trains from the served versions, gates, canaries and promotes every role at once; killed with
  SIGKILL mid-canary and started again it continues and finishes; no request fails and no episode ever
  ran a mixed team; lineage and the promotion log say where the versions came from;
- a bad candidate (learning rate x1000, trust region off) is refused by the gate; a corrupted one
  (trained on a reward the client's feedback contradicts) let through a wide-open gate is rolled back by the canary,
  which judges it by the client's feedback; the incumbent serves throughout.

- with the gate's and canary's default margins, the promoted team's accuracy on held-out prompts,
  measured through the API before and after on the same prompts, rises beyond its paired bootstrap bound.

The team is a tiny random model (seconds per stage). The first test opens the gate's and canary's
margins so the promotion path runs to the end whatever its small improve run did; the last one trains
harder (still inside the trust region) and keeps the default margins. Its greedy team answers every
prompt alike, so the rise is all or nothing per run (docs/improve.md has the figures and how often).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from improve_fixtures import CHARS_ENV, ROLES, LowStart, first_char, same_start, served_run
from serving_fixtures import serve_in_background

from teamtr.cli.server import ServeConfig
from teamtr.serving.admin_client import AdminClient
from teamtr.serving.promotion_log import read_records
from teamtr.training.improve.gate import paired_bootstrap_lower_bound

TESTS = Path(__file__).parent
FAMILY = LowStart()
TRAIN = [t.prompt for t in FAMILY.generate(12, seed=11)]
# small, fast improve runs; the first test's gate and canary let any candidate through to the promotion
FAST = ["--stages", "2", "--set", "rollout.prompts_per_update=6", "--set", "rollout.group_size=4"]
FAST += ["--set", "optim.epochs=2", "--set", "optim.lr=0.01", "--set", "trust_region.delta=0.5"]
OPEN = ["--margin", "1", "--canary-margin", "1", "--kl-limit", "1e9"]
BAD_LR = 10.0  # x1000 of the 0.01 above, with the trust region off: its weights overflow (NaN KL)
# the settings that move this team's greedy answers (the accuracy test below); trained on a reward with
# no signal about the greedy answers (1 - same_start) at x100 and 2 epochs, the candidate sometimes
# answered as the incumbent did, and the canary rightly promoted it
WRONG_LR, WRONG_EPOCHS = 0.2, 4


class Traffic:
    """A client sending the training prompts round and round, with the verifier's reward as feedback."""

    def __init__(self, url: str, team: str, reward=None) -> None:
        self.url, self.team = url, team
        self.reward = reward or (lambda prompt, answer: FAMILY.verify(FAMILY.generate(1, seed=0)[0], answer))
        self.failures: list[str] = []
        self.versions: list[dict[str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def ask(self, client: httpx.Client, prompt: str) -> float:
        r = client.post(
            "/v1/chat/completions",
            json={"model": self.team, "messages": [{"role": "user", "content": prompt}]},
        )
        if r.status_code != 200:
            self.failures.append(f"{r.status_code}: {r.text[:200]}")
            return 0.0
        body = r.json()
        self.versions.append(body["teamtr"]["adapter_versions"])
        answer = body["choices"][0]["message"]["content"]
        reward = self.reward(prompt, answer)
        f = client.post(
            "/v1/feedback", json={"conversation_id": body["teamtr"]["conversation_id"], "reward": reward}
        )
        if f.status_code != 200:
            self.failures.append(f"feedback {f.status_code}: {f.text[:200]}")
        return reward

    def _loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            i = 0
            while not self.stop.is_set():
                self.ask(client, TRAIN[i % len(TRAIN)])
                i += 1

    def answers(self, prompts: list[str]) -> list[str]:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            out = []
            for p in prompts:
                r = client.post(
                    "/v1/chat/completions",
                    json={"model": self.team, "messages": [{"role": "user", "content": p}]},
                )
                out.append(r.json()["choices"][0]["message"]["content"])
            return out


def improve(run: Path, url: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.update({"OMP_NUM_THREADS": "1", "TEAMTR_TORCH_THREADS": "1"})
    command = [
        sys.executable,
        "-m",
        "teamtr.cli.main",
        "improve",
        str(run),
        "--url",
        url,
        "--admin-key",
        "adm",
    ]
    return subprocess.Popen(
        [*command, "--team", "t", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def state(work: Path) -> dict:
    path = work / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def mixed(versions: dict[str, int], incumbent: dict[str, int], candidate: dict[str, int]) -> bool:
    ran = {a: versions[a] for a in candidate}
    return ran not in (candidate, {a: incumbent[a] for a in candidate})


@pytest.fixture
def served(tiny_model_dir, tmp_path):
    """The team `t` served from a run whose adder2 is a damaged version, traffic already flowing."""
    run = served_run(tiny_model_dir, tmp_path / "t")
    config = ServeConfig.from_run_dir(run, "t", admin_key="adm", tracing={"sqlite_path": "traces.db"})
    with serve_in_background(config) as server:
        traffic = Traffic(server.url, "t")
        yield run, server, traffic
        traffic.stop.set()
        if traffic.thread.is_alive():
            traffic.thread.join(120)


def finish(process: subprocess.Popen, timeout_s: float = 900) -> str:
    out, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, out[-4000:]
    return out


def warm_up(traffic: Traffic) -> None:
    with httpx.Client(base_url=traffic.url, timeout=120) as client:
        for prompt in TRAIN * 2:
            traffic.ask(client, prompt)
    traffic.thread.start()


@pytest.mark.slow
def test_improve_trains_gates_canaries_promotes_and_survives_a_kill(served):
    run, server, traffic = served
    work = run / "improve"
    client = AdminClient(server.url, "adm")
    warm_up(traffic)
    args = [*FAST, *OPEN, "--last", "24", "--canary-share", "0.5", "--canary-episodes", "6"]
    first = improve(run, server.url, *args)
    deadline = time.monotonic() + 900
    while state(work).get("phase") != "canary" or client.candidate() is None:
        assert first.poll() is None, first.stdout.read()[-4000:]
        assert time.monotonic() < deadline, "improve did not reach its canary"
        time.sleep(0.5)
    first.send_signal(signal.SIGKILL)  # mid-canary: candidate staged, incumbent current
    first.wait(60)
    s = state(work)
    incumbent = {a: v for a, (v, _) in s["incumbent"].items()}
    candidate = s["candidate_versions"]
    assert incumbent == {r: 1 for r in ROLES} and client.list_versions().current == incumbent
    assert client.candidate().versions == candidate  # still staged, still canarying, never current

    out = finish(improve(run, server.url, *args))  # continues the attempt it was in
    assert "promoted" in out, out[-3000:]
    traffic.stop.set()
    traffic.thread.join(120)
    listed = client.list_versions()
    assert listed.current == {**incumbent, **candidate} and listed.candidate is None
    for adapter, version in candidate.items():  # lineage: the run, the data and the incumbent it came from
        (info,) = [v for v in listed.roles[adapter] if v.version == version]
        assert info.lineage["run"] == s["run_dir"] and info.lineage["incumbent"] == incumbent[adapter]
        assert "24 episodes" in info.lineage["data_window"]

    assert traffic.failures == []
    assert len(traffic.versions) > 40
    assert not [v for v in traffic.versions if mixed(v, incumbent, candidate)]
    assert any(v["adder2"] == candidate["adder2"] for v in traffic.versions)  # canary episodes were served
    events = [r["event"] for r in read_records(work / "promotions.jsonl")]
    assert events[0] == "gate" and events[-1] == "promoted" and "canary_started" in events
    records = read_records(work / "promotions.jsonl")
    assert records[0]["decision"] == "passed" and records[0]["figures"]["certificate"]["stage_certificates"]
    assert records[-1]["candidate"] == candidate and records[-1]["data_window"]["episodes"] == 24
    assert records[-1]["figures"]["mixed_episodes"] == 0 and records[-1]["figures"]["candidate_episodes"] >= 6


@pytest.mark.slow
def test_a_bad_candidate_is_refused_by_the_gate_or_rolled_back_by_the_canary(monkeypatch, served):
    run, server, traffic = served
    work = run / "improve"
    client = AdminClient(server.url, "adm")
    good = "".join(sorted({first_char(a) for a in traffic.answers(TRAIN)}))  # how the incumbent answers
    monkeypatch.setenv(CHARS_ENV, good)  # the reward of the client, the improve process and the canary
    traffic.reward = same_start
    warm_up(traffic)
    reward = ["--reward", "improve_fixtures:same_start"]
    bad = [
        *FAST,
        *reward,
        "--last",
        "24",
        "--set",
        f"optim.lr={BAD_LR}",
        "--set",
        "trust_region.enabled=false",
    ]
    out = finish(improve(run, server.url, *bad))
    assert out.strip().endswith("refused"), out[-3000:]
    (gate,) = read_records(work / "promotions.jsonl")
    assert gate["event"] == "gate" and gate["decision"] == "refused"
    assert any("trust region" in r or "margin" in r for r in gate["figures"]["reasons"])
    assert client.list_versions().current == {r: 1 for r in ROLES} and client.candidate() is None

    # a corrupted update let through a wide-open gate: trained on a mis-specified reward (the task's
    # verifier, which wants answers before 'P', while this client rewards the incumbent's own answers), at
    # the settings that move this team's greedy answers; the canary, judged by the client's feedback,
    # rolls it back
    opened = [*FAST, "--canary-reward", "feedback", "--last", "24"]
    opened += ["--set", f"optim.lr={WRONG_LR}", "--set", f"optim.epochs={WRONG_EPOCHS}"]
    opened += ["--set", "trust_region.enabled=false", "--kl-limit", "1e9"]
    opened += ["--margin", "1", "--canary-episodes", "6", "--canary-margin", "0.05"]
    out = finish(improve(run, server.url, *opened))
    assert out.strip().endswith("rolled_back"), out[-3000:]
    traffic.stop.set()
    traffic.thread.join(120)
    records = read_records(work / "promotions.jsonl")
    assert [r["event"] for r in records[1:]] == ["gate", "canary_started", "rolled_back"]
    figures = records[-1]["figures"]
    assert figures["candidate_reward"] < figures["incumbent_reward"] - 0.05
    listed = client.list_versions()
    assert listed.current == {r: 1 for r in ROLES} and listed.candidate is None
    candidate = records[-1]["candidate"]
    assert all(not v.live for a, n in candidate.items() for v in listed.roles[a] if v.version == n)
    assert traffic.failures == []
    incumbent = {r: 1 for r in ROLES}
    assert not [v for v in traffic.versions if mixed(v, incumbent, candidate)]


HELD_OUT = [t.prompt for t in FAMILY.generate(32, seed=23)]  # never served before the first measurement
# an improve run that moves the team in two stages within the same trust region as FAST (delta 0.5), at
# 20x its learning rate and twice its epochs; the gate's and canary's margins stay at their defaults
STRONG = ["--stages", "2", "--set", "rollout.prompts_per_update=6", "--set", "rollout.group_size=4"]
STRONG += ["--set", "optim.epochs=4", "--set", "optim.lr=0.2", "--set", "trust_region.delta=0.5"]
CONFIDENCE = 0.95


def held_out_accuracy(traffic: Traffic) -> list[float]:
    """The verifier's reward of the served team's answer to each held-out prompt, through the API."""
    instance = FAMILY.generate(1, seed=0)[0]  # every LowStart instance has the same answer
    return [FAMILY.verify(instance, a) for a in traffic.answers(HELD_OUT)]


ROUNDS = 6  # improve runs one after another on the same traffic, until the held-out accuracy has risen


def serve_training_prompts(traffic: Traffic) -> None:
    """24 more served training prompts: the held-out prompts just measured leave the next --last 24 window."""
    with httpx.Client(base_url=traffic.url, timeout=120) as client:
        for prompt in TRAIN * 2:
            traffic.ask(client, prompt)


@pytest.mark.slow
def test_improve_raises_the_served_teams_held_out_accuracy(served):
    """The issue's claim: from the served team with a damaged adder2, `teamtr improve` with the default
    gate and canary margins trains, gates, canaries and promotes, and the served team's accuracy on
    held-out prompts (measured through the API, before and after, on the same prompts) rises by more
    than its noise: the paired bootstrap's lower bound of the per-prompt gain is above zero. The greedy
    tiny team answers every prompt alike, so one improve run raises it all or nothing, about 2 runs in 3
    (docs/improve.md); improve runs again on the traffic, as in production, up to ROUNDS times."""
    run, server, traffic = served
    work = run / "improve"
    before = held_out_accuracy(traffic)  # served first, so the improve window (--last 24) excludes them
    warm_up(traffic)
    outcomes: list[str] = []
    for _ in range(ROUNDS):
        out = finish(improve(run, server.url, *STRONG, "--last", "24", "--canary-episodes", "6"))
        outcomes.append(out.strip().split()[-1])
        assert outcomes[-1] in ("promoted", "refused", "rolled_back"), out[-3000:]
        after = held_out_accuracy(traffic)
        gain, lower = paired_bootstrap_lower_bound(
            [a - b for a, b in zip(after, before, strict=True)], CONFIDENCE, samples=2000, seed=0
        )
        if lower > 0:
            break
        serve_training_prompts(traffic)
    traffic.stop.set()
    traffic.thread.join(120)
    report = f"held-out accuracy {np.mean(before):.3f} -> {np.mean(after):.3f}, gain {gain:.3f}"
    assert lower > 0, f"{report} after improve runs {outcomes}, lower {CONFIDENCE} bound {lower:.3f}"

    records = read_records(work / "promotions.jsonl")
    assert records[-1]["event"] == "promoted"  # the rise came with a promotion
    gates = [r["figures"] for r in records if r["event"] == "gate"]
    assert len(gates) == len(outcomes) and outcomes[-1] == "promoted"
    assert all(g["kl_limit"] == 1.0 and max(g["kl"].values()) <= 1.0 for g in gates)  # delta x stages
    candidate = records[-1]["candidate"]
    current = AdminClient(server.url, "adm").list_versions().current
    assert {a: current[a] for a in candidate} == candidate
    assert traffic.failures == []
    assert all(r["figures"]["mixed_episodes"] == 0 for r in records if r["event"] == "promoted")
