"""Cost of intermediate-occupancy resampling: TeamTR vs naive sequential, side by side in one process.

    .venv/bin/python benchmarks/overhead.py [--stages 2] [--model DIR] [--out runs/overhead]

Three runs with the same config except the schedule: TeamTR resampling in full, TeamTR with suffix
resampling (`schedule.resample: suffix`: each episode re-run from the updated role's first turn), naive. Prints rollout tokens and wall time per stage and per
update, and the ratios TeamTR / naive (the paper: +11.1% tokens, 1.12x wall per update, at its scale,
where one rollout batch is small next to the optimisation it feeds). Tokens are counted three ways
(training/token_counts.py): generated; generated plus the prompt tokens a prefix cache would not hold;
everything processed, the updates' log-prob passes included.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from teamtr.graphs.run_layout import read_metrics
from teamtr.training.config import TrainConfig
from teamtr.training.demo import DEMO_CONFIG
from teamtr.training.token_counts import three_counts
from teamtr.training.trainer import Trainer


def measure(cfg: TrainConfig) -> dict[str, float]:
    t0 = time.perf_counter()
    summary = Trainer(cfg).train()
    wall = time.perf_counter() - t0
    updates = read_metrics(cfg.run_dir, kind="update")
    evals = read_metrics(cfg.run_dir, kind="eval")
    stages = summary["stages"]
    _, prefilled, processed = three_counts(summary)
    return {
        "stages": stages,
        "updates": len(updates),
        "rollout_tokens": summary["train_tokens"],
        "tokens_per_stage": summary["train_tokens"] / stages,
        "prefill_tokens_per_stage": prefilled / stages,
        "processed_tokens_per_stage": processed / stages,
        "wall_per_stage_s": wall / stages,
        "wall_per_update_s": wall / len(updates),  # rollouts included (the paper's per-update wall)
        "optimise_per_update_s": sum(u["seconds"] for u in updates) / len(updates),  # rollouts excluded
        "total_wall_s": wall,
        "eval_episodes": sum(e["episodes"] for e in evals),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--model", default=None, help="base model dir (default: the warm-started demo model)")
    ap.add_argument("--out", default="runs/overhead")
    args = ap.parse_args()
    base = TrainConfig.from_dict(DEMO_CONFIG).with_overrides(
        {"stages": args.stages, "team.model": args.model, "eval.stage_episodes": 0}
    )
    results = {}
    runs = {
        "teamtr": {"schedule.kind": "teamtr", "schedule.resample": "full"},
        "teamtr_suffix": {"schedule.kind": "teamtr", "schedule.resample": "suffix"},
        "naive": {"schedule.kind": "naive"},
    }
    for name, overrides in runs.items():
        run_dir = Path(args.out) / name
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        results[name] = measure(base.with_overrides({**overrides, "run_dir": str(run_dir)}))
    n = results["naive"]
    ratios = {name: _ratios(results[name], n) for name in ("teamtr", "teamtr_suffix")}
    print(json.dumps({**results, "ratio_over_naive": ratios}, indent=1))
    for name, r in ratios.items():
        print(
            f"{name} / naive: rollout tokens per stage x{r['tokens_per_stage']:.2f} "
            f"({(r['tokens_per_stage'] - 1) * 100:+.1f}%; with uncached prefill x{r['prefill_tokens_per_stage']:.2f}, "
            f"everything processed x{r['processed_tokens_per_stage']:.2f}), wall per stage x{r['wall_per_stage']:.2f}, "
            f"wall per update x{r['wall_per_update']:.2f} (optimisation alone x{r['optimise_per_update']:.2f})"
        )


def _ratios(t: dict[str, float], n: dict[str, float]) -> dict[str, float]:
    return {
        **{k: t[k] / n[k] for k in ("tokens_per_stage", "prefill_tokens_per_stage", "processed_tokens_per_stage")},
        "wall_per_stage": t["wall_per_stage_s"] / n["wall_per_stage_s"],
        "wall_per_update": t["wall_per_update_s"] / n["wall_per_update_s"],
        "optimise_per_update": t["optimise_per_update_s"] / n["optimise_per_update_s"],
    }


if __name__ == "__main__":
    main()
