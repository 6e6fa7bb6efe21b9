"""`teamtr report RUN_DIR [RUN_DIR...]`: PNG plots of what happened in one or several runs.

return_per_stage.png        held-out team return before stage 0 and after every stage (runs overlaid)
kl_per_update.png           d_hat of every update against delta (rejected updates marked)
certificate_vs_improvement.png  stage certificate vs realised improvement (+ rank correlation)
stale_gap.png               stale gap by update index i within the stage (i >= 2)
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from teamtr.training.certificate import rank_correlation  # noqa: E402
from teamtr.training.metrics import read_metrics  # noqa: E402


def _save(fig, path: Path) -> Path:
    """Every report figure ends the same way: laid out, written as a PNG, closed."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _label(run_dir: Path) -> str:
    return run_dir.name


def load_run(run_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    records = read_metrics(run_dir)
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        out[r["kind"]].append(r)
    return out


def write_report(run_dirs: list[str | Path], out_dir: str | Path | None = None) -> list[Path]:
    """Draw the four plots for the given runs into out_dir (default: the first run's report/)."""
    dirs = [Path(d) for d in run_dirs]
    for d in dirs:
        if not (d / "metrics.jsonl").exists():
            raise FileNotFoundError(f"{d} has no metrics.jsonl: is it a run directory?")
    out = Path(out_dir) if out_dir else dirs[0] / "report"
    out.mkdir(parents=True, exist_ok=True)
    runs = {_label(d): load_run(d) for d in dirs}
    return [
        _return_per_stage(runs, out / "return_per_stage.png"),
        _kl_per_update(runs, out / "kl_per_update.png"),
        _certificate_vs_improvement(runs, out / "certificate_vs_improvement.png"),
        _stale_gap(runs, out / "stale_gap.png"),
    ]


def _return_per_stage(runs: dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in runs.items():
        evals = [r for r in run["eval"] if r.get("stage") == -1][:1] + run["stage"]
        ys = [e.get("accuracy", e.get("eval_after")) for e in evals]
        ys = [np.nan if y is None else y for y in ys]  # per-stage evaluation switched off
        ax.plot(range(len(ys)), ys, marker="o", label=name)
    ax.set_xlabel("stages completed")
    ax.set_ylabel("held-out team return (accuracy)")
    ax.set_title("Team return per stage")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def _kl_per_update(runs: dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    delta = None
    for name, run in runs.items():
        ups = run["update"]
        steps = [u["step"] for u in ups]
        first = [u["attempts"][0]["d_hat"] if u["attempts"] else u["d_hat"] for u in ups]
        (line,) = ax.plot(steps, [u["d_hat"] for u in ups], marker=".", label=f"{name}: accepted d_hat")
        ax.scatter(
            steps, first, marker="x", color=line.get_color(), alpha=0.5, label=f"{name}: first attempt"
        )
        rejected = [u for u in ups if not u["accepted"]]
        if rejected:
            ax.scatter([u["step"] for u in rejected], [u["d_hat"] for u in rejected], marker="s",
                       facecolors="none", edgecolors="red", label=f"{name}: rejected")  # fmt: skip
        delta = ups[0]["delta"] if ups else delta
    if delta is not None:
        ax.axhline(delta, color="black", linestyle="--", label="delta")
    ax.set_xlabel("update")
    ax.set_ylabel("d_hat (the constrained KL estimate, k3 or k1)")
    ax.set_title("Per-agent KL trust region")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _certificate_vs_improvement(runs: dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in runs.items():
        measured = [s for s in run["stage"] if s.get("realised_improvement") is not None]
        xs = [s["certificate"] for s in measured]
        ys = [s["realised_improvement"] for s in measured]
        rho = rank_correlation(xs, ys) if xs else None
        tag = f" (Spearman {rho:.2f})" if rho is not None else ""
        ax.scatter(xs, ys, label=name + tag)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xlabel("stage certificate C (held-out form; proxy without held-out episodes)")
    ax.set_ylabel("realised improvement (held-out return)")
    ax.set_title("Certificate vs realised improvement")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _stale_gap(runs: dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in runs.items():
        by_index: dict[int, list[float]] = defaultdict(list)
        for u in run["update"]:
            if u.get("stale_gap") is not None:
                by_index[u["index"]].append(u["stale_gap"])
        if by_index:
            idx = sorted(by_index)
            ax.plot(idx, [float(np.mean(by_index[i])) for i in idx], marker="o", label=name)
    ax.set_xlabel("update index i within the stage")
    ax.set_ylabel("stale gap |L_hat(stage-start) - L_hat(fresh)|")
    ax.set_title("Stale gap per update index")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no stale-gap measurements\n(schedule.diagnose_stale_gap off)", ha="center",
                va="center", transform=ax.transAxes)  # fmt: skip
    return _save(fig, path)
