"""The vLLM launcher's command line and its errors (no vLLM server needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from teamtr.engines.vllm_engine import VLLMEngine, _error_message
from teamtr.engines.vllm_server import (
    LOGPROBS_MODE,
    VLLMServerConfig,
    VLLMServerError,
    attach_vllm_server,
    free_port,
    start_vllm_server,
)


def test_command_line_has_the_settings_that_make_log_probs_exact(tmp_path: Path) -> None:
    config = VLLMServerConfig(
        model_dir=str(tmp_path / "my-model"), max_lora_rank=32, extra_args=("--seed", "1")
    )
    cmd = config.command(port=8123)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(cmd[3::1], cmd[4::1], strict=False))
    assert flags["--dtype"] == "float32"
    assert flags["--logprobs-mode"] == LOGPROBS_MODE == "processed_logprobs"
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert flags["--served-model-name"] == "my-model"
    assert flags["--max-lora-rank"] == "32"
    assert "--enable-lora" in cmd and cmd[-2:] == ["--seed", "1"]
    assert "lm_head" not in cmd[cmd.index("--lora-target-modules") :]
    env = config.environment()
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_tensor_and_pipeline_parallel_servers_run_one_worker_per_gpu(tmp_path: Path) -> None:
    single = VLLMServerConfig(model_dir=str(tmp_path / "m")).command(port=1)
    assert "--tensor-parallel-size" not in single and single[single.index("--distributed-executor-backend") + 1] == "uni"
    cmd = VLLMServerConfig(model_dir=str(tmp_path / "m"), tensor_parallel_size=2, pipeline_parallel_size=2).command(1)
    flags = dict(zip(cmd, cmd[1:], strict=False))
    assert flags["--tensor-parallel-size"] == "2" and flags["--pipeline-parallel-size"] == "2"
    assert flags["--distributed-executor-backend"] == "mp"  # "uni" runs one worker only
    ray = VLLMServerConfig(model_dir="m", tensor_parallel_size=8, executor_backend="ray").command(1)
    assert ray[ray.index("--distributed-executor-backend") + 1] == "ray"


def test_replica_devices_and_attaching_one_base_only(tmp_path: Path) -> None:
    from teamtr.engines.vllm_replica_launch import open_replica_engine, replica_configs
    from teamtr.engines.vllm_replicas import VLLMReplicaEngine

    config = VLLMServerConfig(model_dir="m", tensor_parallel_size=2, extra_env={"HF_HOME": "/h"})
    envs = [c.extra_env for c in replica_configs(config, 2, ["0,1", "2,3"])]
    assert envs == [{"HF_HOME": "/h", "CUDA_VISIBLE_DEVICES": "0,1"}, {"HF_HOME": "/h", "CUDA_VISIBLE_DEVICES": "2,3"}]
    with pytest.raises(ValueError, match="2 replicas need 2 device sets"):
        replica_configs(config, 2, ["0"])

    with pytest.raises(ValueError, match="one base model"):
        open_replica_engine({"base": "a", "other": "b"}, urls=["http://127.0.0.1:1"])
    with pytest.raises(ValueError, match="at least one replica"):
        VLLMReplicaEngine({"base": []})


def test_missing_interpreter_or_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(VLLMServerError, match="setup_vllm.sh"):
        start_vllm_server(tmp_path, python=str(tmp_path / "no-python"))
    with pytest.raises(VLLMServerError, match="does not exist"):
        start_vllm_server(tmp_path / "nowhere", python=sys.executable)


def test_a_server_that_dies_at_start_up_reports_its_log(tmp_path: Path) -> None:
    """This test environment's own Python has no vllm: the launch fails fast and says where to look."""
    log = tmp_path / "vllm.log"
    with pytest.raises(VLLMServerError, match="exited") as failed:
        start_vllm_server(tmp_path, python=sys.executable, log_path=str(log), startup_timeout_s=60)
    assert str(log) in str(failed.value)
    assert "vllm" in log.read_text()


def test_attach_to_nothing_is_a_clear_error() -> None:
    with pytest.raises(VLLMServerError, match="cannot reach"):
        attach_vllm_server(f"http://127.0.0.1:{free_port()}", timeout_s=2)


def test_engine_needs_a_base_and_parses_both_error_shapes() -> None:
    import httpx

    with pytest.raises(ValueError, match="at least one"):
        VLLMEngine({})
    openai_shape = httpx.Response(400, json={"error": {"message": "bad adapter", "type": "BadRequestError"}})
    legacy_shape = httpx.Response(400, json={"object": "error", "message": "too long"})
    plain = httpx.Response(500, text="Internal Server Error")
    assert _error_message(openai_shape) == "bad adapter"
    assert _error_message(legacy_shape) == "too long"
    assert _error_message(plain) == "Internal Server Error"
