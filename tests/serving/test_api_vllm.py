"""The team chat API on the REAL vLLM engine: each role's adapter version is its own vLLM LoRA, a new version
is hot-swapped in while requests are in flight without a failed request, and the served turns' log-probs
are those of the pinned adapter version (rescored by transformers). Skips only where vLLM is not installed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.graphs.run_layout import version_dirs
from teamtr.serving.server import ServeConfig
from teamtr.serving.tracing import trajectories_from_store
from tests.support.serving import ROLES, make_run_dir, serve_in_background, write_versions

# slow: every test here needs the session's vLLM server, whose start-up alone takes 30 s or more
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOLERANCE = 1e-3  # vLLM float32 vs transformers float32


def test_team_api_on_vllm_with_hot_swap_and_traces(vllm_server, vllm_model_dir, tmp_path):
    run = make_run_dir(vllm_model_dir, tmp_path / "run", versions=1)
    pending = write_versions(vllm_model_dir, tmp_path / "pending", range(2, 3))
    db = tmp_path / "traces.db"
    config = ServeConfig.from_run_dir(
        run,
        "chain",
        engine="vllm",
        vllm_url=vllm_server.url,
        admin_key="adm",
        tracing={"sqlite_path": str(db)},
    )
    recorded = []
    tasks = ["12+7+30+5", "3+4+5+6", "40+1+2+3", "9+9+9+9"]
    with serve_in_background(config, on_trajectory=recorded.append) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)

        def ask(task):
            return client.chat.completions.create(model="chain", messages=[{"role": "user", "content": task}])

        first = ask(tasks[0])
        assert first.model_extra["teamtr"]["adapter_versions"] == {r: 1 for r in ROLES}
        with ThreadPoolExecutor(8) as pool:
            in_flight = [pool.submit(ask, tasks[i % 4]) for i in range(8)]
            for role in ROLES:
                version, path = version_dirs(pending, role)[0]
                r = httpx.post(
                    server.url + "/admin/adapters",
                    json={"role": role, "path": str(path)},
                    headers={"Authorization": "Bearer adm"},
                    timeout=120,
                )
                assert r.status_code == 200, r.text
            replies = [f.result() for f in in_flight]  # none failed
        assert all(r.choices[0].message.content is not None for r in replies)
        after = ask(tasks[1])
        assert after.model_extra["teamtr"]["adapter_versions"] == {r: 2 for r in ROLES}
        served_names = set(server.call(server.server.engine.served_models))
        assert {f"{r}@v2" for r in ROLES} <= served_names
        assert not {f"{r}@v1" for r in ROLES} & served_names  # unloaded once no episode used them
        server.server.tracer.flush()

    reference = EmbeddedEngine(vllm_model_dir, threads=1)
    for version, source in ((1, run), (2, pending)):
        for role in ROLES:
            reference.load_adapter_sync(f"{role}@v{version}", version_dirs(source, role)[0][1])
    for trajectory in (recorded[0], recorded[-1]):
        for turn in trajectory.turns:
            rescored = reference.score(
                [turn.prompt_ids], [turn.completion_ids], f"{turn.adapter}@v{turn.adapter_version}"
            )
            assert max(abs(a - b) for a, b in zip(rescored[0], turn.logprobs, strict=True)) < TOLERANCE
    back = {t.task_id: t for t in trajectories_from_store(db)}
    assert all(back[t.task_id] == t for t in recorded)
