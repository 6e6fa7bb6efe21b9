"""The blind-relay study's report (docs/study.md, benchmarks/results/relay_study/preregistration.md), from
its cells: per (n, l, delta) the paired TeamTR - naive and TeamTR - sequential GRPO gaps in T = 1 return
(the primary endpoint), their paired-t 95% intervals over seeds, the lab's prediction at the radius
nearest the cell's measured delta_eff, whether the cell matches it, and the preregistered decision rule
with its lab-matched reading; cells not yet run leave the rule "pending".

    .venv/bin/python benchmarks/relay_report.py [--out benchmarks/results/relay_study/main]
    .venv/bin/python benchmarks/relay_report.py --out benchmarks/results/relay_study/main_delta06

A delta 0.6 study is read by the rule of its addendum (addendum_delta06.md: `decide_delta06`, also on
seeds 3-9 alone), with the shared adapter beside naive and sequential GRPO; the first study by the
preregistration's (`decide`).

writes report.md, summary.json, gap_vs_n.png (measured gap and interval beside the predicted point and
band) and curves.png (T = 1 return before and after each stage, per arm, mean over seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).parent))
from relay_study import SECONDARY_ARMS, RelayStudyConfig, seeds_of, setting_key, settings  # noqa: E402
from team_size_study import read_cells  # noqa: E402

from teamtr.training.token_counts import three_counts  # noqa: E402

COMPARED = ("naive", "sequential_grpo", "shared_adapter")  # TeamTR minus each
REPORTED = ("teamtr", *COMPARED)  # the arms of the main table (the shared adapter: issue 37's study only)
SECONDARY = tuple(a for a in SECONDARY_ARMS if a not in REPORTED)


def paired_t(diffs: list[float]) -> dict[str, Any]:
    """Mean of paired differences and its two-sided 95% t interval (None with fewer than 2 seeds)."""
    d = np.asarray(diffs, dtype=float)
    out: dict[str, Any] = {
        "mean": float(d.mean()) if len(d) else None,
        "seeds": len(d),
        "per_seed": d.tolist(),
    }
    if len(d) >= 2:
        half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
        out["ci95"] = [out["mean"] - half, out["mean"] + half]
    else:
        out["ci95"] = None
    return out


def update_deltas(done: list[dict[str, Any]]) -> list[float]:
    """Every update's delta_eff (out-of-sample KL per message) over the cells."""
    return [x for c in done for x in c["delta_eff"] if x is not None]


def nearest_prediction(warm: dict[str, Any], delta_eff: float) -> dict[str, Any]:
    """The warm cell's lab prediction at the radius nearest the measured delta_eff (preregistration,
    pilot part 5: cells are read by their delta_eff)."""
    return min(warm["lab_prediction"], key=lambda p: abs(p["delta"] - delta_eff))


