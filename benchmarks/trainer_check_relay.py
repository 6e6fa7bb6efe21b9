"""The trainer check on the relay task (issue 33's "Done when"): TeamTR alone, n in {2, 4}, l = 0 and the l = 1
control, delta in {0.05, 0.15}, 5 seeds; and the ablations at n = 4, l = 0, delta 0.15, each switching one
part of the trainer back. The cells are benchmarks/relay_study.py cells (resumable, one line each):

    OMP_NUM_THREADS=1 TEAMTR_TORCH_THREADS=1 nice -n 15 .venv/bin/python benchmarks/relay_study.py --arms teamtr \\
        --sizes 4 2 --deltas 0.15 0.05 --seeds 5 --cell-seeds --out benchmarks/results/trainer_check/relay_2026_12_04
    # one ablation (NAME, overrides in ABLATIONS below):
    ... relay_study.py --arms teamtr --sizes 4 --control-size 0 --deltas 0.15 --seeds 5 --cell-seeds \\
        --set trust_region.check=sampled --out benchmarks/results/trainer_check/relay_2026_12_04/ablations/NAME
    .venv/bin/python benchmarks/trainer_check_relay.py          # the report (report.md beside the cells)

Options and diagnostics measured against one line (VARIANTS below: prefix credit, twice the prompts) run
the same way into ablations/NAME, each with its rule in the results folder's README.md.

The trainer's cells of 2026-12-03 (AdamW, halving, probe 16; 3 cells) are in trainer_check/relay with their
report (`--root benchmarks/results/trainer_check/relay`).

Per (n, l, delta) it prints the issue's lines with their pass/fail: the share of accepted updates whose
delta_eff (exact KL on held-out episodes neither the batch nor the probe saw) exceeded delta (<= 5%), the
median delta_eff / delta (>= 0.5), at l = 0 the seeds ending above their warm start beyond noise (>= 4 of 5;
T = 1 return on 1000 held-out tasks, 2 standard errors of the difference), at l = 1 every seed within 2
points of its warm start or above, the stages undone by eval.keep_best, and the blind roles' own stray mass
per turn at T = 1 (<= 0.02; over blind turns after a digit, `relay_study.py --recount-turns` for cells
written before that count). Beside them, how well the enforced figure predicts the measured one: the
median and 95th percentile of delta_eff / the probe's bound at the kept point, and their ratio, the largest
median delta_eff / delta any aim of that probe reaches with at most 5% of updates beyond delta
(`attainable`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path("benchmarks/results/trainer_check/relay_2026_12_04")  # the defaults of 2026-12-04
# each ablation switches one part of the default trainer back to its behaviour before 2026-12
ABLATIONS: dict[str, dict[str, Any]] = {
    "sampled_check": {"trust_region.check": "sampled"},  # items 1-2: k3 on the batch's tokens, per epoch
    "adamw": {"optim.optimizer": "adamw"},  # item 2's first step: AdamW's lr * sign(g) on every weight
    "group_normalised": {"loss.advantage": "group_normalised"},  # item 3: the std-normalised baseline
    "no_stratify": {"rollout.stratify": False},  # item 4: B independent prompts (not balanced over values)
    "no_keep_best": {"eval.keep_best": False},  # item 5: no stage-level revert
    "forward_kl": {"trust_region.direction": "forward"},  # item 1's direction: forward only (default: max)
}
# options and diagnostics measured against the stray line (README.md here has each one's rule); the folder
# ablations/NAME like the ablations'
VARIANTS: dict[str, dict[str, Any]] = {
    "credit_prefix": {"loss.credit": "prefix"},  # item 3's option: credit from the role's own prefix (n = 4)
    "credit_prefix_n2": {"loss.credit": "prefix"},  # the same at n = 2
    "default_n2_10seeds": {},  # the default at n = 2, seeds 0-9 (0-4 copied from cells.jsonl)
    "prompts16_n2": {"rollout.prompts_per_update": 16},  # twice the prompts per update, seeds 0-9
    "exact_penalty": {"trust_region.penalty_kl": "exact"},  # eq. 10's penalty the region's exact KL (n = 4)
    "exact_penalty_n2": {"trust_region.penalty_kl": "exact"},  # the same at n = 2, seeds 0-9
}


def read_cells(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def beyond_noise(after: float, before: float, n_after: int, n_before: int) -> float:
    """after - before in units of the standard error of the difference of two binomial means."""
    se = (after * (1 - after) / n_after + before * (1 - before) / n_before) ** 0.5
    return (after - before) / se if se > 0 else float("inf") * (after - before)


def blind_stray(cell: dict[str, Any]) -> float:
    """The blind roles' own stray mass per turn (relay_study.turn_rates, recounted into turn_rates.jsonl for
    cells written before it was counted); the study's first count, which also counts every blind turn after
    an unreadable one, where a cell has no other."""
    rates = cell["turn_rates_t1"]
    return rates.get("blind_own_stray_per_turn", rates["blind_stray_per_turn"])


def with_recounts(cells: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """`cells` with the turn rates of turn_rates.jsonl (relay_study.py --recount-turns) where it has them."""
    recounted = {r["key"]: r["turn_rates_t1"] for r in read_cells(path)}
    return [{**c, "turn_rates_t1": recounted[c["key"]]} if c["key"] in recounted else c for c in cells]


def setting_rows(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (n, l, delta): the issue's figures over the setting's seeds."""
    warm = {(c["n"], c["legibility"]): c for c in cells if c["arm"] == "warm"}
    rows = []
    settings = sorted({(c["n"], c["legibility"], c["delta"]) for c in cells if c["arm"] != "warm"})
    for n, legibility, delta in settings:
        mine = sorted(
            (c for c in cells if (c["n"], c["legibility"], c["delta"]) == (n, legibility, delta) and c["arm"] != "warm"),
            key=lambda c: c["seed"],
        )
        base = warm.get((n, legibility))
        ratios = [
            d / delta
            for c in mine
            for d, ok in zip(c["delta_eff"], c.get("accepted") or [True] * len(c["delta_eff"]), strict=True)
            if ok and d is not None
        ]
        gains = [100 * (c["accuracy_t1"] - base["accuracy_t1"]) for c in mine] if base else []
        # delta_eff over the probe's bound at the kept point: how well the enforced figure predicts the one
        # measured on fresh episodes (both noisy: 64 episodes each by default)
        overshoot = [
            d / u
            for c in mine
            for d, u, ok in zip(
                c["delta_eff"], c.get("kl_probe_ucb") or [], c.get("accepted") or [], strict=False
            )
            if ok and d is not None and u
        ]
        z = [
            beyond_noise(c["accuracy_t1"], base["accuracy_t1"], len(c["rewards_t1"]), len(c["rewards_t1"]))
            for c in mine
        ] if base else []  # fmt: skip
        stray = [blind_stray(c) for c in mine if "turn_rates_t1" in c]
        rows.append({
            "setting": f"n{n}/l{legibility:g}/d{delta:g}",
            "legibility": legibility,
            "seeds": len(mine),
            "warm_t1": base["accuracy_t1"] if base else None,
            "warm_stray": blind_stray(base) if base else None,
            "gains": gains,
            "above": sum(v > 2 for v in z),
            "within_2_points": sum(g >= -2 for g in gains),
            "updates": len(ratios),
            "over_delta": sum(r > 1 for r in ratios) / len(ratios) if ratios else None,
            "median_ratio": statistics.median(ratios) if ratios else None,
            "overshoot_q50_q95": attainable(overshoot),
            "reverts": [c.get("reverts") for c in mine],
            "stray": stray,
        })  # fmt: skip
    return rows


