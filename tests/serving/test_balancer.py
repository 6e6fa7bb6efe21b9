"""Two `teamtr serve` replicas behind a real HAProxy (serving/haproxy.py's configuration), sharing a real
PostgreSQL store: clients continue their conversations through the balancer while a version is pushed
through replica A, A is SIGKILLed, and the push is rolled back through replica B; then A is started again
and every thread continues on A or B.
Afterwards: only 200 / 429 / 503 were answered; every answered episode is in the span store exactly once;
each thread's seen messages are what its client was answered (at most the one exchange it never got an
answer for beyond, which its resend replaces), so every conversation continues with its whole history,
nothing twice; no episode mixed versions (every turn ran on the version its episode pinned); the
restarted replica serves again. The smallest load that shows it: 4 clients, a few dozen short requests."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter

import httpx
import psycopg
import pytest

from teamtr.engines.vllm_server import free_port
from teamtr.serving.local_replicas import fresh_database, start_serve, wait_healthy
from teamtr.serving.served_episodes import served_episodes
from teamtr.serving.threads import message_digest
from teamtr.serving.tracing import trajectories_from_store
from tests.support.chat_load import ThreadLoad
from tests.support.services import haproxy
from tests.support.serving import make_run_dir, write_versions

ADMIN = {"Authorization": "Bearer adm"}
CLIENTS = 4
EXCHANGES_PER_THREAD = 3
ALLOWED = {200, 429, 503}
PHASE_TIMEOUT_S = 600  # only a bound against hanging: each phase waits for a count of answers


class Load(ThreadLoad):
    """The clients, through the balancer; every status it answered, and any request it dropped."""

    def __init__(self, url: str) -> None:
        super().__init__(CLIENTS, EXCHANGES_PER_THREAD)
        self.url = url
        self.statuses: Counter[int] = Counter()
        self.dropped: list[str] = []  # requests the balancer closed without an answer
        self.pushed_version_answered = threading.Event()  # an answer ran on the pushed adder2 (v3)
        self.stop = threading.Event()

    def client(self, slot: int) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as http:
            while not self.stop.is_set():
                thread, question, body = self.next_request(slot)
                try:
                    r = http.post("/v1/chat/completions", json=body, headers={"X-Conversation-Id": thread})
                except httpx.TransportError as e:  # the balancer must always answer: counted, then failed
                    with self.lock:
                        self.dropped.append(f"{thread}: {e!r}")
                    continue
                with self.lock:
                    self.statuses[r.status_code] += 1
                if r.status_code == 200:
                    self.record(thread, question, r.json())
                    if r.json()["teamtr"]["adapter_versions"]["adder2"] == 3:
                        self.pushed_version_answered.set()
                else:  # the exchange is resent next round
                    time.sleep(0.2)

    def wait_answered(self, count: int) -> None:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while len(self.answered) < count:
            assert time.monotonic() < deadline, f"only {len(self.answered)} of {count} requests answered"
            time.sleep(0.1)


def seen_digests(db: str, thread: str) -> list[str]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT digest FROM seen_messages WHERE conversation_id = %s ORDER BY seq", (thread,)
        ).fetchall()
    return [d for (d,) in rows]


def test_replicas_behind_haproxy_lose_nothing_when_one_is_killed(tiny_model_dir, tmp_path, postgres):
    check_kill_behind_balancer(tiny_model_dir, tmp_path, postgres)


@pytest.mark.vllm
@pytest.mark.slow
def test_replicas_on_one_vllm_server_lose_nothing_when_one_is_killed(
    vllm_server, vllm_model_dir, tmp_path, postgres
):
    """The same with both replicas attached to one vLLM server (a SIGKILLed replica unloads nothing; the
    restarted one loads the current versions again in place)."""
    check_kill_behind_balancer(vllm_model_dir, tmp_path, postgres, "--vllm-url", vllm_server.url)


def check_kill_behind_balancer(model_dir, tmp_path, postgres, *engine: str) -> None:
    db = fresh_database(postgres, f"t{uuid.uuid4().hex[:12]}")
    run = make_run_dir(model_dir, tmp_path / "run", versions=2)
    later = write_versions(model_dir, tmp_path / "later", [3], roles=("adder2",))
    args = (str(run), "--team-name", "chain", "--db", db, "--admin-key", "adm", *engine)
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    replicas = [start_serve(*args, port=p) for p in ports]
    try:
        for process, url in zip(replicas, urls, strict=True):
            wait_healthy(process, url)
        with haproxy([f"127.0.0.1:{p}" for p in ports]) as balancer:
            load = Load(balancer)
            clients = [threading.Thread(target=load.client, args=(k,)) for k in range(CLIENTS)]
            for c in clients:
                c.start()
            try:
                load.wait_answered(6)
                pushed = httpx.post(
                    urls[0] + "/admin/adapters",
                    json={"role": "adder2", "path": str(later / "adapters" / "adder2" / "v3")},
                    headers=ADMIN,
                    timeout=60,
                )
                assert pushed.status_code == 200, pushed.text
                load.wait_answered(12)
                # answers pinned before the push can outnumber those after it on a loaded machine: the
                # kill waits for one on the pushed version, so the push is seen served before it
                assert load.pushed_version_answered.wait(PHASE_TIMEOUT_S), "no answer ran on the pushed v3"
                os.kill(replicas[0].pid, signal.SIGKILL)  # mid-load: the clients keep sending
                replicas[0].wait(30)
                load.wait_answered(18)
                rolled = httpx.post(
                    urls[1] + "/admin/adapters/rollback", json={"role": "adder2"}, headers=ADMIN, timeout=60
                )
                assert rolled.status_code == 200, rolled.text
                load.wait_answered(24)
            finally:
                load.stop.set()
                for c in clients:
                    c.join(180)
            # restarted without load (on 2 shared cores a restart under load only slows the test down)
            replicas[0] = start_serve(*args, port=ports[0])
            wait_healthy(replicas[0], urls[0])

            assert set(load.statuses) <= ALLOWED and not load.dropped, (load.statuses, load.dropped)
            # every conversation continues, on the restarted replica too, with its whole history once
            for i, thread in enumerate(load.current):
                history = load.histories[thread]
                question = {"role": "user", "content": f"{thread} and then?"}
                r = httpx.post(
                    urls[i % 2] + "/v1/chat/completions",
                    json={"model": "chain", "messages": [*history, question], "max_tokens": 3},
                    headers={"X-Conversation-Id": thread},
                    timeout=120,
                )
                assert r.status_code == 200, r.text
                assert r.json()["teamtr"]["adapter_versions"]["adder2"] == 2  # the rollback, on both
                answer = {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
                history += [question, answer]
                load.answered[r.json()["id"]] = len(r.json()["teamtr"]["turns"])
    finally:
        for process in replicas:
            process.kill()
            process.wait(30)

    episodes = Counter(e.completion_id for e in served_episodes(db))
    for completion in load.answered:
        assert episodes[completion] == 1, f"answered episode {completion} is in the span store {episodes[completion]} times"
    for thread, history in load.histories.items():
        seen = seen_digests(db, thread)
        answered = [message_digest(m["role"], None, m["content"]) for m in history]
        assert seen[: len(answered)] == answered, thread  # every answered exchange, in order, once
        assert len(seen) - len(answered) in (0, 2), thread  # at most the one exchange never answered
    # no episode mixed versions: every turn ran on the version its episode pinned for its role
    pinned = {e.completion_id: e.adapter_versions for e in served_episodes(db)}
    turns = {t.task_id: t.turns for t in trajectories_from_store(db)}
    mixed = [c for c in load.answered if any(t.adapter_version != pinned[c][t.role] for t in turns[c])]
    assert mixed == []
    assert {v["adder2"] for v in pinned.values()} == {2, 3}  # the push served, and the rollback
