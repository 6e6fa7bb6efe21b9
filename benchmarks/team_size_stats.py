"""Statistics, table and figures of benchmarks/team_size_study.py (docs/study.md), from its cells.

Accuracies with 95% intervals from a bootstrap over seeds and evaluation tasks; TeamTR - naive paired by
seed and task, with a paired bootstrap 95% interval and a two-sided bootstrap p-value; stale gap and
occupancy divergence per update (mean over updates i >= 2) and their log-log slope in n.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

ARMS = ("teamtr", "naive_updates", "naive_tokens")
COMPARISONS = {"equal updates": "naive_updates", "equal tokens": "naive_tokens"}
PAPER_ALPHA = {"naive": 1.94, "teamtr": 1.07}


def cell_key(task: str, n: int, seed: int | None, arm: str) -> str:
    return f"{task}/n{n}/{arm}" if seed is None else f"{task}/n{n}/seed{seed}/{arm}"


# ---- statistics -----------------------------------------------------------------------------------------


def bootstrap_mean(matrix: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """Means of `reps` resamples of a seeds x tasks matrix: seeds and tasks each drawn with replacement."""
    s, t = matrix.shape
    seeds = rng.integers(0, s, size=(reps, s))
    tasks = rng.integers(0, t, size=(reps, t))
    return np.array([matrix[np.ix_(si, ti)].mean() for si, ti in zip(seeds, tasks, strict=True)])


def interval(samples: np.ndarray) -> list[float]:
    return [float(np.quantile(samples, 0.025)), float(np.quantile(samples, 0.975))]


def paired(a: np.ndarray, b: np.ndarray, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    """a - b paired by seed and task: mean, paired bootstrap 95% interval, two-sided bootstrap p-value
    (twice the share of resampled means on the far side of 0, at least 1 / reps), seeds where a > b."""
    diff = a - b
    boot = bootstrap_mean(diff, reps, rng)
    share = min(float((boot <= 0).mean()), float((boot >= 0).mean()))
    per_seed = diff.mean(axis=1)
    return {
        "mean": float(diff.mean()),
        "ci95": interval(boot),
        "p": min(1.0, max(2 * share, 1.0 / reps)),
        "per_seed": [float(x) for x in per_seed],
        "ahead": int((per_seed > 0).sum()),
        "behind": int((per_seed < 0).sum()),
    }


def fit_slope(ns: list[int], values: list[float]) -> float | None:
    pts = [(math.log(n), math.log(v)) for n, v in zip(ns, values, strict=True) if v and v > 0]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def analyse(cfg: Any, cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """cfg: the study's StudyConfig (tasks, sizes, seeds, bootstrap)."""
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for task in cfg.tasks:
        for n in cfg.sizes:
            warm = cells.get(cell_key(task, n, None, "warm"))
            if warm is None:
                continue
            row: dict[str, Any] = {"task": task, "n": n, "seeds_done": {}}
            w = np.array([warm["rewards"]])
            row["warm"] = {
                "accuracy": warm["accuracy"],
                "ci95": interval(bootstrap_mean(w, cfg.bootstrap, rng)),
                "build": warm.get("build"),  # steps and stop of its training/warmstart build (newer cells)
            }
            by_seed: dict[str, dict[int, list[float]]] = {}  # arm -> seed -> rewards, for the pairing
            for arm in ARMS:
                recs = [cells.get(cell_key(task, n, s, arm)) for s in range(cfg.seeds)]
                recs = [r for r in recs if r is not None]
                row["seeds_done"][arm] = len(recs)
                if not recs:
                    continue
                m = np.array([r["rewards"] for r in recs])
                by_seed[arm] = {r["seed"]: r["rewards"] for r in recs}
                stale = [g for r in recs for g in r["stale_gap"]]
                occ = [g for r in recs for g in r["occupancy_divergence"]]
                row[arm] = {
                    "accuracy": float(m.mean()),
                    "ci95": interval(bootstrap_mean(m, cfg.bootstrap, rng)),
                    "per_seed": [float(x) for x in m.mean(axis=1)],
                    "gain": paired(m, np.repeat(w, len(m), axis=0), cfg.bootstrap, rng),
                    "updates": float(np.mean([r["updates"] for r in recs])),
                    "train_tokens": float(np.mean([r["train_tokens"] for r in recs])),
                    "stale_gap": float(np.mean(stale)) if stale else None,
                    "occupancy_divergence": float(np.mean(occ)) if occ else None,
                    "seconds": float(np.sum([r["seconds"] for r in recs])),
                }
            for label, arm in COMPARISONS.items():
                both = sorted(
                    set(by_seed.get("teamtr", {})) & set(by_seed.get(arm, {}))
                )  # seeds done in both
                if both:
                    a = np.array([by_seed["teamtr"][s] for s in both])
                    b = np.array([by_seed[arm][s] for s in both])
                    row[f"diff {label}"] = paired(a, b, cfg.bootstrap, rng)
            rows.append(row)
    slopes: dict[str, Any] = {}
    for task in cfg.tasks:
        for arm, name in (("teamtr", "teamtr"), ("naive_updates", "naive")):
            for metric in ("stale_gap", "occupancy_divergence"):
                mine = [r for r in rows if r["task"] == task and (r.get(arm) or {}).get(metric)]
                slopes[f"{task}/{metric}/{name}"] = fit_slope(
                    [r["n"] for r in mine], [r[arm][metric] for r in mine]
                )
    exact = cells.get("exact")
    seconds = float(sum(c.get("seconds", 0.0) for c in cells.values()))
    return {"rows": rows, "slopes": slopes, "exact": exact, "paper": PAPER_ALPHA, "seconds": seconds}


