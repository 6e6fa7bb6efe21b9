"""The canary paired by prompt, with real served episodes (serving/episodes.py shadow runs,
serving/registry.py `hold_shadow`, improve/canary.py `tally`): with a candidate staged with
`shadow`, every canary request is answered a second time by the incumbent on the same prompt (its answer
never returned, no feedback reaching it), the two episodes share a pair id in the span store, the
listing leaves shadows out unless asked, the canary's tally pairs each canary episode with its own
shadow, and the versions a shadow held are released."""

from __future__ import annotations

import threading
import time

import httpx

from teamtr.client.admin_client import AdminClient
from teamtr.improve.canary import CanaryConfig, decide, tally
from teamtr.improve.judge import Judges
from teamtr.improve.loop import ImproveConfig, ImproveLoop
from teamtr.serving.server import ServeConfig
from tests.support.serving import make_run_dir, serve_in_background, write_versions

PROMPTS = [f"{a}+{b}+{a + b}+1" for a, b in ((1, 2), (3, 4), (5, 1), (2, 2), (7, 1), (4, 4), (6, 2), (1, 8))]
ROLE_OF = {"adder1": "adder1", "adder2": "adder2", "adder3": "adder3"}


def prompt_only(prompt: str, answer: str) -> float:
    """A reward that depends on the prompt alone: every pair on one prompt differs by exactly 0."""
    return float(PROMPTS.index(prompt) % 2)  # 1 on the canary requests' prompts, 0 on the others


def test_canary_requests_are_answered_again_by_the_incumbent_on_the_same_prompt(tiny_model_dir, tmp_path):
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    config = ServeConfig.from_run_dir(run, "chain", admin_key="adm", tracing={"sqlite_path": "traces.db"})
    with serve_in_background(config) as server:
        client = AdminClient(server.url, "adm")
        path = write_versions(tiny_model_dir, run, range(2, 3), roles=("adder2",)) / "adapters/adder2/v2"
        info = client.load_candidate({"adder2": (path, 2)}, {"run": "r"}, share=0.5, shadow=True)
        assert info.shadow
        returned = {}
        for prompt in PROMPTS:  # the running count makes requests 2, 4, 6, 8 canaries
            reply = httpx.post(
                server.url + "/v1/chat/completions",
                json={"model": "chain", "messages": [{"role": "user", "content": prompt}]},
                timeout=120,
            ).json()
            returned[prompt] = (
                reply["choices"][0]["message"]["content"],
                reply["teamtr"]["adapter_versions"],
            )
        canary_prompts = [p for p in PROMPTS if returned[p][1]["adder2"] == 2]
        assert canary_prompts == PROMPTS[1::2]
        first = next(e for e in client.episodes(team="chain") if e.prompt == canary_prompts[0])
        httpx.post(
            server.url + "/v1/feedback", json={"conversation_id": first.conversation_id, "reward": 1.0}
        ).raise_for_status()
        deadline = time.monotonic() + 120
        while sum(e.shadow for e in client.episodes(team="chain", shadows=True)) < 4:
            assert time.monotonic() < deadline, "the shadow episodes did not finish"
            time.sleep(0.2)

        served = client.episodes(team="chain")  # the traffic itself: no shadow
        assert len(served) == 8 and not any(e.shadow for e in served)
        both = client.episodes(team="chain", shadows=True)
        shadows = {e.pair_id: e for e in both if e.shadow}
        canaries = [e for e in both if not e.shadow and e.adapter_versions["adder2"] == 2]
        assert len(shadows) == 4 and len(canaries) == 4
        for c in canaries:
            s = shadows[c.pair_id]  # the same request, answered by the incumbent
            assert s.prompt == c.prompt and s.adapter_versions == {"adder1": 1, "adder2": 1, "adder3": 1}
            assert s.conversation_id != c.conversation_id and s.start_ns >= c.start_ns - 10**9
            assert (c.final_answer, c.adapter_versions) == returned[c.prompt]  # the canary's answer returned
        assert all(e.pair_id is None for e in both if not e.shadow and e.adapter_versions["adder2"] == 1)
        assert next(e for e in both if e.pair_id == first.pair_id and not e.shadow).reward == 1.0
        assert shadows[first.pair_id].reward is None  # feedback reached the answer the user saw, only

        # paired by prompt: a reward that depends on the prompt alone differs by 0 on every pair, where
        # the k-th canary episode against the k-th incumbent one (different prompts) would not
        t = tally(both, ROLE_OF, {"adder2": 2}, {"adder2": 1}, prompt_only)
        assert t.paired and t.differences == [0.0] * 4 and t.shadows == 4 and t.mixed == 0
        arm = {
            v: [prompt_only(e.prompt, "") for e in served if e.adapter_versions["adder2"] == v]
            for v in (1, 2)
        }
        assert [c - i for c, i in zip(arm[2], arm[1], strict=True)] == [1.0] * 4
        assert decide(t, CanaryConfig(max_episodes=4))[1].startswith("not shown better within 4 pairs")

        # a conversation continued on canary requests: each shadow sees the thread, adds nothing to it
        client.set_canary_share(1.0)
        for prompt in ("2+2+2+2", "3+3+3+3"):
            httpx.post(
                server.url + "/v1/chat/completions",
                json={
                    "model": "chain",
                    "messages": [{"role": "user", "content": prompt}],
                    "metadata": {"conversation_id": "thread-1"},
                },
                timeout=120,
            ).raise_for_status()
        fed = httpx.post(server.url + "/v1/feedback", json={"conversation_id": "thread-1", "reward": 0.5})
        assert fed.json()["episodes"] == 2  # the two answers the user saw, no shadow
        while sum(e.shadow for e in client.episodes(team="chain", shadows=True)) < 6:
            assert time.monotonic() < deadline, "the shadow episodes did not finish"
            time.sleep(0.2)
        thread = [
            e for e in client.episodes(team="chain", shadows=True) if e.prompt in ("2+2+2+2", "3+3+3+3")
        ]
        assert sorted((e.prompt, e.shadow) for e in thread) == [
            ("2+2+2+2", False),
            ("2+2+2+2", True),
            ("3+3+3+3", False),
            ("3+3+3+3", True),
        ]
        assert all(e.reward == (None if e.shadow else 0.5) for e in thread)

        # every version a shadow held is released
        listed = client.list_versions()
        assert all(v.in_flight == 0 for vs in listed.roles.values() for v in vs)
        client.abandon_candidate()
        assert client.candidate() is None


