"""Two REAL vLLM servers behind one training run and one served team (engines/vllm_replicas.py).

A TeamTR stage samples its rollouts on both (rollout.vllm_urls), each accepted version loaded on both
before the next rollout. Then 8 clients keep asking the served team while every role's adapter is
promoted twice, and one server is killed (SIGKILL) and later restarted on its port. No request fails,
every turn of every episode was sampled by the adapter version pinned at the episode's start (its
log-probs rescored by transformers at that version), the dead server is taken out and rejoins holding
the current adapters, and then serves episodes again; an adapter every replica refuses is reported to
the caller and takes no replica out. Skips only where vLLM is not installed (a failure under CI,
tests/support/ci_strict.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.random_adapters import random_lora_adapter
from teamtr.engines.vllm_http import VLLMRequestError
from teamtr.engines.vllm_server import VLLMServer, VLLMServerConfig, launch
from teamtr.graphs.run_layout import read_metrics, version_dirs
from teamtr.serving.server import ServeConfig
from teamtr.training.trainer import Trainer
from tests.support.serving import ROLES, make_run_dir, serve_in_background, write_versions
from tests.support.trainer import small_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOLERANCE = 1e-3  # vLLM float32 vs transformers float32 (docs/vllm.md)
GAP_BOUND = 1e-4  # |vLLM log-prob - trainer's| per token, float32 both sides (tests/training/test_vllm_rollouts.py)
CLIENTS = 8
TASKS = ["12+7+30+5", "3+4+5+6", "40+1+2+3", "9+9+9+9"]


def second_server(model_dir: Path, port: int | None, log: Path) -> VLLMServer:
    # as the session server (tests/conftest.py): 4 adapter slots, 1 GiB of KV cache
    return launch(
        VLLMServerConfig(
            model_dir=str(model_dir),
            served_model_name="tiny-llama",
            max_loras=4,
            port=port,
            log_path=str(log),
        )
    )


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def replica_b(vllm_server, vllm_model_dir, tmp_path_factory) -> Iterator[dict[str, VLLMServer]]:
    """A second server of the session's model; {"server": it} (the kill test replaces it by its restart)."""
    holder = {"server": second_server(vllm_model_dir, None, tmp_path_factory.mktemp("replica-b") / "b.log")}
    try:
        yield holder
    finally:
        holder["server"].stop()


def finished_requests(url: str) -> float:
    """vLLM's own count of requests it finished (its Prometheus /metrics)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


def test_a_teamtr_stage_with_rollouts_on_two_replicas(vllm_server, replica_b, vllm_model_dir, tmp_path):
    """rollout.vllm_urls: each accepted version reaches both replicas before the next rollout, whose
    log-probs (from whichever replica sampled them) equal the trainer's at that version."""
    other = replica_b["server"]
    before = {url: finished_requests(url) for url in (vllm_server.url, other.url)}
    cfg = small_config(
        str(vllm_model_dir),
        tmp_path / "run",
        **{
            "rollout.engine": "vllm",
            "rollout.vllm_urls": [vllm_server.url, other.url],
            "rollout.prompts_per_update": 2,
            "rollout.group_size": 4,
            "trust_region.heldout_episodes": 0,
            # plumbing, not the trust region: checked on the batch (no probe episodes to sample), and AdamW
            # moves the adapter visibly at this lr (RAdam's first steps are small momentum-SGD ones)
            "trust_region.check": "sampled",
            "optim.optimizer": "adamw",
            "trust_region.delta": 0.5,
            "eval.stage_episodes": 0,
        },
    )
    Trainer(cfg).train()
    updates = read_metrics(tmp_path / "run", kind="update")
    assert any(u["accepted"] for u in updates), "no update accepted: nothing was pushed"
    for prev, cur in zip(updates, updates[1:], strict=False):
        assert cur["batch_turn_versions"][prev["adapter"]] == [prev["version_after"]]
    for u in updates:
        assert all(g["max"] < GAP_BOUND and g["tokens"] > 0 for g in u["rollout_logprob_gaps"].values())
    assert all(finished_requests(url) > before[url] for url in before)  # both replicas sampled


