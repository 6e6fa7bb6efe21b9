"""`teamtr improve` end to end (improve/, docs/improve.md): a served team, a client sending traffic
and verifier feedback, the improve command as its own process.

- the loop trains from the served versions, gates, canaries and promotes every role at once; killed with
  SIGKILL mid-canary and started again it continues and finishes; no request fails and no episode ever
  ran a mixed team; the promoted versions carry the folder's numbers and their lineage;
- with nothing but the training reward to judge, improve refuses to start unless told; a candidate
  trained on a poisoned reward is refused by the default superiority gate (judged by the incumbent's own
  answers, not by that reward); a bad candidate (learning rate x1000, trust region off) is refused by
  the gate; a corrupted one let through an explicitly wide-open gate is rolled back by the canary, which
  judges it by the client's feedback, and is listed as rolled back;
- with the default gate and canary (superiority, sequential), improve promotes a better team on its
  first run: its accuracy on 32 never-served prompts, measured through the API before and after, rises.

The team is a tiny random model (seconds per stage). The window improve learns from is fixed (the
traffic thread starts once improve has collected it), so each run is the same computation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from teamtr.client.admin_client import AdminClient
from teamtr.graphs.run_layout import read_records
from teamtr.improve.stats import gate_test
from teamtr.serving.server import ServeConfig
from tests.support.improve import (
    CHARS_ENV,
    OWN_TASK,
    ROLES,
    LowStart,
    OwnAnswers,
    first_char,
    same_start,
    served_run,
)
from tests.support.serving import serve_in_background

REPO = Path(__file__).resolve().parents[2]  # `tests.support.improve:...` names import from here
FAMILY = LowStart()
TRAIN = [t.prompt for t in FAMILY.generate(48, seed=11)]  # 48 distinct: 24 held out for the gate (--held-out 0.5)
LAST = ["--last", str(len(TRAIN))]
# small, fast improve runs; the first test's gate and canary are explicit non-inferiority tests with a
# margin of 2 (rewards in [0, 1]: any candidate passes) so the promotion path runs to the end
FAST = ["--stages", "2", "--set", "rollout.prompts_per_update=6", "--set", "rollout.group_size=4"]
FAST += ["--set", "optim.epochs=2", "--set", "optim.lr=0.01", "--set", "trust_region.delta=0.5"]
OPEN = ["--non-inferiority", "2", "--canary-non-inferiority", "2", "--kl-limit", "1e9"]
PROXY = ["--reward", "tests.support.improve:proxy"]  # trained on a proxy; judged by the verifier / feedback
BAD_LR = 10.0  # x1000 of the 0.01 above, with the trust region off: its weights overflow (NaN KL)
# the settings that move this team's greedy answers (the accuracy test below): its greedy first character
# flips only once the proxy's characters gain enough mass, so each update needs a batch of 96 episodes
# (at 24 the flip depended on the seed and the CPU's code path: docs/improve.md)
STRONG_STAGES, STRONG_DELTA = 3, 0.5
STRONG = ["--stages", str(STRONG_STAGES), "--set", "rollout.prompts_per_update=12"]
STRONG += ["--set", "rollout.group_size=8", "--set", "optim.epochs=4", "--set", "optim.lr=0.3"]
STRONG += ["--set", f"trust_region.delta={STRONG_DELTA}"]
# AdamW's sign steps at lr 0.3, not extrapolated: RAdam's direction stretched to delta did not flip a
# greedy first character here (0 prompts won or lost at the gate)
STRONG += ["--set", "optim.optimizer=adamw", "--set", "trust_region.extrapolate=false"]
WRONG_LR, WRONG_EPOCHS = 0.2, 4


class Traffic:
    """A client sending the training prompts round and round, with the verifier's reward as feedback."""

    def __init__(self, url: str, team: str, reward=None, prompts: list[str] = TRAIN) -> None:
        self.url, self.team, self.prompts = url, team, prompts
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
                self.ask(client, self.prompts[i % len(self.prompts)])
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
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
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


@contextmanager
def serving(run: Path, traffic: Callable[[str], Traffic]):
    config = ServeConfig.from_run_dir(run, "t", admin_key="adm", tracing={"sqlite_path": "traces.db"})
    with serve_in_background(config) as server:
        client = traffic(server.url)
        yield run, server, client
        client.stop.set()
        if client.thread.is_alive():
            client.thread.join(120)