def analyse(
    cfg: RelayStudyConfig, cells: dict[str, dict[str, Any]], skip_seeds: frozenset[int] = frozenset()
) -> list[dict[str, Any]]:
    """Per setting: each arm's figures and TeamTR minus each compared arm, paired over the seeds where
    both ran; `seeds_done` counts the seeds where TeamTR and naive (the primary pair) both ran. Seeds in
    `skip_seeds` are left out (and out of the plan): the addendum's reading without the pilot's seeds."""
    rows = []
    for delta in cfg.deltas:
        for n, legibility in settings(cfg):
            seeds = [s for s in range(seeds_of(cfg, legibility, delta, n)) if s not in skip_seeds]
            if not seeds:
                continue
            key = setting_key(n, legibility, delta)
            warm = cells.get(f"n{n}/l{legibility:g}/warm")
            by_arm = {a: {s: cells.get(f"{key}/seed{s}/{a}") for s in seeds} for a in REPORTED}
            complete = [s for s in seeds if by_arm["teamtr"][s] and by_arm["naive"][s]]
            row: dict[str, Any] = {
                "setting": key, "n": n, "legibility": legibility, "delta": delta,
                "seeds_planned": len(seeds), "seeds_done": len(complete),
                "warm": warm["accuracy_t1"] if warm else None,
            }  # fmt: skip
            for arm in REPORTED:
                done = [c for c in by_arm[arm].values() if c]
                deltas = update_deltas(done)
                row[arm] = {
                    "accuracy_t1": [c["accuracy_t1"] for c in done],
                    "curve_t1": [c.get("curve_t1") for c in done],
                    "delta_eff_mean": float(np.mean(deltas)) if deltas else None,
                    "delta_eff_median": float(np.median(deltas)) if deltas else None,
                    "rejected_fraction": [c["rejected_fraction"] for c in done],
                    # updates whose out-of-sample KL exceeds the radius they were held to in-sample
                    "beyond_delta": sum(x > delta for x in deltas) / len(deltas) if deltas else None,
                }
            for other in COMPARED:
                both = [s for s in seeds if by_arm["teamtr"][s] and by_arm[other][s]]
                row[f"teamtr_minus_{other}"] = paired_t(
                    [by_arm["teamtr"][s]["accuracy_t1"] - by_arm[other][s]["accuracy_t1"] for s in both]
                )
            if warm and row["teamtr"]["delta_eff_mean"] is not None:
                pred = nearest_prediction(warm, row["teamtr"]["delta_eff_mean"])
                row["prediction"] = {"radius": pred["delta"], "gap": pred["gap"], "band": pred["band"]}
                gap = row["teamtr_minus_naive"]
                if gap["ci95"] is not None:
                    lo, hi = gap["ci95"]
                    band_lo, band_hi = pred["band"]
                    row["matches"] = lo <= pred["gap"] <= hi or (lo <= band_hi and band_lo <= hi)
                    row["excludes_prediction"] = not lo <= pred["gap"] <= hi
            # not preregistered, reported beside it: did TeamTR's training raise the team at all?
            row["teamtr_above_warm"] = (
                [a > row["warm"] for a in row["teamtr"]["accuracy_t1"]]
                if row["warm"] is not None and row["teamtr"]["accuracy_t1"]
                else None
            )
            rows.append(row)
    return rows


def secondary(cfg: RelayStudyConfig, cells: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The secondary comparisons (issue 25 item 5), per setting where their cells ran: reversed-order
    TeamTR minus fixed order, and naive at TeamTR's generated tokens (naive_tokens) minus TeamTR, paired
    by seed, with each arm's tokens counted three ways (training/token_counts.py; TeamTR cells run before
    the counts existed have only the first)."""
    rows = []
    for delta in cfg.deltas:
        for n, legibility in settings(cfg):
            key = setting_key(n, legibility, delta)
            seeds = range(seeds_of(cfg, legibility, delta, n))
            by_arm = {a: {s: cells.get(f"{key}/seed{s}/{a}") for s in seeds} for a in ("teamtr", *SECONDARY)}
            if not any(c for a in SECONDARY for c in by_arm[a].values()):
                continue
            row: dict[str, Any] = {"setting": key, "n": n, "legibility": legibility, "delta": delta}
            for arm in SECONDARY:
                both = [s for s in seeds if by_arm[arm][s] and by_arm["teamtr"][s]]
                done = [by_arm[arm][s] for s in both]
                row[arm] = {
                    "seeds": both,
                    "accuracy_t1": [c["accuracy_t1"] for c in done],
                    "stages": [c["stages"] for c in done],
                    "minus_teamtr": paired_t(
                        [by_arm[arm][s]["accuracy_t1"] - by_arm["teamtr"][s]["accuracy_t1"] for s in both]
                    ),
                    "tokens_over_teamtr": [
                        by_arm[arm][s]["train_tokens"] / by_arm["teamtr"][s]["train_tokens"] for s in both
                    ],
                    "counts": [three_counts(c) for c in done],
                }
            rows.append(row)
    return rows


def cost_rows(cells: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (n, arm) of a token-count run (cells of one stage): the three counts per stage and their
    ratios over naive's (same n and seed)."""
    rows = []
    for c in sorted(cells.values(), key=lambda c: (c["n"], c["arm"])):
        counts = three_counts(c)
        if counts is None:  # a warm cell
            continue
        naive = cells.get(c["key"].rsplit("/", 1)[0] + "/naive")
        base = three_counts(naive) if naive else None
        rows.append({
            "n": c["n"], "arm": c["arm"], "stages": c["stages"],
            "per_stage": [x / c["stages"] for x in counts],
            "over_naive": [x / y for x, y in zip(counts, base, strict=True)] if base else None,
        })  # fmt: skip
    return rows


