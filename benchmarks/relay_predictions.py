"""The exact lab's prediction for every cell of the relay study (issue 25 item 4).

    .venv/bin/python benchmarks/relay_predictions.py            # JSON + markdown table in results/relay_study

For each (n, l, delta) of benchmarks/relay_study.py: the lab twin (theory/env.py
`relay_instance` with `relay_warm_logits`, the warm start drawn as the LLM task's demonstrations are)
trained for the study's stages under TeamTR, naive and joint; the predicted gap is TeamTR's exact return
minus naive's after the last stage (also per stage). `point`: the warm start exactly as the demonstrations
draw it (noise 0); `band`: the 10th-90th percentile over `seeds` warm starts with N(0, noise^2) logit
noise (how much the prediction moves if the LLM's warm probabilities are off). The lab has no sequential
GRPO: its twin is the naive schedule (the same stale data; the losses differ only in the sampled case).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from relay_study import RelayStudyConfig, lab_warm_rates, settings  # noqa: E402
from team_size_study import read_cells  # noqa: E402

from teamtr.theory.scaling import ScalingConfig, make_team  # noqa: E402
from teamtr.theory.team import TabularTeam, train  # noqa: E402
from teamtr.training.stage import ScheduleConfig  # noqa: E402


def curve(cfg: ScalingConfig, n: int, seed: int, schedule: str, stages: int) -> list[float]:
    """Exact return before training and after each stage."""
    instance, logits = make_team(cfg, n, seed, cfg.competence)
    team = TabularTeam(instance, logits, cfg.delta)
    out = [team.evaluation().J]
    for stage in range(stages):
        train(team, ScheduleConfig(kind=schedule), 1, seed * 1000 + stage)
        out.append(team.evaluation().J)
    return out


def predict(
    n: int, legibility: float, delta: float, stages: int, seeds: int, noise: float, warm: dict[str, float]
) -> dict[str, Any]:
    def gaps(cfg: ScalingConfig, seed: int) -> dict[str, list[float]]:
        runs = {s: curve(cfg, n, seed, s, stages) for s in ("teamtr", "naive", "joint")}
        return {
            "teamtr": runs["teamtr"],
            "naive": runs["naive"],
            "joint": runs["joint"],
            "gap": list(np.subtract(runs["teamtr"], runs["naive"])),
        }

    base = dict(agents=[2, 3], family="relay", stages=stages, delta=delta, legibility=legibility, rounds=2, **warm)
    point = gaps(ScalingConfig(**base, noise=0.0, seeds=1), 0)
    noisy = [gaps(ScalingConfig(**base, noise=noise, seeds=seeds), s)["gap"][-1] for s in range(seeds)]
    return {
        "n": n,
        "legibility": legibility,
        "delta": delta,
        "warm_return": point["teamtr"][0],
        "gap": point["gap"][-1],
        "gap_by_stage": point["gap"],
        "teamtr": point["teamtr"],
        "naive": point["naive"],
        "joint": point["joint"],
        "band": [float(np.percentile(noisy, 10)), float(np.percentile(noisy, 90))],
        "band_seeds": seeds,
        "band_noise": noise,
        "warm_rates": warm,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| n | l | delta | warm J | TeamTR J | naive J | predicted gap (points) | band 10-90% |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']} | {r['legibility']:g} | {r['delta']:g} | {r['warm_return']:.3f} | {r['teamtr'][-1]:.3f} "
            f"| {r['naive'][-1]:.3f} | {100 * r['gap']:+.1f} | [{100 * r['band'][0]:+.1f}, {100 * r['band'][1]:+.1f}] |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RelayStudyConfig().out)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--noise", type=float, default=0.3)
    # the warm start's rates (defaults: as the demonstrations draw them; after the pilot: as measured)
    p.add_argument("--slip", type=float, default=0.6, help="role 1's slip probability")
    p.add_argument("--correction", type=float, default=0.3, help="blind corrections per episode, in total")
    p.add_argument("--stray", type=float, default=0.02, help="mass per turn on every other message")
    p.add_argument("--first-stray", type=float, default=None, help="role 1's stray mass (default --stray)")
    p.add_argument("--name", default="predictions", help="output file stem in --out")
    p.add_argument("--stages", type=int, default=None, help="stages (default: the study's)")
    p.add_argument(
        "--deltas", nargs="+", type=float, default=None,
        help="the lab's per-message radii (default: the study's deltas; e.g. the delta_eff the LLM steps reach)",
    )  # fmt: skip
    p.add_argument(
        "--warm-cells", type=Path, default=None,
        help="a study's cells.jsonl: its warm cells' (n, l) and measured turn rates replace the rates above",
    )  # fmt: skip
    a = p.parse_args(argv)
    warm = {"relay_slip": a.slip, "relay_correction": a.correction, "relay_stray": a.stray,
            "relay_first_stray": a.first_stray}  # fmt: skip
    study = RelayStudyConfig()
    measured = [c for c in read_cells(a.warm_cells).values() if c["arm"] == "warm"] if a.warm_cells else []
    setups = [((c["n"], c["legibility"]), lab_warm_rates(c["n"], c["turn_rates_t1"])) for c in measured] or [
        (setting, warm) for setting in settings(study)
    ]
    rows = [
        predict(n, legibility, delta, a.stages or study.stages, a.seeds, a.noise, rates)
        for (n, legibility), rates in setups
        for delta in a.deltas or study.deltas
    ]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.json").write_text(json.dumps(rows, indent=1))
    (a.out / f"{a.name}.md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    sys.exit(main())