@pytest.fixture
def served(tiny_model_dir, tmp_path):
    """The team `t` served from a run whose adder2 is a damaged version (task LowStart)."""
    with serving(served_run(tiny_model_dir, tmp_path / "t"), lambda url: Traffic(url, "t")) as s:
        yield s


def finish(process: subprocess.Popen, timeout_s: float = 900) -> str:
    out, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, out[-4000:]
    return out


def warm_up(traffic: Traffic) -> None:
    """Serve every training prompt once: the window (--last 48) improve will learn from."""
    with httpx.Client(base_url=traffic.url, timeout=120) as client:
        for prompt in traffic.prompts:
            traffic.ask(client, prompt)


def start_traffic_once_collected(traffic: Traffic, work: Path, process: subprocess.Popen) -> None:
    """Live traffic (for the canary) from when improve has read its window, so the window is fixed."""
    deadline = time.monotonic() + 300
    while state(work).get("phase") in (None, "done") or state(work).get("attempt", 0) < attempts(work) + 1:
        if process.poll() is not None:
            break
        assert time.monotonic() < deadline, "improve did not collect its window"
        time.sleep(0.2)
    if not traffic.thread.is_alive():
        traffic.thread.start()


def attempts(work: Path) -> int:
    return len({r["attempt"] for r in read_records(work / "decisions.jsonl")})


def run_improve(run: Path, url: str, traffic: Traffic, *args: str) -> str:
    process = improve(run, url, *args)
    start_traffic_once_collected(traffic, run / "improve", process)
    return finish(process)


@pytest.mark.slow
def test_improve_trains_gates_canaries_promotes_and_survives_a_kill(served):
    run, server, traffic = served
    work = run / "improve"
    client = AdminClient(server.url, "adm")
    warm_up(traffic)
    args = [*FAST, *PROXY, *OPEN, *LAST, "--canary-share", "0.5", "--canary-min-episodes", "6"]
    first = improve(run, server.url, *args)
    start_traffic_once_collected(traffic, work, first)
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
    for adapter, version in candidate.items():  # one number from folder to server
        assert Path(s["candidate_dirs"][adapter]).name == f"v{version}"
    assert s["judges"]["gate"] == "verifier" and s["judges"]["canary"] == "feedback"

    out = finish(improve(run, server.url, *args))  # continues the attempt it was in
    assert "promoted" in out, out[-3000:]
    traffic.stop.set()
    traffic.thread.join(120)
    listed = client.list_versions()
    assert listed.current == {**incumbent, **candidate} and listed.candidate is None
    for adapter, version in candidate.items():  # lineage: the run, the data and the incumbent it came from
        (info,) = [v for v in listed.roles[adapter] if v.version == version]
        assert info.lineage["run"] == s["run_dir"] and info.lineage["incumbent"] == incumbent[adapter]
        assert f"{len(TRAIN)} episodes" in info.lineage["data_window"] and info.state == "serving"
    assert listed.teams[-1] == {**incumbent, **candidate}

    assert traffic.failures == []
    assert len(traffic.versions) > 40
    assert not [v for v in traffic.versions if mixed(v, incumbent, candidate)]
    assert any(v["adder2"] == candidate["adder2"] for v in traffic.versions)  # canary episodes were served
    records = read_records(work / "decisions.jsonl")
    events = [r["event"] for r in records]
    assert events[0] == "gate" and events[-1] == "promoted" and "canary_started" in events
    assert records[0]["decision"] == "passed" and records[0]["figures"]["certificate"]["stage_certificates"]
    assert records[-1]["candidate"] == candidate and records[-1]["data_window"]["episodes"] == len(TRAIN)
    assert records[-1]["figures"]["mixed_episodes"] == 0 and records[-1]["figures"]["candidate_episodes"] >= 6
    served_log = [r["event"] for r in read_records(run / "promotions.jsonl")]  # the server's own log
    assert served_log[-2:] == ["loaded", "promoted"]


