"""A tiny random Llama built on the spot (no model hub): the `tiny_model_dir` fixture's model
(tests/conftest.py), also built directly by tests that need a second one or other sizes."""

from __future__ import annotations

from pathlib import Path

import torch


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
