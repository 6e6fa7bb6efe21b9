"""The README's `teamtr serve RUN --engine vllm` flow on a real vLLM server: a run that `teamtr train`
wrote (task's own team, `team.roles` unset), served by `teamtr serve RUN --vllm-url URL` (the engine is
vLLM, attached to the session's server) in its own process, answering the openai client with each
role's newest adapter version."""

from __future__ import annotations

import openai
import pytest
import yaml
from typer.testing import CliRunner

from teamtr.cli.main import app
from teamtr.training.run_dir import RunDir
from tests.support.serve_process import serve_process

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_a_trained_run_is_served_on_vllm(vllm_server, vllm_model_dir, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run_dir": str(tmp_path / "run"),
                "stages": 1,
                "team": {"model": str(vllm_model_dir)},  # roles: the task's own team (the chain adders)
                "rollout": {"prompts_per_update": 2, "group_size": 2},
                "optim": {"epochs": 1, "minibatch_messages": 8},
                "eval": {"stage_episodes": 2, "final_episodes": 2},
            }
        )
    )
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 0, result.output
    newest = {a: v for a, (v, _) in RunDir(tmp_path / "run").saved_adapters().items()}

    with serve_process(str(tmp_path / "run"), "--vllm-url", vllm_server.url) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="...", max_retries=0)
        reply = client.chat.completions.create(model="run", messages=[{"role": "user", "content": "3+7+9+5"}])
        extension = reply.model_extra["teamtr"]
        assert [t["role"] for t in extension["turns"]] == ["adder1", "adder2", "adder3"]
        assert extension["adapter_versions"] == newest