def secondary_markdown(rows: list[dict[str, Any]], costs: list[dict[str, Any]]) -> str:
    lines = [
        "## Secondary (not preregistered as decisive)",
        "",
        "| setting | arm | seeds | T = 1 return | arm - TeamTR [95%] | stages | generated tokens / TeamTR's |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for arm in SECONDARY:
            a = r[arm]
            if not a["seeds"]:
                continue
            g, ci = a["minus_teamtr"], a["minus_teamtr"]["ci95"]
            gap = f"{points(g['mean'])} [{points(ci[0])}, {points(ci[1])}]" if ci else points(g["mean"])
            lines.append(
                f"| {r['setting']} | {arm} | {len(a['seeds'])} | {np.mean(a['accuracy_t1']):.3f} | {gap} | "
                f"{np.mean(a['stages']):.1f} | x{np.mean(a['tokens_over_teamtr']):.2f} |"
            )
    if costs:
        lines += [
            "",
            "Tokens per stage, three ways (generated; + uncached prefill; + the updates' log-prob passes), "
            "and each over naive's:",
            "",
            "| n | arm | generated | + prefill | + passes | over naive (1 / 2 / 3) |",
            "|---|---|---|---|---|---|",
        ]
        for c in costs:
            ratio = " / ".join(f"x{x:.2f}" for x in c["over_naive"]) if c["over_naive"] else "-"
            g, p, a = c["per_stage"]
            lines.append(f"| {c['n']} | {c['arm']} | {g:,.0f} | {p:,.0f} | {a:,.0f} | {ratio} |")
    return "\n".join(lines) + "\n"


def includes_zero(ci: list[float] | None) -> bool | None:
    return None if ci is None else ci[0] <= 0 <= ci[1]


def decide(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The preregistered rule and its lab-matched reading (preregistration.md, "Decision rule"), each as
    soon as the cells it needs say enough: "supported" is out once a needed cell's interval fails it,
    whatever the cells still missing show."""
    by = {r["setting"]: r for r in rows}

    def done(key: str) -> dict[str, Any] | None:
        r = by.get(key)
        return r if r and r["seeds_done"] == r["seeds_planned"] else None

    def excludes_0_upwards(r: dict[str, Any]) -> bool:
        return r["teamtr_minus_naive"]["ci95"][0] > 0

    big = [done(f"n{n}/l0/d0.3") for n in (4, 6)]
    control = done("n4/l1/d0.3")
    rule = "pending"
    if all(big):
        if all(includes_zero(r["teamtr_minus_naive"]["ci95"]) and r.get("excludes_prediction") for r in big):
            rule = "refuted"
        elif not all(excludes_0_upwards(r) for r in big):
            rule = "inconclusive"  # neither refuted nor, whatever the control shows, supported
        elif control:
            grows = big[1]["teamtr_minus_naive"]["mean"] > big[0]["teamtr_minus_naive"]["mean"]
            flat = includes_zero(control["teamtr_minus_naive"]["ci95"])
            rule = "supported" if grows and flat else "inconclusive"
        else:
            rule = "pending (the l = 1 control)"
    lab = [done(f"n{n}/l0/d0.3") for n in (2, 4, 6)]
    reading = "pending"
    if any(r and not excludes_0_upwards(r) for r in lab):
        reading = "not supported"
    elif all(lab) and control:
        reading = "supported" if includes_zero(control["teamtr_minus_naive"]["ci95"]) else "not supported"
    return {"rule": rule, "lab_matched_reading": reading}


def decide_delta06(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule of benchmarks/results/relay_study/addendum_delta06.md, with its premise checks. Supported:
    n4/l0/d0.6's paired 95% CI of TeamTR - naive lies above 0 and the l = 1 control's contains 0 or lies
    within [-2, +2] points; refuted: n4/l0's upper end is below +5 points; else inconclusive."""
    by = {r["setting"]: r for r in rows}

    def done(key: str) -> dict[str, Any] | None:
        r = by.get(key)
        return r if r and r["seeds_done"] == r["seeds_planned"] else None

    main, control = done("n4/l0/d0.6"), done("n4/l1/d0.6")
    rule = "pending"
    if main:
        lo, hi = main["teamtr_minus_naive"]["ci95"]
        if hi < 0.05:
            rule = "refuted"
        elif lo <= 0:
            rule = "inconclusive"
        elif control:
            c_lo, c_hi = control["teamtr_minus_naive"]["ci95"]
            flat = c_lo <= 0 <= c_hi or (c_lo >= -0.02 and c_hi <= 0.02)
            rule = "supported" if flat else "inconclusive"
        else:
            rule = "pending (the l = 1 control)"
    beyond = {
        r["setting"]: r["teamtr"]["beyond_delta"] for r in rows if r["teamtr"]["beyond_delta"] is not None
    }
    n4 = by.get("n4/l0/d0.6")
    naive_median = n4["naive"]["delta_eff_median"] if n4 else None
    return {
        "rule": rule,
        # the premises: the study ran at its radius, and naive reached the lab's large-gap regime
        "teamtr_within_delta": "-" if not beyond else "yes" if max(beyond.values()) <= 0.05 else "no",
        "naive_median_delta_eff_n4": "-" if naive_median is None else f"{naive_median:.3f} (>= 0.07 needed)",
    }


RULES = {"preregistration": decide, "addendum_delta06": decide_delta06}


def points(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}"


def table_markdown(rows: list[dict[str, Any]], decision: dict[str, str]) -> str:
    lines = [
        "| setting | seeds | warm | TeamTR / naive / GRPO / shared (T = 1) | TeamTR - naive [95%] "
        "| TeamTR - GRPO [95%] | TeamTR - shared [95%] | delta_eff (TeamTR) "
        "| updates beyond delta (TeamTR / naive / GRPO / shared) | predicted (radius) [band] "
        "| matches | TeamTR above warm |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        arms = " / ".join(
            f"{np.mean(r[a]['accuracy_t1']):.3f}" if r[a]["accuracy_t1"] else "-" for a in REPORTED
        )
        gaps = []
        for other in COMPARED:
            g = r[f"teamtr_minus_{other}"]
            ci = g["ci95"]
            gaps.append(
                f"{points(g['mean'])} [{points(ci[0])}, {points(ci[1])}]" if ci else points(g["mean"])
            )
        pred = r.get("prediction")
        pred_text = (
            f"{points(pred['gap'])} ({pred['radius']:g}) [{points(pred['band'][0])}, {points(pred['band'][1])}]"
            if pred
            else "-"
        )
        d_eff = r["teamtr"]["delta_eff_mean"]
        above = r["teamtr_above_warm"]
        warm = "-" if r["warm"] is None else f"{r['warm']:.3f}"
        shares = " / ".join(
            "-" if r[a]["beyond_delta"] is None else f"{r[a]['beyond_delta']:.0%}" for a in REPORTED
        )
        lines.append(
            f"| {r['setting']} | {r['seeds_done']}/{r['seeds_planned']} | "
            f"{warm} | {arms} | "
            f"{' | '.join(gaps)} | {'-' if d_eff is None else f'{d_eff:.3f}'} | {shares} | {pred_text} | "
            f"{'-' if 'matches' not in r else ('yes' if r['matches'] else 'no')} | "
            f"{'-' if above is None else f'{sum(above)} of {len(above)}'} |"
        )
    rest = "; ".join(f"{k.replace('_', ' ')}: **{v}**" for k, v in decision.items() if k != "rule")
    lines += ["", f"Decision rule: **{decision['rule']}**" + (f"; {rest}." if rest else ".")]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    deltas = sorted({r["delta"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(deltas), figsize=(5 * len(deltas), 4), sharey=True, squeeze=False)
    for ax, delta in zip(axes[0], deltas, strict=True):
        mine = [r for r in rows if r["delta"] == delta and r["legibility"] == 0.0 and r["seeds_done"]]
        for r in mine:
            g = r["teamtr_minus_naive"]
            err = None if g["ci95"] is None else [[g["mean"] - g["ci95"][0]], [g["ci95"][1] - g["mean"]]]
            ax.errorbar(r["n"], 100 * g["mean"], yerr=None if err is None else 100 * np.array(err), fmt="o",
                        color="C0", capsize=4, label="measured (95% CI)" if r is mine[0] else None)  # fmt: skip
            if "prediction" in r:
                p = r["prediction"]
                ax.plot(r["n"] + 0.15, 100 * p["gap"], "s", color="C3", label="lab" if r is mine[0] else None)
                ax.vlines(r["n"] + 0.15, 100 * p["band"][0], 100 * p["band"][1], color="C3", alpha=0.5)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set(title=f"delta {delta:g}, l = 0", xlabel="roles n", xticks=[2, 4, 6])
        if mine:
            ax.legend(loc="best", fontsize=8)
    axes[0][0].set_ylabel("TeamTR - naive, T = 1 return (points)")
    fig.tight_layout()
    fig.savefig(out / "gap_vs_n.png", dpi=120)
    plt.close(fig)

    shown = [r for r in rows if r["seeds_done"]]
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(4 * max(1, len(shown)), 3.5), squeeze=False)
    for ax, r in zip(axes[0], shown, strict=False):
        for i, arm in enumerate(REPORTED):
            curves = [c for c in r[arm]["curve_t1"] if c]
            if curves:
                ax.plot(range(len(curves[0])), np.mean(curves, axis=0), marker="o", color=f"C{i}", label=arm)
        if r["warm"] is not None:
            ax.axhline(r["warm"], color="grey", ls=":", label="warm (1000 tasks)")
        ax.set(title=f"{r['setting']} ({r['seeds_done']} seeds)", xlabel="stage", ylabel="T = 1 return")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/relay_study/main"))
    p.add_argument(
        "--counts", type=Path, default=Path("benchmarks/results/relay_study/token_counts"),
        help="a one-stage run of every arm whose cells give the three token counts per stage (if present)",
    )  # fmt: skip
    p.add_argument(
        "--rule", choices=sorted(RULES),
        help="the decision rule (default: the addendum's for a delta 0.6 study, else the preregistration's)",
    )  # fmt: skip
    a = p.parse_args(argv)
    cfg = RelayStudyConfig(**{**json.loads((a.out / "config.json").read_text()), "out": a.out})  # the design
    rule = a.rule or ("addendum_delta06" if cfg.deltas == [0.6] else "preregistration")
    cells = read_cells(a.out / "cells.jsonl")
    rows = analyse(cfg, cells)
    decision = RULES[rule](rows)
    if rule == "addendum_delta06":  # also without the seeds the pilot had shown (the addendum says so)
        decision["rule_on_seeds_3_to_9"] = decide_delta06(analyse(cfg, cells, frozenset(range(3))))["rule"]
    extra = secondary(cfg, cells)
    costs = cost_rows(read_cells(a.counts / "cells.jsonl"))
    (a.out / "summary.json").write_text(
        json.dumps({"rows": rows, "decision": decision, "secondary": extra, "token_counts": costs}, indent=1)
    )
    text = table_markdown(rows, decision) + "\n" + secondary_markdown(extra, costs)
    (a.out / "report.md").write_text(text)
    plot(rows, a.out)
    print(text)


if __name__ == "__main__":
    main()