@pytest.mark.slow
def test_bad_candidates_are_refused_or_rolled_back(monkeypatch, served):
    run, server, traffic = served
    work = run / "improve"
    client = AdminClient(server.url, "adm")
    warm_up(traffic)
    # nothing but the training reward (the verifier) to judge the gate: refused, saying so
    process = improve(run, server.url, *FAST, *LAST)
    out, _ = process.communicate(timeout=300)
    assert process.returncode != 0 and "training reward" in out, out[-3000:]

    # a poisoned training reward (it prefers what the gate's judge calls wrong), default gate and canary:
    # the gate, judged by the incumbent's own answers (same_start), where the incumbent scores 1 on every
    # held-out prompt, refuses it. (Judged by the verifier, where this incumbent scores 0, a poisoned
    # candidate cannot do worse, and the tiny team's greedy answers, moved by chance, once landed on
    # characters the verifier accepts: +1.000 on 12 prompts, passed.)
    good = "".join(sorted({first_char(a) for a in traffic.answers(TRAIN)}))  # how the incumbent answers
    monkeypatch.setenv(CHARS_ENV, good)
    poisoned = [*STRONG, "--reward", "tests.support.improve:poisoned"]
    poisoned += ["--gate-judge", "tests.support.improve:same_start"]
    out = run_improve(run, server.url, traffic, *poisoned, *LAST)
    assert out.strip().endswith("refused"), out[-3000:]
    (gate,) = read_records(work / "decisions.jsonl")
    figures = gate["figures"]
    assert figures["judge"] == "tests.support.improve:same_start" and figures["test"] == "superiority"
    assert figures["prompts"] == 24 and figures["incumbent_reward"] == 1.0, figures
    assert figures["difference"] <= 0 and not figures["lower_bound"] > 0
    assert client.list_versions().current == {r: 1 for r in ROLES} and client.candidate() is None

    # learning rate x1000 with AdamW (whose sign-like steps overflow the weights at that lr; RAdam's first
    # steps are bounded momentum-SGD ones), trust region off: refused by the gate's KL
    bad = [*FAST, *PROXY, *LAST, "--set", f"optim.lr={BAD_LR}", "--set", "trust_region.enabled=false",
           "--set", "optim.optimizer=adamw"]  # fmt: skip
    out = run_improve(run, server.url, traffic, *bad, "--non-inferiority", "2")
    assert out.strip().endswith("refused"), out[-3000:]
    gate = read_records(work / "decisions.jsonl")[-1]
    assert gate["event"] == "gate" and any("trust region" in r for r in gate["figures"]["reasons"])
    traffic.stop.set()
    traffic.thread.join(120)

    # a corrupted update let through an explicitly wide-open gate: trained on the verifier at the
    # settings that move this team's greedy answers, while this client rewards the incumbent's own
    # answers; the canary, judged by the client's feedback (the default when there is feedback), rolls
    # it back
    traffic = Traffic(server.url, "t", reward=same_start)
    with httpx.Client(base_url=server.url, timeout=120) as c:
        for prompt in TRAIN:
            traffic.ask(c, prompt)
    opened = [*FAST, *LAST, "--gate-judge", "tests.support.improve:same_start", "--non-inferiority", "2"]
    opened += ["--set", f"optim.lr={WRONG_LR}", "--set", f"optim.epochs={WRONG_EPOCHS}"]
    opened += ["--set", "trust_region.enabled=false", "--kl-limit", "1e9", "--canary-episodes", "24"]
    out = run_improve(run, server.url, traffic, *opened)
    traffic.stop.set()
    traffic.thread.join(120)
    assert out.strip().endswith("rolled_back"), out[-3000:]
    records = read_records(work / "decisions.jsonl")
    assert [r["event"] for r in records[-3:]] == ["gate", "canary_started", "rolled_back"]
    figures = records[-1]["figures"]
    assert figures["judge"] == "feedback" and figures["candidate_reward"] < figures["incumbent_reward"]
    listed = client.list_versions()
    assert listed.current == {r: 1 for r in ROLES} and listed.candidate is None
    candidate = records[-1]["candidate"]
    for a, n in candidate.items():
        (v,) = [v for v in listed.roles[a] if v.version == n]
        assert not v.live and v.state == "rolled_back"
    assert traffic.failures == []
    incumbent = {r: 1 for r in ROLES}
    assert not [v for v in traffic.versions if mixed(v, incumbent, candidate)]


OWN = OwnAnswers()
# 96 distinct prompts served, half held out for the gate: 48 paired per-prompt differences
OWN_TRAIN = [t.prompt for t in OWN.generate(96, seed=11)]
# never served before the first measurement; 128 so that a gain of the size one round gives (about 8% of
# prompts, none lost) passes the exact sign test with room: 10 wins, 0 losses has p = 0.001
HELD_OUT = [t.prompt for t in OWN.generate(128, seed=23)]
CONFIDENCE = 0.95


def own_reward(prompt: str, answer: str) -> float:
    return float(OWN.accepts(prompt, answer))


