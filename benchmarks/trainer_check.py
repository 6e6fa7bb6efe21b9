"""Does the trainer make the demo team better, reliably, inside its trust region? Arms x training seeds.

    python benchmarks/trainer_check.py --out benchmarks/results/trainer_check/demo \
        --arms default before_2026_12 --seeds 0 1 2 3 4

Every cell trains the demo team (the shipped warm model, training/demo.py's DEMO_CONFIG) with the arm's
config overrides and one training seed, then measures the kept stage's greedy accuracy on the demo's 300
test tasks (the demo's own measurement). A cell also summarises its updates: the share of accepted
updates whose exact held-out KL (delta_eff, measured on episodes neither the batch nor the probe saw)
exceeded delta, and the median delta_eff / delta. Cells append to cells.jsonl as they finish; a rerun skips
the finished ones (resumable: run it in the background with nice). `--report` prints the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

# Arms: config overrides on top of the demo's config. `before_2026_12` is the trainer as it was: the
# region checked on the batch's own sampled tokens per epoch, restore-and-halve backtracking, group-
# normalised advantages, AdamW, no stage-level revert. The ablations switch one part of the default back.
# The trainer defaults every arm below "default" ran on (before 2026-12-04): their cells keep their meaning
BEFORE_2026_12_04: dict[str, Any] = {
    "optim.optimizer": "adamw", "trust_region.extrapolate": False, "trust_region.probe_episodes": 16,
    "trust_region.heldout_episodes": 8, "trust_region.delta": 0.05,
}  # fmt: skip
# the extrapolation as the arms of 2026-12-03 ran it: one scaling, at most 8x
ONE_ROUND = {"trust_region.extrapolate": True, "trust_region.extrapolate_rounds": 1}

ARMS: dict[str, dict[str, Any]] = {
    # the defaults: probe check of 64 episodes, max-direction KL, RAdam, extrapolation (3 rounds), rloo,
    # keep_best, the held-out check on 64 episodes; the demo at delta 0.02
    "default": {},
    "halving": {**BEFORE_2026_12_04, "trust_region.line_search": "halving"},  # the default of 2026-12-03
    "bracket": {**BEFORE_2026_12_04, "trust_region.line_search": "bracket"},  # tried as the default (README)
    "radam_halving": {**BEFORE_2026_12_04, "optim.optimizer": "radam"},  # the pilot's start
    "lr1e-3": {**BEFORE_2026_12_04, "optim.lr": 1e-3, "trust_region.line_search": "bracket"},  # exploratory
    "before_2026_12": {
        **BEFORE_2026_12_04,
        "trust_region.check": "sampled",
        "loss.advantage": "group_normalised",
        "eval.keep_best": False,
    },
    "sampled_check": {**BEFORE_2026_12_04, "trust_region.check": "sampled"},
    "group_normalised": {**BEFORE_2026_12_04, "loss.advantage": "group_normalised"},
    "no_keep_best": {**BEFORE_2026_12_04, "eval.keep_best": False},
    "forward_kl": {**BEFORE_2026_12_04, "trust_region.direction": "forward"},
    # the KL sets the length of every step (trust_region.extrapolate): RAdam's short steps scaled towards
    # the boundary; the second with a larger probe aimed lower (README, rule of 2026-12-03 20:15 UTC)
    "radam_extrapolate": {**BEFORE_2026_12_04, **ONE_ROUND, "optim.optimizer": "radam"},
    "radam_extrapolate_probe64": {
        **BEFORE_2026_12_04, **ONE_ROUND, "optim.optimizer": "radam", "trust_region.probe_episodes": 64,
        "trust_region.line_search_target": 0.7,
    },  # fmt: skip
    # added after radam_extrapolate's seed 0 (README): the same steps at a smaller radius
    "radam_extrapolate_probe64_d0.02": {
        **BEFORE_2026_12_04, **ONE_ROUND, "optim.optimizer": "radam", "trust_region.probe_episodes": 64,
        "trust_region.delta": 0.02,
    },  # fmt: skip
    # the same, delta_eff measured on 64 held-out episodes instead of 8 (README, 21:05 UTC): training is
    # unchanged (held-out episodes have seeds of their own), the instrument's own noise smaller
    "radam_extrapolate_probe64_d0.02_heldout64": {
        **BEFORE_2026_12_04, **ONE_ROUND, "optim.optimizer": "radam", "trust_region.probe_episodes": 64,
        "trust_region.delta": 0.02, "trust_region.heldout_episodes": 64,
    },  # fmt: skip
    # eq. 10's penalty the exact KL the region constrains (README, rule of 2026-12-05 13:40 UTC)
    "exact_penalty": {"trust_region.penalty_kl": "exact"},
    "radam_lr1e-2_epochs4_halving": {
        **BEFORE_2026_12_04, "optim.optimizer": "radam", "optim.lr": 1e-2, "optim.epochs": 4,
    },  # fmt: skip
}


def run_cell(arm: str, seed: int, out: Path) -> dict[str, Any]:
    from teamtr.training.demo import demo_config, demo_model, train_and_evaluate, warm_start_accuracy
    from teamtr.training.stage_safety import worse_beyond_noise

    run_dir = out / "runs" / f"{arm}-seed{seed}"
    cfg = demo_config(None, run_dir=str(run_dir))
    cfg = cfg.with_overrides({"team.model": demo_model(cfg, None), "seed": seed, **ARMS[arm]})
    before = warm_start_accuracy(cfg)
    result = train_and_evaluate(cfg, keep_best=True)
    updates = [u for u in _records(run_dir, "update") if u["accepted"]]
    ratios = [u["delta_eff"] / u["delta"] for u in updates if u.get("delta_eff") is not None]
    after = result["after"]
    se = ((before["accuracy"] * (1 - before["accuracy"]) + after["accuracy"] * (1 - after["accuracy"]))
          / after["episodes"]) ** 0.5  # fmt: skip
    return {
        "arm": arm,
        "seed": seed,
        "overrides": ARMS[arm],
        "before": before["accuracy"],
        "after": after["accuracy"],
        "last_stage": result["last"]["accuracy"],
        "kept_stage": result["kept_stage"],
        "gain": after["accuracy"] - before["accuracy"],
        "gain_se": se,
        "above_beyond_noise": after["accuracy"] - before["accuracy"] > 2 * se,
        "worse_beyond_noise": worse_beyond_noise(before, after),
        "stage_returns": result["stages"]["returns"],
        "accepted_updates": len(updates),
        "updates": result["summary"]["updates"],
        "delta_eff_over_delta_share": (sum(r > 1 for r in ratios) / len(ratios)) if ratios else None,
        "delta_eff_over_delta_median": statistics.median(ratios) if ratios else None,
        "seconds": result["seconds"],
    }


def _records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    from teamtr.graphs.run_layout import read_metrics

    return read_metrics(run_dir, kind=kind)


def report(cells: list[dict[str, Any]]) -> str:
    lines = ["| arm | seeds | gain (points) per seed | mean | above warm start beyond noise | delta_eff > delta | "
             "median delta_eff/delta |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm in dict.fromkeys(c["arm"] for c in cells):
        mine = sorted((c for c in cells if c["arm"] == arm), key=lambda c: c["seed"])
        gains = [100 * c["gain"] for c in mine]
        shares = [c["delta_eff_over_delta_share"] for c in mine if c["delta_eff_over_delta_share"] is not None]
        medians = [c["delta_eff_over_delta_median"] for c in mine if c["delta_eff_over_delta_median"] is not None]
        lines.append(
            f"| {arm} | {len(mine)} | {' / '.join(f'{g:+.1f}' for g in gains)} | {statistics.mean(gains):+.1f} | "
            f"{sum(c['above_beyond_noise'] for c in mine)}/{len(mine)} | "
            f"{statistics.mean(shares):.1%} | {statistics.median(medians):.2f} |"
            if shares and medians
            else f"| {arm} | {len(mine)} | {' / '.join(f'{g:+.1f}' for g in gains)} | {statistics.mean(gains):+.1f} | "
            f"{sum(c['above_beyond_noise'] for c in mine)}/{len(mine)} | - | - |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/trainer_check/demo"))
    parser.add_argument("--arms", nargs="+", default=["default", "before_2026_12"], choices=sorted(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--report", action="store_true", help="print the table of the finished cells and stop")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cells_file = args.out / "cells.jsonl"
    cells = [json.loads(line) for line in cells_file.read_text().splitlines()] if cells_file.exists() else []
    if not args.report:
        done = {(c["arm"], c["seed"]) for c in cells}
        for seed in args.seeds:
            for arm in args.arms:
                if (arm, seed) in done:
                    continue
                cell = run_cell(arm, seed, args.out)
                with cells_file.open("a") as f:
                    f.write(json.dumps(cell) + "\n")
                cells.append(cell)
                print(f"{arm} seed {seed}: {100 * cell['before']:.1f} -> {100 * cell['after']:.1f}", flush=True)
    print(report(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
