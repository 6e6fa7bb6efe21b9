"""Backpressure, deadlines, disconnects, readiness, metrics and draining on a real server.

The engine is the real embedded engine with a settable pause before each turn (`PausingEngine`), so a
test can hold episodes in flight for as long as it needs; everything else is what `teamtr serve` runs.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.serving.server import ServeConfig, ServedTeamConfig
from tests.support.serving import make_run_dir, serve_in_background, write_versions

TASK = "12+7+30+5"
KEYS = [f"sk-{name}" for name in ("queue", "deadline", "disconnect", "rate", "ready", "metrics", "stream")]


class PausingEngine(EmbeddedEngine):
    """The embedded engine, pausing `pause_s` before each generate call; `broken` makes calls fail."""

    pause_s = 0.0
    broken: str | None = None
    cancelled = 0  # generate calls cancelled while they waited

    async def generate(self, prompt_ids: list[int], **kwargs: Any):
        try:
            await asyncio.sleep(self.pause_s)
            if self.broken:
                raise RuntimeError(self.broken)
            return await super().generate(prompt_ids, **kwargs)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
    return make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=2)


@pytest.fixture(scope="module")
def served(tiny_model_dir, run_dir):
    config = ServeConfig(
        model=str(tiny_model_dir),
        teams={"chain": ServedTeamConfig(run_dir=str(run_dir), max_in_flight=1, max_waiting=1)},
        api_keys=KEYS,
        admin_key="admin",
        rate_limit_rpm=60,
        rate_limit_burst=4,
        request_timeout_s=60,
        tracing={"sqlite_path": None},
    )
    trajectories: list = []
    engine = PausingEngine(str(tiny_model_dir), threads=1, decode_in_thread=True)
    with serve_in_background(config, engine=engine, on_trajectory=trajectories.append) as server:
        server.trajectories = trajectories
        yield server


@pytest.fixture
def paused(served):
    def pause(seconds: float) -> None:
        served.server.engine.pause_s = seconds

    yield pause
    served.server.engine.pause_s = 0.0
    served.server.engine.broken = None


def post(
    served, key: str, client_timeout: float = 60, headers: dict | None = None, **fields: Any
) -> httpx.Response:
    body = {"model": "chain", "messages": [{"role": "user", "content": TASK}], **fields}
    return httpx.post(
        served.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
        timeout=client_timeout,
    )


def metrics(served) -> dict[tuple[str, tuple], float]:
    text = httpx.get(served.url + "/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def in_flight(served) -> float:
    return metrics(served)[("teamtr_in_flight_episodes", (("team", "chain"),))]


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_a_full_queue_answers_429_with_retry_after(served, paused):
    paused(0.8)  # an episode takes ~2.4 s (3 turns): the queue stays full while the test looks
    depth = []
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(post, served, KEYS[0])
        wait_until(lambda: in_flight(served) == 1)
        second = pool.submit(post, served, KEYS[0])
        wait_until(lambda: metrics(served)[("teamtr_queue_depth", (("team", "chain"),))] == 1)
        depth.append(1)
        third = post(served, KEYS[0])
        streamed = post(served, KEYS[0], stream=True)  # refused before any header: a real 429
        statuses = [first.result().status_code, second.result().status_code]
    assert statuses == [200, 200], [first.result().text, second.result().text]
    assert third.status_code == 429
    error = third.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
    assert int(third.headers["Retry-After"]) >= 1
    assert streamed.status_code == 429 and streamed.json()["error"]["code"] == "queue_full"
    assert in_flight(served) == 0


def test_the_deadline_cancels_the_episode_with_408(served, paused):
    paused(1.0)
    before, cancelled = len(served.trajectories), served.server.engine.cancelled
    started = time.monotonic()
    r = post(served, KEYS[1], timeout=0.5)
    assert time.monotonic() - started < 2.5
    assert r.status_code == 408, r.text
    assert r.json()["error"]["code"] == "deadline_exceeded" and r.json()["error"]["param"] == "timeout"
    header = post(served, KEYS[1], headers={"X-Request-Timeout": "0.5"})
    assert header.status_code == 408
    assert served.server.engine.cancelled == cancelled + 2
    assert in_flight(served) == 0 and httpx.get(served.url + "/health").json()["in_flight"] == 0
    time.sleep(1.5)
    assert len(served.trajectories) == before  # the cancelled episodes never finished
    too_long = post(served, KEYS[1], timeout=61)
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "timeout"


def test_a_streamed_request_past_its_deadline_gets_an_in_band_error(served, paused):
    paused(1.0)
    body = {"model": "chain", "messages": [{"role": "user", "content": TASK}], "stream": True, "timeout": 0.5}
    events = []
    with httpx.stream(
        "POST",
        served.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEYS[6]}"},
        timeout=30,
    ) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "deadline_exceeded"
    wait_until(lambda: in_flight(served) == 0)


def test_a_client_that_goes_away_cancels_its_episode(served, paused):
    paused(1.0)  # the episode would take ~3 s
    before = len(served.trajectories)
    counted = metrics(served).get(("teamtr_requests_total", (("status", "499"), ("team", "chain"))), 0.0)
    cancelled = served.server.engine.cancelled
    with pytest.raises(httpx.ReadTimeout):
        post(served, KEYS[2], client_timeout=0.5)  # the client gives up and closes the connection
    wait_until(lambda: in_flight(served) == 0, timeout=2.0)  # well before the episode would have ended
    assert served.server.engine.cancelled == cancelled + 1  # the cancellation reached the engine call
    assert httpx.get(served.url + "/health").json()["in_flight"] == 0  # its adapter pins are released
    time.sleep(3.0)
    assert len(served.trajectories) == before  # it never finished
    after = metrics(served)[("teamtr_requests_total", (("status", "499"), ("team", "chain")))]
    assert after == counted + 1


def test_the_rate_limit_is_per_key_with_retry_after(served, monkeypatch):
    import types

    from teamtr.serving import limits

    now = limits.time.monotonic()  # the bucket's clock stands still: no refill however slow the machine
    monkeypatch.setattr(limits, "time", types.SimpleNamespace(monotonic=lambda: now))
    statuses = [post(served, KEYS[3], model="no-such-team").status_code for _ in range(5)]
    assert statuses[:4] == [404] * 4 and statuses[4] == 429  # a burst of 4, then 1 a second
    r = post(served, KEYS[3])
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(r.headers["Retry-After"]) >= 1
    assert post(served, KEYS[4], model="no-such-team").status_code == 404  # another key is not limited


def test_readiness_follows_the_engine_and_the_adapters(served, run_dir, paused):
    assert httpx.get(served.url + "/health/live").json() == {"status": "ok"}
    ready = httpx.get(served.url + "/health/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    engine = served.server.engine
    served.call(engine.unload_adapter, "adder1@v2")  # behind the registry's back
    try:
        r = httpx.get(served.url + "/health/ready")
        assert r.status_code == 503 and r.json()["status"] == "not_ready"
        assert any("adder1" in reason and "not loaded" in reason for reason in r.json()["reasons"])
        assert httpx.get(served.url + "/health").status_code == 200  # /health keeps its old meaning
    finally:
        served.call(engine.load_adapter, "adder1@v2", str(run_dir / "adapters" / "adder1" / "v2"))
    assert httpx.get(served.url + "/health/ready").status_code == 200
    engine.broken = "the device is gone"
    r = httpx.get(served.url + "/health/ready")
    assert r.status_code == 503
    assert any("probe" in reason and "the device is gone" in reason for reason in r.json()["reasons"])
    engine.broken = None
    assert httpx.get(served.url + "/health/ready").status_code == 200


def test_metrics_after_some_requests(served, tiny_model_dir, tmp_path):
    before = metrics(served)
    replies = [post(served, KEYS[5]).json() for _ in range(2)]
    assert post(served, KEYS[5], stream=True).status_code == 200
    assert post(served, KEYS[5], temperature=-1).status_code == 400
    after = metrics(served)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("teamtr_requests_total", team="chain", status="200") == 3
    assert delta("teamtr_requests_total", team="unknown", status="400") == 1  # refused before a team ran
    assert delta("teamtr_episode_seconds_count", team="chain") == 3
    assert delta("teamtr_time_to_first_content_seconds_count", team="chain") == 1  # the streamed one
    for role in ("adder1", "adder2", "adder3"):
        assert delta("teamtr_turn_seconds_count", team="chain", role=role) == 3
        tokens = sum(
            t["completion_tokens"] for r in replies for t in r["teamtr"]["turns"] if t["role"] == role
        )
        # greedy: the streamed episode's turns are those of the other two
        assert delta("teamtr_generated_tokens_total", team="chain", role=role) == tokens * 3 / 2
    assert after[("teamtr_adapter_version", (("adapter", "adder1"),))] == 2
    # a swap and a refused push show in the registry's counters
    admin = {"Authorization": "Bearer admin"}
    write_versions(tiny_model_dir, tmp_path, range(3, 4), roles=("adder1",))
    pushed = httpx.post(
        served.url + "/admin/adapters",
        json={"role": "adder1", "path": str(tmp_path / "adapters" / "adder1" / "v3")},
        headers=admin,
    )
    assert pushed.status_code == 200, pushed.text
    refused = httpx.post(
        served.url + "/admin/adapters", json={"role": "adder1", "path": str(tmp_path)}, headers=admin
    )
    assert refused.status_code == 400
    final = metrics(served)
    assert final[("teamtr_adapter_version", (("adapter", "adder1"),))] == 3
    assert final[("teamtr_adapter_promotions_total", (("adapter", "adder1"),))] == 1
    assert final[("teamtr_adapter_refused_total", (("adapter", "adder1"),))] == 1
    assert final[("teamtr_adapter_promotions_total", (("adapter", "adder2"),))] == 0
    rolled = httpx.post(served.url + "/admin/adapters/rollback", json={"role": "adder1"}, headers=admin)
    assert rolled.status_code == 200
    assert metrics(served)[("teamtr_adapter_rollbacks_total", (("adapter", "adder1"),))] == 1


def _serving_then_stopped(tiny_model_dir, run_dir, drain_timeout_s: float, pause_s: float):
    config = ServeConfig(
        model=str(tiny_model_dir),
        teams={"chain": ServedTeamConfig(run_dir=str(run_dir))},
        drain_timeout_s=drain_timeout_s,
        tracing={"sqlite_path": None},
    )
    engine = PausingEngine(str(tiny_model_dir), threads=1, decode_in_thread=True)
    engine.pause_s = pause_s
    server = serve_in_background(config, engine=engine)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, server, "none")
        wait_until(lambda: server.server.registry.in_flight() > 0 or pending.done())
        assert not pending.done(), pending.result().text
        stopped_at = time.monotonic()
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        try:
            outcome: httpx.Response | Exception = pending.result()
        except httpx.HTTPError as e:
            outcome = e
        stopper.join(30)
    with pytest.raises(httpx.ConnectError):
        post(server, "none")  # and then it is gone
    return outcome, time.monotonic() - stopped_at


def test_shutdown_drains_requests_in_flight(tiny_model_dir, run_dir):
    outcome, _ = _serving_then_stopped(tiny_model_dir, run_dir, drain_timeout_s=10, pause_s=0.4)
    assert isinstance(outcome, httpx.Response) and outcome.status_code == 200
    assert outcome.json()["choices"][0]["message"]["content"] is not None


def test_shutdown_cancels_what_outlives_the_drain_deadline(tiny_model_dir, run_dir):
    outcome, took = _serving_then_stopped(tiny_model_dir, run_dir, drain_timeout_s=0.5, pause_s=3.0)
    assert isinstance(outcome, httpx.Response), outcome  # cut, rather than waited for (~9 s)
    assert outcome.status_code == 503 and outcome.json()["error"]["code"] == "server_shutting_down"
    assert took < 5


# ---- the admission gate itself (serving/limits.py), without a server ---------------------------------


async def test_the_gate_admits_in_arrival_order_and_a_cancelled_waiter_leaves_the_queue():
    from teamtr.serving.errors import APIError
    from teamtr.serving.limits import AdmissionGate

    gate = AdmissionGate("t", max_in_flight=2, max_waiting=3)
    await gate.acquire(2)
    order: list[str] = []

    async def wait(name: str, places: int) -> None:
        await gate.acquire(places)
        order.append(name)

    big = asyncio.create_task(wait("big", 2))
    await asyncio.sleep(0)
    small = asyncio.create_task(wait("small", 1))
    await asyncio.sleep(0)
    assert (gate.in_flight, gate.waiting) == (2, 3)
    with pytest.raises(APIError) as refused:
        await gate.acquire(1)
    assert refused.value.status == 429 and int(refused.value.headers["Retry-After"]) >= 1
    gate.release(1)
    await asyncio.sleep(0)
    assert order == []  # one place is free, but "big" came first and needs two: "small" waits behind it
    big.cancel()
    await asyncio.gather(big, return_exceptions=True)
    await asyncio.sleep(0)
    await small
    assert order == ["small"] and (gate.in_flight, gate.waiting) == (2, 0)
    with pytest.raises(APIError) as too_many:
        await gate.acquire(3)
    assert too_many.value.status == 400 and too_many.value.param == "n"