def test_the_loops_canary_asks_for_shadows_and_decides_on_prompt_pairs(tiny_model_dir, tmp_path):
    """ImproveLoop's load and canary steps with a function judge: the candidate is staged with shadows,
    the canary reads them back and decides on pairs taken on the same prompt."""
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    config = ServeConfig.from_run_dir(run, "chain", admin_key="adm", tracing={"sqlite_path": "traces.db"})
    with serve_in_background(config) as server:
        client = AdminClient(server.url, "adm")
        v1 = str(run / "adapters/adder2/v1")
        v2 = write_versions(tiny_model_dir, run, range(2, 3), roles=("adder2",)) / "adapters/adder2/v2"
        canary = CanaryConfig(max_episodes=4, poll_s=0.2, timeout_s=300)
        cfg = ImproveConfig(str(run), str(tmp_path / "work"), "chain", server.url, "adm", canary=canary)
        loop = ImproveLoop(cfg, say=lambda line: None)
        loop._judges = Judges(prompt_only, "prompt_only", prompt_only, "prompt_only", [])
        state = {
            "attempt": 1,
            "id": "a1",
            "run_dir": str(tmp_path / "work/attempt-1"),
            "incumbent": {"adder2": (1, v1)},
            "candidate_dirs": {"adder2": str(v2)},
            "candidate_versions": {"adder2": 2},
            "window": {"episodes": 0, "since_ns": 0, "until_ns": 0},
            "gate": {
                "difference": 0.0,
                "lower_bound": 0.0,
                "prompts": 0,
                "test": "superiority",
                "judge": "t",
            },
        }
        state = loop.load_step(state)
        assert client.candidate().shadow

        stop = threading.Event()

        def traffic() -> None:
            with httpx.Client(base_url=server.url, timeout=120) as c:
                while not stop.is_set():
                    for prompt in PROMPTS:
                        c.post(
                            "/v1/chat/completions",
                            json={"model": "chain", "messages": [{"role": "user", "content": prompt}]},
                        )

        sender = threading.Thread(target=traffic, daemon=True)
        sender.start()
        try:
            state = loop.canary_step(state)
        finally:
            stop.set()
            sender.join(120)
        figures = state["canary"]
        assert state["decision"] == "rollback" and "not shown better within 4 pairs" in state["reason"]
        assert "paired by prompt" in state["reason"] and figures["paired_by_prompt"]
        assert figures["pairs"] >= 4 and figures["shadow_episodes"] >= 4 and figures["mean_difference"] == 0.0
        assert loop.decide_step(state)["outcome"] == "rolled_back" and client.candidate() is None