# ---- outputs ------------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _ci(ci: list[float]) -> str:
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def table_markdown(result: dict[str, Any]) -> str:
    head = (
        "| task | n | warm start | TeamTR | naive (equal updates) | naive (equal tokens) "
        "| TeamTR - naive, equal updates | TeamTR - naive, equal tokens | seeds |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in result["rows"]:
        cells = [r["task"], str(r["n"]), f"{_pct(r['warm']['accuracy'])} {_ci(r['warm']['ci95'])}"]
        for arm in ARMS:
            a = r.get(arm)
            cells.append(f"{_pct(a['accuracy'])} {_ci(a['ci95'])}" if a else "-")
        for label in COMPARISONS:
            d = r.get(f"diff {label}")
            cells.append(
                f"{100 * d['mean']:+.1f} {_ci(d['ci95'])}, p = {d['p']:.3f} ({d['ahead']}/{len(d['per_seed'])})"
                if d
                else "-"
            )
        cells.append("/".join(str(r["seeds_done"].get(a, 0)) for a in ARMS))
        lines.append("| " + " | ".join(cells) + " |")
    diag = (
        "\n| task | n | updates TeamTR / naive (eq. tokens) | rollout tokens TeamTR / naive (eq. updates) "
        "| stale gap TeamTR / naive | occupancy divergence TeamTR / naive |\n|---|---|---|---|---|---|\n"
    )
    for r in result["rows"]:
        t, nu, nt = r.get("teamtr") or {}, r.get("naive_updates") or {}, r.get("naive_tokens") or {}

        def f(x: Any) -> str:
            return "-" if x is None else f"{x:.3g}"

        diag += (
            f"| {r['task']} | {r['n']} | {f(t.get('updates'))} / {f(nt.get('updates'))} "
            f"| {f(t.get('train_tokens'))} / {f(nu.get('train_tokens'))} "
            f"| {f(t.get('stale_gap'))} / {f(nu.get('stale_gap'))} "
            f"| {f(t.get('occupancy_divergence'))} / {f(nu.get('occupancy_divergence'))} |\n"
        )
    slopes = "\n| log-log slope in n | TeamTR | naive | exact lab TeamTR | exact lab naive | paper TeamTR / naive |\n"
    slopes += "|---|---|---|---|---|---|\n"
    exact = result.get("exact") or {}
    for task in sorted({r["task"] for r in result["rows"]}):
        for metric in ("stale_gap", "occupancy_divergence"):
            s = result["slopes"]
            e = (exact.get(task) or {}).get("alphas", {})

            def g(x: Any) -> str:
                return "-" if x is None else f"{x:.2f}"

            slopes += (
                f"| {task}, {metric.replace('_', ' ')} | {g(s.get(f'{task}/{metric}/teamtr'))} "
                f"| {g(s.get(f'{task}/{metric}/naive'))} | {g((e.get(f'{metric}_teamtr') or {}).get('value'))} "
                f"| {g((e.get(f'{metric}_naive') or {}).get('value'))} "
                f"| {PAPER_ALPHA['teamtr'] if metric == 'stale_gap' else 1.05} / "
                f"{PAPER_ALPHA['naive'] if metric == 'stale_gap' else 1.91} |\n"
            )
    return head + "\n".join(lines) + "\n" + diag + slopes


def plot(result: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for task in sorted({r["task"] for r in result["rows"]}):
        for label, style in (("equal updates", "-o"), ("equal tokens", "--s")):
            pts = [
                (r["n"], r[f"diff {label}"])
                for r in result["rows"]
                if r["task"] == task and f"diff {label}" in r
            ]
            if not pts:
                continue
            ns = [p[0] for p in pts]
            mean = [100 * p[1]["mean"] for p in pts]
            err = [
                [100 * (p[1]["mean"] - p[1]["ci95"][0]) for p in pts],
                [100 * (p[1]["ci95"][1] - p[1]["mean"]) for p in pts],
            ]
            ax.errorbar(ns, mean, yerr=err, fmt=style, capsize=3, label=f"{task}, {label}")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("team size n")
    ax.set_ylabel("TeamTR - naive, held-out accuracy (points)")
    ax.set_title("accuracy gap vs n (95% paired bootstrap)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "accuracy_gap_vs_n.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for task in sorted({r["task"] for r in result["rows"]}):
        for arm, name, style in (("teamtr", "TeamTR", "-o"), ("naive_updates", "naive", "--s")):
            mine = [r for r in result["rows"] if r["task"] == task and (r.get(arm) or {}).get("stale_gap")]
            pts = [(r["n"], r[arm]["stale_gap"]) for r in mine]
            if pts:
                slope = result["slopes"].get(f"{task}/stale_gap/{'teamtr' if arm == 'teamtr' else 'naive'}")
                tag = f" (slope {slope:.2f})" if slope is not None else ""
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{task}, {name}{tag}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("team size n")
    ax.set_ylabel("stale gap per update (mean, i >= 2)")
    ax.set_title("stale gap vs n (log-log)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "stale_gap_vs_n.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