def attainable(overshoot: list[float]) -> tuple[float, float] | None:
    """(median, 95th percentile) of delta_eff / probe bound over updates. If every update landed its probe
    bound at the same fraction f of delta, delta_eff > delta in at most 5% of them needs f <= 1 / q95, and the
    median delta_eff / delta is then at most q50 / q95: the best any aim of this probe can do."""
    if len(overshoot) < 20:
        return None
    q = statistics.quantiles(overshoot, n=20, method="inclusive")
    return statistics.median(overshoot), q[-1]


def verdicts(row: dict[str, Any]) -> dict[str, bool | None]:
    """The issue's pass/fail lines for one setting (None: not measured)."""
    seeds = row["seeds"]
    return {
        "delta_eff > delta in <= 5% of updates": None if row["over_delta"] is None else row["over_delta"] <= 0.05,
        "median delta_eff / delta >= 0.5": None if row["median_ratio"] is None else row["median_ratio"] >= 0.5,
        ("l = 0: >= 4 of 5 seeds above warm start beyond noise" if row["legibility"] == 0 else
         "l = 1: every seed within 2 points of warm start or above"): (
            row["above"] >= 4 * seeds / 5 if row["legibility"] == 0 else row["within_2_points"] == seeds
        ),
        "blind stray mass <= 0.02 per turn": all(s <= 0.02 for s in row["stray"]) if row["stray"] else None,
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| setting | seeds | warm T=1 | gain per seed (points) | above beyond noise | delta_eff > delta | "
        "median delta_eff/delta | delta_eff/bound q50, q95 (best median at 5%) | stages undone | "
        "blind stray per turn (warm) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['seeds']} | {r['warm_t1']:.3f} | {' / '.join(f'{g:+.1f}' for g in r['gains'])} | "
            f"{r['above']}/{r['seeds']} | {r['over_delta']:.1%} | {r['median_ratio']:.2f} | {precision(r)} | "
            f"{' / '.join(str(x) for x in r['reverts'])} | "
            f"{' / '.join(f'{s:.3f}' for s in r['stray'])} (mean {statistics.mean(r['stray']):.3f}; "
            f"warm {r['warm_stray']:.3f}) |"
        )
    return "\n".join(lines)


