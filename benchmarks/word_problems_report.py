"""The decision of issue 34's done-when from benchmarks/word_problems_seeds.sh's evaluations.

Each seed's directory holds its stage-2 team's episodes on the 300 held-out tasks and the base's
(`before/`). The rule (benchmarks/results/word_problems_smollm2/seeds.md, committed before the runs):
the team learns beyond noise when every seed ends above its start (point estimate) and the change
averaged over seeds, per task, has a 95% bootstrap interval over tasks above 0; it does not learn when
that interval's upper end is below +2 points or some seed's own interval lies below 0; else inconclusive.

    python benchmarks/word_problems_report.py benchmarks/results/word_problems_smollm2/seeds
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from teamtr.evals.metrics import bootstrap_mean

NO_LEARNING_BELOW = 0.02  # the pooled interval's upper end under +2 points: no gain a user would notice


def task_rewards(episodes: Path) -> dict[str, float]:
    """Mean reward per task id of one evaluation's episodes.jsonl."""
    rows = [json.loads(line) for line in episodes.read_text().splitlines() if line.strip()]
    return {row["id"]: float(np.mean(row["rewards"])) for row in rows}


def per_task_change(seed_dir: Path) -> dict[str, float]:
    """after - before per task for one seed (the same tasks in both evaluations)."""
    after = task_rewards(seed_dir / "episodes.jsonl")
    before = task_rewards(seed_dir / "before" / "episodes.jsonl")
    if after.keys() != before.keys():
        raise ValueError(f"{seed_dir}: before and after scored different tasks")
    return {task: after[task] - before[task] for task in after}


def decide(changes: dict[str, dict[str, float]]) -> dict:
    """The rule over seeds' per-task changes: {seed: {task: after - before}}."""
    if len(changes) < 2:
        raise ValueError("the rule needs at least 2 seeds")
    tasks = sorted(next(iter(changes.values())))
    if any(sorted(c) != tasks for c in changes.values()):
        raise ValueError("every seed must be scored on the same tasks")
    per_seed = {seed: bootstrap_mean([c[t] for t in tasks]).as_dict() for seed, c in changes.items()}
    pooled = bootstrap_mean([np.mean([c[t] for c in changes.values()]) for t in tasks]).as_dict()
    if all(e["value"] > 0 for e in per_seed.values()) and pooled["low"] > 0:
        decision = "learns beyond noise"
    elif pooled["high"] < NO_LEARNING_BELOW or any(e["high"] < 0 for e in per_seed.values()):
        decision = "does not learn"
    else:
        decision = "inconclusive"
    return {"tasks": len(tasks), "per_seed": per_seed, "pooled": pooled, "decision": decision}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    out = parser.parse_args().out
    seed_dirs = sorted(p for p in out.glob("seed*") if (p / "result.json").exists())
    report = decide({p.name: per_task_change(p) for p in seed_dirs})
    for p in seed_dirs:
        seconds = out / f"{p.name}.train_seconds"
        report["per_seed"][p.name]["train_minutes"] = (
            round(int(seconds.read_text()) / 60, 1) if seconds.exists() else None
        )
        result = json.loads((p / "result.json").read_text())
        report["per_seed"][p.name]["before"] = result["before"]["pass_at_k"]["value"]
        report["per_seed"][p.name]["after"] = result["pass_at_k"]["value"]
    (out / "decision.json").write_text(json.dumps(report, indent=2) + "\n")
    for seed, e in report["per_seed"].items():
        print(
            f"{seed}: {e['before']:.1%} -> {e['after']:.1%}, change {e['value']:+.1%} "
            f"[{e['low']:+.1%}, {e['high']:+.1%}], trained {e['train_minutes']} min"
        )
    p = report["pooled"]
    print(f"mean over seeds: {p['value']:+.1%} [{p['low']:+.1%}, {p['high']:+.1%}] -> {report['decision']}")


if __name__ == "__main__":
    main()