def held_out_accuracy(traffic: Traffic) -> list[float]:
    """The verifier's reward of the served team's answer to each held-out prompt, through the API."""
    return [own_reward(p, a) for p, a in zip(HELD_OUT, traffic.answers(HELD_OUT), strict=True)]


@pytest.fixture
def served_own(tiny_model_dir, tmp_path):
    """The team `t` on task OwnAnswers (each prompt its own answers), with per-prompt verifier feedback."""
    run = served_run(tiny_model_dir, tmp_path / "t", task=OWN_TASK)
    with serving(run, lambda url: Traffic(url, "t", reward=own_reward, prompts=OWN_TRAIN)) as s:
        yield s


@pytest.mark.slow
def test_improve_promotes_a_better_team_on_its_first_run(served_own):
    """From the served team with a damaged adder2, whose greedy answers are right on some prompts of
    OwnAnswers and wrong on others, one `teamtr improve` with the default gate (superiority at 95% on 48
    held-out prompts' own answers, judged by the verifier it was not trained on) and canary (sequential,
    judged by the client's per-prompt feedback) trains on a proxy reward, gates, canaries and promotes;
    the served team's accuracy on 128 never-served prompts, measured through the API before and after,
    rises by the exact one-sided sign test at 95%, paired by prompt."""
    run, server, traffic = served_own
    work = run / "improve"
    before = held_out_accuracy(traffic)  # served first, so the improve window (--last 96) excludes them
    assert 0 < sum(before) < len(before)  # right on some prompts, wrong on others
    warm_up(traffic)
    last = ["--last", str(len(OWN_TRAIN)), "--held-out", "0.5"]
    out = run_improve(run, server.url, traffic, *STRONG, *PROXY, *last)
    traffic.stop.set()
    traffic.thread.join(120)
    assert out.strip().endswith("promoted"), out[-3000:]
    after = held_out_accuracy(traffic)
    # one look at a fixed set of prompts, paired by prompt: the exact sign test the gate itself uses
    test = gate_test(after, before, 0.0, 1.0, CONFIDENCE)
    report = f"held-out accuracy {np.mean(before):.3f} -> {np.mean(after):.3f}"
    report += f" ({test.wins} prompts gained, {test.losses} lost, one-sided p {test.p_value:.4f})"
    print(report)  # for docs/improve.md (pytest -s)
    assert test.passed, report

    records = read_records(work / "decisions.jsonl")
    gate, promoted = records[0]["figures"], records[-1]
    print("gate", {k: gate[k] for k in ("incumbent_reward", "candidate_reward", "lower_bound", "prompts")})
    print("canary", {k: promoted["figures"][k] for k in ("pairs", "lower_bound", "upper_bound")})
    assert records[0]["event"] == "gate" and promoted["event"] == "promoted"
    assert gate["test"] == "superiority" and gate["lower_bound"] > 0 and gate["judge"] == "verifier"
    assert gate["prompts"] == 48 and 0 < gate["incumbent_reward"] < 1  # per-prompt: some right, some not
    kl_limit = STRONG_DELTA * STRONG_STAGES**2  # the default KL limit: the trust region's reach
    assert gate["kl_limit"] == kl_limit and max(gate["kl"].values()) <= kl_limit
    assert promoted["figures"]["judge"] == "feedback" and promoted["figures"]["lower_bound"] > 0
    assert promoted["reason"].startswith("shown better")
    current = AdminClient(server.url, "adm").list_versions().current
    assert {a: current[a] for a in promoted["candidate"]} == promoted["candidate"]
    assert traffic.failures == []
    assert promoted["figures"]["mixed_episodes"] == 0


WATCH_BACKOFF = 20.0
KL_TIGHT = 1e-6


def watch_report(url: str) -> dict:
    """What `teamtr improve --watch` last reported to the server (GET /admin/improve), {} before."""
    r = httpx.get(url + "/admin/improve", headers={"Authorization": "Bearer adm"}, timeout=30)
    return r.json().get("t", {})


