"""Before vs after on the same instances: the paired change of avg@k and pass@k with bootstrap intervals.

Both evaluations ran the same instances with the same episode seeds (a run's v0 adapters, then its newest or
a stage's), so the change is estimated per instance and its interval resamples instances, which is much
tighter than comparing two unpaired intervals.
"""

from __future__ import annotations

import numpy as np
from rich.table import Table

from teamtr.evals.harness import EvalResult
from teamtr.evals.metrics import bootstrap_mean, per_instance_pass_at_k


def paired_change(before: EvalResult, after: EvalResult, seed: int = 0) -> dict[str, dict]:
    """after - before of avg@k and pass@k, per instance, with 95% bootstrap intervals over instances."""
    ids_before = [r.id for r in before.records]
    if ids_before != [r.id for r in after.records] or before.k != after.k:
        raise ValueError("before and after must score the same instances with the same k")
    k = after.k
    rewards_before = [r.rewards for r in before.records]
    rewards_after = [r.rewards for r in after.records]
    avg = np.array([np.mean(r) for r in rewards_after]) - np.array([np.mean(r) for r in rewards_before])
    passed = np.array(per_instance_pass_at_k(rewards_after, k)) - np.array(
        per_instance_pass_at_k(rewards_before, k)
    )
    return {
        "avg_at_k": bootstrap_mean(avg, seed=seed).as_dict(),
        "pass_at_k": bootstrap_mean(passed, seed=seed).as_dict(),
        "instances_better": int((avg > 0).sum()),
        "instances_worse": int((avg < 0).sum()),
    }


def _fmt(est: dict, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return f"{est['value']:{sign}.1%} [{est['low']:{sign}.1%}, {est['high']:{sign}.1%}]"


def comparison_table(before: EvalResult, after: EvalResult, change: dict, labels: tuple[str, str]) -> Table:
    """before, after and their paired change of pass@k, avg@k (and majority@k when k > 1)."""
    k = after.k
    table = Table(title=f"{after.task}: {labels[0]} vs {labels[1]}, {after.instances} instances x k={k}")
    for column in ("", labels[0], labels[1], "change [95% CI, paired]"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row(f"pass@{k}", _fmt(before.pass_at_k), _fmt(after.pass_at_k), _fmt(change["pass_at_k"], True))
    table.add_row(f"avg@{k}", _fmt(before.avg_at_k), _fmt(after.avg_at_k), _fmt(change["avg_at_k"], True))
    if k > 1 and before.majority_at_k and after.majority_at_k:
        table.add_row(f"majority@{k}", _fmt(before.majority_at_k), _fmt(after.majority_at_k), "")
    table.add_row("tokens / episode", f"{before.tokens_per_episode:.0f}", f"{after.tokens_per_episode:.0f}", "")
    table.caption = (
        f"{change['instances_better']} instances better, {change['instances_worse']} worse (mean reward)"
    )
    return table
