"""scripts/gpu_check.sh's dry run on the CPU, with small sizes: the same script and measurements as on a
GPU (docs/models.md, "The GPU path"), the device CPU, the model the demo's shipped warm model (or the
session's tiny vLLM model). The vLLM part runs only where the CPU vLLM venv exists (marked vllm)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--sequences", "4", "--new-tokens", "8", "--episodes", "4", "--swaps", "2"]



def gpu_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--device", "cpu", *SMALL, *args, "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TEAMTR_TORCH_THREADS": "1"},
    )  # fmt: skip
    assert out.exists(), proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_the_gpu_check_dry_run_measures_the_embedded_engine_and_a_stage(tmp_path):
    proc, result = gpu_check(tmp_path, "--no-vllm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout[proc.stdout.index("{\n") :]) == result  # printed as JSON too
    assert "chain-demo" in result["model"] and result["cpu_capability"]
    embedded = result["embedded"]
    assert (embedded["device"], embedded["dtype"]) == ("cpu", "torch.float32")
    assert embedded["tokens"] > 0 and embedded["tokens_per_s"] > 0
    # recorded log-probs vs the scoring path, float32: only the order of summation differs
    assert embedded["self_logprob_gap"]["max"] < 1e-4 and embedded["self_logprob_gap"]["tokens"] > 0
    assert result["vllm"] == {"skipped": "--no-vllm"}
    stage = result["stage"]
    assert stage["rollout_engine"] == "embedded" and stage["updates"] == 3  # one stage of the 3 roles
    assert result["ok"] is True


def test_the_gpu_check_refuses_a_gpu_where_torch_sees_none(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the check would run")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=120, cwd=REPO)  # fmt: skip
    assert proc.returncode == 2 and "sees no GPU" in proc.stderr and "--device cpu" in proc.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_the_gpu_check_dry_run_with_vllm_swaps_and_stage(tmp_path, vllm_model_dir, vllm_server):
    """On the session's vLLM server (attached: its start-up is most of the check's time)."""
    proc, result = gpu_check(tmp_path, "--model", str(vllm_model_dir), "--vllm-url", vllm_server.url)
    assert proc.returncode == 0, proc.stderr[-3000:]
    vllm = result["vllm"]
    assert vllm["throughput"]["tokens_per_s"] > 0
    assert all(g["max"] < 1e-3 and g["tokens"] > 0 for g in vllm["logprob_gap"].values())  # float32 vLLM
    assert vllm["swaps"] == {**vllm["swaps"], "count": 2, "failures": 0}
    assert result["stage"]["rollout_engine"] == "vllm" and result["stage"]["logprob_gap_max"] < 1e-3


def test_the_update_check_builds_a_named_architecture_with_random_weights(tmp_path):
    """`--shape`: Qwen3's architecture and vocabulary (151,936) at test size, no hub; each message count
    with and without checkpointing, a finite update each."""
    sizes = ["--update-messages", "2", "3", "--update-tokens", "48"]
    proc, result = gpu_check(tmp_path, "--update-only", "--shape", "qwen3-tiny", *sizes)
    assert proc.returncode == 0 and result["ok"] and result["shape"] == "qwen3-tiny", proc.stderr[-2000:]
    runs = [(u["messages"], u["gradient_checkpointing"], u["vocab"], u["finite"]) for u in result["update"]]
    assert runs == [(m, ckpt, 151936, True) for m in (2, 3) for ckpt in (False, True)]
