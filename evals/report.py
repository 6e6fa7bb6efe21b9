"""How an evaluation is shown: a rich table for people at a terminal, matplotlib PNGs for reports."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from teamtr.evals.harness import EvalResult


def _fmt(est: dict) -> str:
    return f"{est['value']:.1%} [{est['low']:.1%}, {est['high']:.1%}]"


def result_table(result: EvalResult) -> Table:
    table = Table(
        title=f"{result.task}: {result.instances} instances x k={result.k} ({result.episodes} episodes)"
    )
    table.add_column("difficulty")
    table.add_column("instances", justify="right")
    table.add_column(f"pass@{result.k} [95% CI]", justify="right")
    table.add_column(f"avg@{result.k} [95% CI]", justify="right")
    for difficulty, row in result.by_difficulty.items():
        table.add_row(difficulty, str(row["instances"]), _fmt(row["pass_at_k"]), _fmt(row["avg_at_k"]))
    table.add_row("all", str(result.instances), _fmt(result.pass_at_k), _fmt(result.avg_at_k), style="bold")
    if result.k > 1 and result.majority_at_k:
        table.add_row(f"majority vote of {result.k}", "", "", _fmt(result.majority_at_k))
    if result.baseline:
        b = result.baseline
        table.caption = (
            f"single model, best-of-{b['n']} at ~{b['single_budget']:.0f} vs team {b['team_budget']:.0f} tokens: "
            f"best-of-N {_fmt(b['best_of_n'])}, majority {_fmt(b['majority_at_n'])}"
        )
    return table


def print_result(result: EvalResult, console: Console | None = None) -> None:
    (console or Console()).print(result_table(result))


def _ci_bar(ax, x: float, est: dict, color: str) -> None:
    """One estimate's 95% confidence interval as an error bar at x."""
    v = est["value"]
    ax.errorbar([x], [v], yerr=[[v - est["low"]], [est["high"] - v]], color=color, capsize=4, fmt="none")


def plot_result(result: EvalResult, out_dir: str | Path) -> list[Path]:
    """pass@j curve (team, and the single model when there is a baseline) and accuracy per difficulty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(5, 3.5))
    curve = {int(j): v for j, v in result.pass_at_k_curve.items()}
    (team_line,) = ax.plot(list(curve), list(curve.values()), marker="o", label="team: pass@j")
    # the estimates that carry a confidence interval (pass@k, best-of-n) get it as an error bar
    _ci_bar(ax, result.k, result.pass_at_k, team_line.get_color())
    if result.baseline:
        team_tokens = result.baseline["team_tokens_per_episode"]
        single = {int(j): v for j, v in result.baseline["pass_at_k_curve"].items()}
        # put the single model on the team's axis: j single samples cost j * single / team team episodes
        scale = result.baseline["single_tokens_per_sample"] / max(team_tokens, 1e-9)
        (single_line,) = ax.plot(
            [j * scale for j in single], list(single.values()), marker=".", label="single model: best-of-j"
        )
        _ci_bar(ax, result.baseline["n"] * scale, result.baseline["best_of_n"], single_line.get_color())
        ax.set_xlabel("token budget, in team episodes")
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("j (episodes per instance)")
    ax.set_ylabel("fraction solved (bar: 95% CI)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{result.task}")
    ax.legend()
    fig.tight_layout()
    written.append(out / "pass_at_k.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = list(result.by_difficulty)
    values = [result.by_difficulty[d]["pass_at_k"]["value"] for d in names]
    lows = [v - result.by_difficulty[d]["pass_at_k"]["low"] for d, v in zip(names, values, strict=True)]
    highs = [result.by_difficulty[d]["pass_at_k"]["high"] - v for d, v in zip(names, values, strict=True)]
    ax.bar(names, values, yerr=[lows, highs], capsize=4)
    ax.set_ylabel(f"pass@{result.k}")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{result.task} by difficulty")
    ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    written.append(out / "by_difficulty.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written