def precision(row: dict[str, Any]) -> str:
    q = row["overshoot_q50_q95"]
    return "-" if q is None else f"{q[0]:.2f}, {q[1]:.2f} ({q[0] / q[1]:.2f})"


def report(root: Path) -> str:
    """`root`: the trainer's cells (cells.jsonl) and its ablations' (ablations/NAME/cells.jsonl)."""
    parts = [f"## TeamTR ({root.name}: its README.md says which trainer)", ""]
    rows = setting_rows(with_recounts(read_cells(root / "cells.jsonl"), root / "turn_rates.jsonl"))
    parts += [table(rows), ""]
    for r in rows:
        marks = ", ".join(
            f"{line}: {'-' if ok is None else 'pass' if ok else 'FAIL'}" for line, ok in verdicts(r).items()
        )
        parts.append(f"- {r['setting']} ({r['seeds']} seeds): {marks}")
    sections = {
        "Ablations (n = 4, l = 0, delta 0.15; each switches one part back)": ABLATIONS,
        "Options and diagnostics (their rules: README.md here)": VARIANTS,
    }
    for title, names in sections.items():
        rows = [{**r, "setting": f"{name}: {r['setting']}"} for name in names for r in named_rows(root, name)]
        parts += ["", f"## {title}", "", table(rows) if rows else "(no cells yet)"]
    return "\n".join(parts) + "\n"


def named_rows(root: Path, name: str) -> list[dict[str, Any]]:
    """The setting rows of ablations/NAME (an ablation's or a variant's cells)."""
    folder = root / "ablations" / name
    return setting_rows(with_recounts(read_cells(folder / "cells.jsonl"), folder / "turn_rates.jsonl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the trainer's cells: relay (2026-12-03), relay_2026_12_04"
    )
    args = parser.parse_args(argv)
    text = report(args.root)
    (args.root / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
