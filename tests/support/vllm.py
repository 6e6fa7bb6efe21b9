"""Plain helpers of the tests that talk to a REAL vLLM server (installed by scripts/setup_vllm.sh): why
vLLM is missing, and the tiny model the session server serves. The session fixtures (`vllm_server`,
`vllm_engine`, `smollm2_model_dir`, `smollm2_vllm_server`) are in tests/conftest.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from teamtr.engines.vllm_server import DEFAULT_VLLM_PYTHON, REPO_ROOT, VLLM_PYTHON_ENV

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
