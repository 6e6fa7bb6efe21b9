"""Sampling as asked and readiness on the REAL vLLM engine: the request's settings reach vLLM (a seed
reproduces a sampled answer, max_tokens caps every turn, n runs n episodes), and /health/ready asks the
vLLM server which adapters it holds. Skips only where vLLM is not installed."""

from __future__ import annotations

import httpx
import pytest

from teamtr.serving.server import ServeConfig
from tests.support.serving import ROLES, make_run_dir, serve_in_background

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # the session's vLLM server takes 30 s or more to start

TASK = "12+7+30+5"


def test_sampling_and_readiness_on_vllm(vllm_server, vllm_model_dir, tmp_path):
    run = make_run_dir(vllm_model_dir, tmp_path / "run", versions=1)
    config = ServeConfig.from_run_dir(
        run, "chain", engine="vllm", vllm_url=vllm_server.url, tracing={"sqlite_path": None}
    )
    with serve_in_background(config) as server:

        def ask(**fields):
            body = {"model": "chain", "messages": [{"role": "user", "content": TASK}], **fields}
            r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()

        def texts(body):
            return [t["text"] for t in body["teamtr"]["turns"]]

        assert texts(ask(temperature=1, seed=5)) == texts(ask(temperature=1, seed=5))
        assert len({tuple(texts(ask(temperature=1, seed=s))) for s in range(4)}) > 1
        capped = ask(max_tokens=2, stop=["\n"])
        assert all(t["completion_tokens"] <= 2 for t in capped["teamtr"]["turns"])
        assert len(ask(n=2, temperature=1, seed=1)["choices"]) == 2

        assert httpx.get(server.url + "/health/ready", timeout=60).status_code == 200
        engine = server.server.engine
        server.call(engine.unload_adapter, f"{ROLES[0]}@v1")  # behind the registry's back
        r = httpx.get(server.url + "/health/ready", timeout=60)
        assert r.status_code == 503
        assert any(ROLES[0] in reason for reason in r.json()["reasons"])
        server.call(engine.load_adapter, f"{ROLES[0]}@v1", str(run / "adapters" / ROLES[0] / "v1"))
        assert httpx.get(server.url + "/health/ready", timeout=60).status_code == 200
