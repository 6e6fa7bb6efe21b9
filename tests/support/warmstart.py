"""A seconds-sized warm-start config (tests/training/test_warmstart*.py)."""

from __future__ import annotations

from teamtr.training.warmstart import WarmStartConfig


def tiny_config(**overrides) -> WarmStartConfig:
    """Seconds-sized: a 2-layer model, a handful of steps, a few held-out tasks."""
    base = dict(hidden=64, layers=2, heads=2, batch_size=8, max_steps=3, eval_every=1, eval_tasks=4,
                final_eval_tasks=4, sampled_eval_tasks=4, samples_per_task=2, threads=1)  # fmt: skip
    base.update(overrides)
    return WarmStartConfig(**base)

