"""The vLLM server dies under load: requests in flight and those that
follow get 503 in OpenAI's error shape (`engine_unavailable`), none runs past its deadline, and
`/health/ready` turns false. Its own vLLM server (the session's stays up for the other tests), killed
with SIGKILL like a crashed process, then started again on the same port: it has lost its LoRA adapters,
the engine loads them again (engines/vllm_engine.py `restore_adapters`), `/health/ready` comes back and
requests run on the same adapter versions as before the kill."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from teamtr.engines.vllm_server import free_port, start_vllm_server
from teamtr.serving.server import ServeConfig
from tests.support.serving import make_run_dir, serve_in_background
from tests.support.vllm import vllm_skip_reason

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DEADLINE_S = 20  # each request's `timeout`: no answer may take longer (plus HTTP slack)
CLIENTS = 6
RECOVERY_S = 120  # from the restarted server answering to /health/ready 200
BODY = {"model": "chain", "messages": [{"role": "user", "content": "12+7+30+5"}], "timeout": DEADLINE_S}


async def load_then_kill(url: str, kill) -> list[tuple[float, float, int, dict]]:
    """CLIENTS clients send requests until 3 s after `kill()`, which runs once 4 requests succeeded:
    (start, seconds, status, body) of each request, times relative to the kill."""
    results: list[tuple[float, float, int, dict]] = []
    killed_at: list[float] = []
    body = BODY

    async def client(http: httpx.AsyncClient) -> None:
        while not killed_at or time.monotonic() < killed_at[0] + 3:
            t0 = time.monotonic()
            r = await http.post(url + "/v1/chat/completions", json=body)
            results.append((t0, time.monotonic() - t0, r.status_code, r.json()))
            if not killed_at and sum(s == 200 for _, _, s, _ in results) >= 4:
                killed_at.append(time.monotonic())
                kill()

    async with httpx.AsyncClient(timeout=DEADLINE_S + 30) as http:
        await asyncio.gather(*(client(http) for _ in range(CLIENTS)))
    return [(t0 - killed_at[0], s, status, b) for t0, s, status, b in results]


def served_models(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]}


def start_vllm(model_dir, port: int, log_path):
    return start_vllm_server(
        model_dir, served_model_name="tiny-llama", max_loras=4, port=port, log_path=str(log_path)
    )


def test_killing_vllm_under_load_answers_503_then_recovers_on_restart(vllm_model_dir, tmp_path):
    reason = vllm_skip_reason()
    if reason:
        pytest.skip(reason)
    port = free_port()
    vllm = start_vllm(vllm_model_dir, port, tmp_path / "v.log")
    try:
        run = make_run_dir(vllm_model_dir, tmp_path / "run", versions=1)
        config = ServeConfig.from_run_dir(
            run,
            "chain",
            engine="vllm",
            vllm_url=vllm.url,
            tracing={"sqlite_path": None},
            conversations_path=None,
        )
        with serve_in_background(config) as api:
            ready = httpx.get(api.url + "/health/ready", timeout=60)
            assert ready.status_code == 200, ready.text
            before = httpx.post(api.url + "/v1/chat/completions", json=BODY, timeout=DEADLINE_S + 30)
            assert before.status_code == 200, before.text
            served_before = served_models(vllm.url)  # the adapters, `<adapter>@v<N>`, and the null one
            results = asyncio.run(
                load_then_kill(api.url, lambda: os.killpg(vllm.process.pid, signal.SIGKILL))
            )
            statuses = {status for _, _, status, _ in results}
            assert statuses <= {200, 503}, statuses  # no 500, no hang turned 408
            failed = [(t, s, b) for t, s, status, b in results if status == 503]
            assert any(t < 0 for t, _, _ in failed), "requests in flight at the kill failed too"
            assert any(t > 0 for t, _, _ in failed)
            for _, _, b in failed:  # OpenAI's error shape
                assert set(b["error"]) == {"message", "type", "param", "code"}
                assert (b["error"]["type"], b["error"]["code"]) == ("server_error", "engine_unavailable")
            assert max(s for _, s, _, _ in results) < DEADLINE_S + 5
            ready = httpx.get(api.url + "/health/ready", timeout=60)
            assert ready.status_code == 503 and ready.json()["status"] == "not_ready", ready.text
            assert ready.json()["reasons"]

            vllm.stop()  # reaps the killed process group
            vllm = start_vllm(vllm_model_dir, port, tmp_path / "v2.log")  # same URL, no adapters loaded
            deadline = time.monotonic() + RECOVERY_S
            while (ready := httpx.get(api.url + "/health/ready", timeout=60)).status_code != 200:
                assert time.monotonic() < deadline, ready.text
                time.sleep(1)
            started = time.monotonic()
            after = [
                httpx.post(api.url + "/v1/chat/completions", json=BODY, timeout=DEADLINE_S + 30)
                for _ in range(2)
            ]
            assert time.monotonic() - started < 2 * (DEADLINE_S + 5)
            for r in after:
                assert r.status_code == 200, r.text
                assert r.json()["teamtr"]["adapter_versions"] == before.json()["teamtr"]["adapter_versions"]
            assert served_models(vllm.url) == served_before  # loaded again, same names, same versions
    finally:
        vllm.stop()