def test_two_replicas_with_pushes_and_a_killed_server(vllm_server, replica_b, vllm_model_dir, tmp_path):
    run = make_run_dir(vllm_model_dir, tmp_path / "run", versions=1)
    pending = write_versions(vllm_model_dir, tmp_path / "pending", range(2, 4))
    other = replica_b["server"]
    port = int(other.url.rsplit(":", 1)[1])
    stop = threading.Event()  # ends the clients' loops
    recorded = []
    config = ServeConfig.from_run_dir(
        run,
        "chain",
        engine="vllm",
        vllm_urls=[vllm_server.url, other.url],
        admin_key="adm",
        tracing={"sqlite_path": None},
    )
    with serve_in_background(config, on_trajectory=recorded.append) as server:
        engine = server.server.engine
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        replies, failures = [], []

        def ask_until_stopped(worker: int) -> None:
            i = worker
            while not stop.is_set():
                try:
                    reply = client.chat.completions.create(
                        model="chain", messages=[{"role": "user", "content": TASKS[i % 4]}]
                    )
                    replies.append(reply)
                except Exception as e:  # counted: the test wants none
                    failures.append(repr(e))
                i += 1

        def promote(version: int) -> None:
            for role in ROLES:
                path = dict(version_dirs(pending, role))[version]
                r = httpx.post(
                    server.url + "/admin/adapters",
                    json={"role": role, "path": str(path)},
                    headers={"Authorization": "Bearer adm"},
                    timeout=300,
                )
                assert r.status_code == 200, r.text

        with ThreadPoolExecutor(CLIENTS) as pool:
            try:
                workers = [pool.submit(ask_until_stopped, w) for w in range(CLIENTS)]
                wait_for(lambda: len(replies) >= 8, 300, "8 replies on two replicas")
                assert {r.url for r in engine.replicas() if r.episodes} == {vllm_server.url, other.url}
                promote(2)  # on both replicas, then flipped
                wait_for(lambda: len(replies) >= 16, 300, "replies after the first promotion")
                os.killpg(other.process.pid, signal.SIGKILL)  # a crash, mid-run
                other.process.wait(timeout=30)
                wait_for(lambda: engine.in_rotation() == [vllm_server.url], 60, "the dead replica taken out")
                promote(3)  # while it is dead: it must get v3 before it serves again
                served_while_dead = len(replies)
                wait_for(
                    lambda: len(replies) >= served_while_dead + 8, 300, "replies on the one replica left"
                )
            finally:
                stop.set()  # also when an assertion failed: the clients' loops end
            for w in workers:
                w.result()
        assert failures == []

        other = replica_b["server"] = second_server(vllm_model_dir, port, tmp_path / "b2.log")  # restart
        wait_for(lambda: len(engine.in_rotation()) == 2, 120, "the restarted replica to rejoin")
        kinds = [(e.url, e.kind) for e in engine.events]
        assert (other.url, "out") in kinds and kinds[-1] == (other.url, "in")
        served = {m["id"] for m in httpx.get(other.url + "/v1/models").json()["data"]}
        assert {f"{r}@v3" for r in ROLES} <= served  # loaded before it rejoined
        rejoined = next(r for r in engine.replicas() if r.url == other.url)
        before = rejoined.episodes

        def ask(i: int):
            return client.chat.completions.create(
                model="chain", messages=[{"role": "user", "content": TASKS[i % 4]}]
            )

        with ThreadPoolExecutor(CLIENTS) as pool:
            after = list(pool.map(ask, range(CLIENTS)))
        assert rejoined.episodes > before  # it serves again

        # an adapter every replica refuses (rank 64 > --max-lora-rank 16) is the adapter's fault:
        # the caller gets vLLM's error and no replica leaves the rotation
        bad = random_lora_adapter(vllm_model_dir, tmp_path / "rank64", seed=1, rank=64)
        with pytest.raises(VLLMRequestError, match="refused"):
            server.call(engine.load_adapter, "too-wide", str(bad))
        assert len(engine.in_rotation()) == 2 and "too-wide" not in engine.adapters()
        assert all(r.model_extra["teamtr"]["adapter_versions"] == {role: 3 for role in ROLES} for r in after)

    # no mixed-version episode: each turn's log-probs are those of the version pinned at the episode's start
    reference = EmbeddedEngine(vllm_model_dir, threads=1)
    for version, source in ((1, run), (2, pending), (3, pending)):
        for role in ROLES:
            reference.load_adapter_sync(f"{role}@v{version}", dict(version_dirs(source, role))[version])
    assert len(recorded) >= 24 + CLIENTS
    assert {v for t in recorded for v in t.adapter_versions().values()} == {1, 2, 3}
    for trajectory in recorded:
        pinned = trajectory.adapter_versions()  # each role's version at its first turn
        for turn in trajectory.turns:
            assert turn.adapter_version == pinned[turn.role]
            rescored = reference.score(
                [turn.prompt_ids], [turn.completion_ids], f"{turn.adapter}@v{turn.adapter_version}"
            )
            assert max(abs(a - b) for a, b in zip(rescored[0], turn.logprobs, strict=True)) < TOLERANCE