def wait_for(condition, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 600
    while not condition():
        assert process.poll() is None, process.stdout.read()[-4000:]
        assert time.monotonic() < deadline, f"the watch did not get to: {what}"
        time.sleep(0.2)


@pytest.mark.slow
def test_watch_starts_rounds_on_new_traffic_backs_off_after_a_refusal_and_reports_to_metrics(served):
    """`teamtr improve --watch`: a round starts only once the threshold of new episodes has arrived; a
    refused round (a KL limit no changed role can meet) is followed by a back-off, after
    which the next round starts on the traffic that came since the last window; /metrics shows the
    watch's phase, rounds, last decision and its figures. Asserted on the watch's own records (their
    order and counters), not on how long anything took."""
    from prometheus_client.parser import text_string_to_metric_families

    run, server, traffic = served
    work = run / "improve"
    n = len(TRAIN)  # the threshold of new episodes = the window (--last 48)
    watch = ["--watch", "--watch-rounds", "2", "--watch-episodes", str(n), "--watch-feedback", "100000"]
    watch += ["--watch-poll", "0.2", "--watch-backoff", str(WATCH_BACKOFF)]
    # every round is refused: any changed role's KL to the incumbent is above this limit (a canary, if
    # one ever started, would time out rather than hang the test)
    fast = [*FAST, "--stages", "1", *PROXY, *LAST, "--kl-limit", str(KL_TIGHT), "--canary-timeout", "60"]
    process = improve(run, server.url, *fast, *watch)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for prompt in TRAIN[:-1]:  # one short of the threshold
            traffic.ask(client, prompt)
        wait_for(lambda: watch_report(server.url).get("new_episodes") == n - 1, process, f"{n - 1} new")
        report = watch_report(server.url)
        assert report["phase"] == "waiting" and report["rounds"] == 0 and not state(work)  # no round yet
        traffic.ask(client, TRAIN[-1])
        wait_for(lambda: state(work).get("attempt") == 1, process, "round 1")
        for prompt in TRAIN:  # the next round's traffic, while round 1 trains
            traffic.ask(client, prompt)
    out = finish(process)
    assert out.strip().splitlines()[-1] == "refused refused", out[-3000:]

    records = read_records(work / "watch.jsonl")
    running = [i for i, r in enumerate(records) if r["phase"] == "running"]
    assert len(running) == 2
    before = records[: running[0]]  # waiting, below the threshold, until the n-th new episode
    assert before and all(r["phase"] == "waiting" and r["new_episodes"] < n for r in before)
    assert records[running[0]]["new_episodes"] >= n
    ended = records[running[0] + 1]  # round 1's outcome: refused, then backing off
    assert ended["rounds"] == 1 and ended["last_decision"] == "refused" and ended["setbacks"] == 1
    assert ended["phase"] == "backing_off" and ended["backoff_s"] == WATCH_BACKOFF
    figures = ended["figures"]
    assert figures["gate_prompts"] == 24 and figures["gate_kl_limit"] == KL_TIGHT
    assert max(v for k, v in figures.items() if k.startswith("gate_kl_adder")) > KL_TIGHT
    between = records[running[0] + 1 : running[1]]  # backing off until not_before, then (if the
    # traffic is not all there yet) waiting
    assert all(r["phase"] in ("backing_off", "waiting") for r in between)
    assert all(r["phase"] == "backing_off" for r in between if r["time_ns"] < ended["not_before_s"] * 1e9)
    second = records[running[1]]  # on the watch's own clock: not before the back-off was over
    assert second["new_episodes"] >= n and second["time_ns"] >= ended["not_before_s"] * 1e9
    windows = [r["data_window"] for r in read_records(work / "decisions.jsonl") if r["event"] == "gate"]
    assert len(windows) == 2 and windows[1]["since_ns"] > windows[0]["until_ns"]  # new traffic only

    last = records[-1]  # after round 2: two setbacks in a row, the back-off doubled
    assert last["rounds"] == 2 and last["setbacks"] == 2 and last["backoff_s"] == 2 * WATCH_BACKOFF
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
        for s in family.samples
    }
    assert samples[("teamtr_improve_last_decision", (("decision", "refused"), ("team", "t")))] == 1
    assert samples[("teamtr_improve_rounds_total", (("outcome", "refused"), ("team", "t")))] == 2
    assert samples[("teamtr_improve_phase", (("phase", "backing_off"), ("team", "t")))] == 1
    assert samples[("teamtr_improve_backoff_seconds", (("team", "t"),))] == 2 * WATCH_BACKOFF
    figure = ("teamtr_improve_last_decision_figure", (("figure", "gate_prompts"), ("team", "t")))
    assert samples[figure] == 24
    assert samples[("teamtr_candidate_version", (("adapter", "adder2"),))] == 0  # nothing left staged
    assert traffic.failures == []
