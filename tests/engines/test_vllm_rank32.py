"""One way to open an engine (engines/open.py): a run whose adapters have LoRA rank 32 trains with
its rollouts sampled by a vLLM server the trainer launches, and `teamtr serve RUN --engine vllm` launches
its own server for it. Both launches size --max-lora-rank from the run (32), so neither refuses the
adapters (serving once passed a fixed 16)."""

from __future__ import annotations

import openai
import pytest
import yaml
from typer.testing import CliRunner

from teamtr.cli.main import app
from teamtr.graphs.run_layout import read_metrics
from teamtr.training.run_dir import RunDir
from tests.support.serve_process import serve_process

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_a_rank_32_run_trains_and_serves_through_vllm(vllm_server, vllm_model_dir, tmp_path):
    del vllm_server  # only its skip reason: both commands below launch servers of their own
    config = tmp_path / "rank32.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run_dir": str(tmp_path / "run"),
                "stages": 1,
                "team": {"model": str(vllm_model_dir), "lora_rank": 32, "lora_alpha": 64},
                "rollout": {"prompts_per_update": 2, "group_size": 2, "engine": "vllm"},
                "optim": {"epochs": 1, "minibatch_messages": 8},
                "eval": {"stage_episodes": 2, "final_episodes": 2},
            }
        )
    )
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 0, result.output
    updates = read_metrics(tmp_path / "run", kind="update")
    assert updates and all(u["rollout_engine"] == "vllm" for u in updates)
    run = RunDir(tmp_path / "run")
    assert {json_rank(path) for _, path in run.saved_adapters().values()} == {32}
    newest = {a: v for a, (v, _) in run.saved_adapters().items()}

    with serve_process(str(tmp_path / "run"), "--engine", "vllm") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="...", max_retries=0)
        reply = client.chat.completions.create(model="run", messages=[{"role": "user", "content": "3+7+9+5"}])
        assert reply.model_extra["teamtr"]["adapter_versions"] == newest


def json_rank(path) -> int:
    return int(yaml.safe_load((path / "adapter_config.json").read_text())["r"])
