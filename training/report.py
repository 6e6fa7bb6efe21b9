"""`teamtr report RUN_DIR [RUN_DIR...]`: PNG plots of what happened in one or several runs.

return_per_stage.png        held-out team return at the start (stage 0) and after every stage (runs overlaid),
                            with +-1 binomial standard error bars
kl_per_update.png           d_hat of every update against delta (rejected updates marked)
certificate_vs_improvement.png  stage certificate vs realised improvement (+ rank correlation)
stale_gap.png               stale gap by update index i within the stage (i >= 2)
test_accuracy.png           (the demo's) test accuracy before and after training, +-1 standard error

Every figure's footer names each run's base weights by sha256 (a figure reproduces from the same weights).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from teamtr.graphs.run_layout import read_metrics  # noqa: E402
from teamtr.training.certificate import rank_correlation  # noqa: E402
from teamtr.training.warmstart.shipped import weights_digest  # noqa: E402


def _save(fig, path: Path, footer: str, bottom: float = 0.0) -> Path:
    """Every report figure ends the same way: laid out (above `bottom`, a caption's room, and the footer),
    the weights' digests in the footer, written as a PNG, closed."""
    low = max(bottom, 0.04 if footer else 0.0)
    fig.tight_layout(rect=(0, low, 1, 1) if low else None)
    if footer:
        fig.text(0.01, 0.01, footer, fontsize=6, color="gray")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_weights(run_dir: Path) -> str | None:
    """sha256 of the weights a run's default base was (config.yaml `team.model`), None when unknown."""
    try:
        model = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("team", {}).get("model")
    except (OSError, yaml.YAMLError):
        return None
    return weights_digest(model) if model else None


def binomial_se(p: float | None, n: int) -> float:
    return float("nan") if p is None else (p * (1 - p) / max(n, 1)) ** 0.5


def _label(run_dir: Path) -> str:
    return run_dir.name


def load_run(run_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    records = read_metrics(run_dir)
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        out[r["kind"]].append(r)
    return out


def write_report(
    run_dirs: list[str | Path],
    out_dir: str | Path | None = None,
    test_accuracy: dict[str, dict[str, Any]] | None = None,
) -> list[Path]:
    """Draw the four plots for the given runs into out_dir (default: the first run's report/), and with
    `test_accuracy` (label -> {"accuracy", "episodes"}, in order) the before/after test accuracies."""
    dirs = [Path(d) for d in run_dirs]
    for d in dirs:
        if not (d / "metrics.jsonl").exists():
            raise FileNotFoundError(f"{d} has no metrics.jsonl: is it a run directory?")
    out = Path(out_dir) if out_dir else dirs[0] / "report"
    out.mkdir(parents=True, exist_ok=True)
    runs = {_label(d): load_run(d) for d in dirs}
    digests = {_label(d): run_weights(d) for d in dirs}
    named = [f"{name} {digest[:12]}" for name, digest in digests.items() if digest]
    footer = "weights sha256: " + ", ".join(named) if named else ""
    plots = [
        _return_per_stage(runs, out / "return_per_stage.png", footer),
        _kl_per_update(runs, out / "kl_per_update.png", footer),
        _certificate_vs_improvement(runs, out / "certificate_vs_improvement.png", footer),
        _stale_gap(runs, out / "stale_gap.png", footer),
    ]
    if test_accuracy:
        plots.append(_test_accuracy(test_accuracy, out / "test_accuracy.png", footer))
    return plots


def _return_per_stage(runs: dict, path: Path, footer: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in runs.items():
        first = [r for r in run["eval"] if r.get("stage") == 0][:1]
        episodes = int(first[0].get("episodes", 1)) if first else 1
        ys = [e.get("accuracy", e.get("eval_after")) for e in first + run["stage"]]
        se = [binomial_se(y, episodes) for y in ys]
        ys = [np.nan if y is None else y for y in ys]  # per-stage evaluation switched off
        ax.errorbar(range(len(ys)), ys, yerr=se, marker="o", capsize=3, label=f"{name} ({episodes} episodes)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("stages completed")
    ax.set_ylabel("held-out team return (accuracy)")
    ax.set_title("Team return per stage (bars: +-1 standard error)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path, footer)


def _test_accuracy(rows: dict[str, dict[str, Any]], path: Path, footer: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(rows)
    values = [rows[n]["accuracy"] for n in names]
    se = [binomial_se(rows[n]["accuracy"], rows[n]["episodes"]) for n in names]
    bars = ax.bar(names, values, yerr=se, capsize=5, color=["gray"] + ["tab:blue"] * (len(names) - 1))
    ax.bar_label(bars, labels=[f"{v:.1%}" for v in values], padding=8)
    episodes = sorted({rows[n]["episodes"] for n in names})
    ax.set_ylabel("team accuracy on held-out test tasks")
    ax.set_ylim(0, min(1.0, max(values) * 1.3 + 0.05))
    ax.set_title(f"Before and after training ({'/'.join(map(str, episodes))} test episodes; bars: +-1 SE)")
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path, footer)


def _kl_per_update(runs: dict, path: Path, footer: str) -> Path:
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
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("update")
    ax.set_ylabel("d_hat (the constrained KL estimate, k3 or k1)")
    ax.set_title("Per-agent KL trust region")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path, footer)


def _certificate_vs_improvement(runs: dict, path: Path, footer: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4.6))
    stages = 0
    for name, run in runs.items():
        measured = [s for s in run["stage"] if s.get("realised_improvement") is not None]
        xs = [s["certificate"] for s in measured]
        ys = [s["realised_improvement"] for s in measured]
        n = run["eval"][0].get("episodes", 0) if run.get("eval") else 0
        # each improvement is the difference of two held-out returns: +-1 SE of that difference
        se = [
            (binomial_se(s.get("eval_before"), n) ** 2 + binomial_se(s.get("eval_after"), n) ** 2) ** 0.5
            for s in measured
        ]
        rho = rank_correlation(xs, ys) if xs else None
        tag = f" (Spearman {rho:.2f})" if rho is not None else ""
        if n and xs:
            ax.errorbar(xs, ys, yerr=se, fmt="o", capsize=3, label=name + tag)
        else:
            ax.scatter(xs, ys, label=name + tag)
        stages = max(stages, len(xs))
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xlabel("stage certificate C (held-out form; proxy without held-out episodes)")
    ax.set_ylabel("realised improvement (held-out return)")
    ax.set_title("Certificate vs realised improvement per stage (bars: +-1 SE)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    # a caption: a rank correlation over a few stages whose improvements sit within their noise says little
    fig.text(
        0.01,
        0.04,
        f"Spearman over {stages} stages. Where the improvements sit inside their error bars its sign can be\n"
        "noise: read it as prediction (or anti-prediction) only when the bars are clear of 0.",
        fontsize=7,
    )
    return _save(fig, path, footer, bottom=0.13)


def _stale_gap(runs: dict, path: Path, footer: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in runs.items():
        by_index: dict[int, list[float]] = defaultdict(list)
        for u in run["update"]:
            if u.get("stale_gap") is not None:
                by_index[u["index"]].append(u["stale_gap"])
        if by_index:
            idx = sorted(by_index)
            means = [float(np.mean(by_index[i])) for i in idx]
            # +-1 SE over the stages measured at each index; points, not a line: the indices are categories
            se = [
                float(np.std(by_index[i], ddof=1) / len(by_index[i]) ** 0.5) if len(by_index[i]) > 1 else 0.0
                for i in idx
            ]
            counts = "/".join(str(len(by_index[i])) for i in idx)
            ax.errorbar(idx, means, yerr=se, fmt="o", capsize=3, label=f"{name} (stages per index: {counts})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("update index i within the stage")
    ax.set_ylabel("stale gap |L_hat(stage-start) - L_hat(fresh)|")
    ax.set_title("Stale gap per update index (mean over stages; bars: +-1 SE)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no stale-gap measurements\n(schedule.diagnose_stale_gap off)", ha="center",
                va="center", transform=ax.transAxes)  # fmt: skip
    return _save(fig, path, footer)
