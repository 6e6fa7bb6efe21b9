"""`teamtr theory ...`: the exact theory lab (scaling study, bound checks)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

if TYPE_CHECKING:  # the theory lab (numpy, scipy, matplotlib) is imported when a command runs
    from teamtr.theory.bounds import CheckTally

app = typer.Typer(
    help="Exact theory lab: TeamTR's bounds and the n^2-vs-n scaling on exactly solvable teams.",
    no_args_is_help=True,
)


def _agents(spec: str) -> list[int]:
    try:
        if "-" in spec:
            lo, hi = (int(x) for x in spec.split("-"))
            return list(range(lo, hi + 1))
        return [int(x) for x in spec.split(",")]
    except ValueError:
        raise typer.BadParameter(f"agents must look like 2-8 or 2,4,8; got {spec!r}") from None


@app.command()
def scaling(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    seeds: int = typer.Option(5, "--seeds", min=1, help="Random teams per n."),
    stages: int = typer.Option(3, "--stages", min=1, help="Stages K per run."),
    agents: str = typer.Option("2-8", "--agents", help="Team sizes, e.g. 2-8 or 2,4,8."),
    delta: float = typer.Option(0.01, "--delta", min=1e-6, help="Per-message KL trust-region radius."),
    competence: float = typer.Option(
        4.0, "--competence", help="Warm start: logit bonus of the message that keeps the chain intact."
    ),
    rounds: int = typer.Option(2, "--rounds", min=1, help="Turns per agent per episode (T = rounds * n)."),
    family: str = typer.Option(
        "chain",
        "--family",
        help="chain (a dominant best message per turn), convention (depends on the team) or relay "
        "(the twin of the LLM blind relay task).",
    ),
    legibility: float = typer.Option(
        0.0, "--legibility", min=0.0, max=1.0, help="convention / relay: probability a role reads the offset."
    ),
    noise: float = typer.Option(0.5, "--noise", min=0.0, help="Std of the random warm-start logits."),
    out: Path = typer.Option(Path("runs/theory/scaling.png"), "--out", help="Where to write the figure."),
) -> None:
    """Stale gap and occupancy divergence vs n for naive sequential and TeamTR (exact), with exponents."""
    from teamtr.theory.scaling import ScalingConfig, plot_scaling, run_scaling, write_metrics

    try:
        cfg = ScalingConfig(
            agents=_agents(agents),
            seeds=seeds,
            stages=stages,
            delta=delta,
            competence=competence,
            rounds=rounds,
            family=family,
            legibility=legibility,
            noise=noise,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    console = Console(stderr=json_out)
    with Progress(console=console, transient=True, disable=json_out) as progress:
        task = progress.add_task("exact runs", total=len(cfg.agents) * 4)
        result = run_scaling(cfg, progress=lambda _msg: progress.advance(task))
    figure = plot_scaling(result, out)
    result["figure"] = str(figure)
    result["metrics"] = str(write_metrics(result, out.with_suffix(".jsonl")))
    if json_out:
        typer.echo(json.dumps(result))
        return
    _print_scaling(console, result)


def _print_scaling(console: Console, result: dict[str, Any]) -> None:
    cfg = result["config"]
    table = Table(
        title=f"Exact {cfg['family']} teams: mean of {cfg['seeds']} seeds, K={cfg['stages']} stages, delta={cfg['delta']}"
    )
    for col in (
        "n",
        "gap naive",
        "gap TeamTR",
        "div naive",
        "div TeamTR",
        "J0",
        "J_K naive",
        "J_K TeamTR",
        "J_K joint",
    ):
        table.add_column(col, justify="right")
    stability = Table(
        title="Stability: updates whose exact KL on the contexts acted on exceeds delta (max KL/delta)"
    )
    for col in ("n", "naive", "TeamTR", "joint", "IW"):
        stability.add_column(col, justify="right")
    for row in result["table"]:
        table.add_row(
            str(row["n"]),
            f"{row['stale_gap_naive']:.2e}",
            f"{row['stale_gap_teamtr']:.2e}",
            f"{row['occupancy_divergence_naive']:.3f}",
            f"{row['occupancy_divergence_teamtr']:.3f}",
            f"{row['return_initial']:.3f}",
            f"{row['return_final_naive']:.4f}",
            f"{row['return_final_teamtr']:.4f}",
            f"{row['return_final_joint']:.4f}",
        )
        stability.add_row(
            str(row["n"]),
            *(
                f"{row[f'left_region_{k}']:.0%} (x{row[f'max_kl_ratio_{k}']:.2f})"
                for k in ("naive", "teamtr", "joint", "importance_weighting")
            ),
        )
    console.print(table)
    console.print(stability)
    fits = Table(title="log-log exponents alpha (95% CI) vs the paper")
    for col in ("metric", "naive", "TeamTR", "paper naive", "paper TeamTR"):
        fits.add_column(col)
    paper = result["paper"]
    for metric in ("stale_gap", "occupancy_divergence"):
        cells = []
        for schedule in ("naive", "teamtr"):
            fit = result["alphas"][f"{metric}_{schedule}"]
            cells.append(f"{fit['value']:.2f} [{fit['ci95'][0]:.2f}, {fit['ci95'][1]:.2f}]")
        fits.add_row(metric, *cells, str(paper["alpha_naive"][metric]), str(paper["alpha_teamtr"][metric]))
    console.print(fits)
    iw = Table(
        title=f"Importance weighting without resampling: ESS/B by update index (n={result['importance_weighting']['n']}, cold team)"
    )
    by_delta = result["importance_weighting"]["by_delta"]
    indices = list(next(iter(by_delta.values())).keys())
    iw.add_column("delta")
    for i in indices:
        iw.add_column(f"i={i}", justify="right")
    for delta, values in by_delta.items():
        iw.add_row(delta, *(f"{values[i]:.3f}" for i in indices))
    iw.add_row("paper (LLM)", *("0.42" if i == "2" else "0.04" if i == "5" else "" for i in indices))
    console.print(iw)
    console.print(f"figure: {result['figure']}   metrics: {result['metrics']}   ({result['seconds']:.1f} s)")


@app.command()
def check(
    instances: int = typer.Option(1000, "--instances", min=1, help="Random teams to check."),
    seed: int = typer.Option(0, "--seed", help="Seed of the instance generator."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    c_scale: float = typer.Option(
        1.0, "--c-scale", help="Multiply every constant (try 0.1: the checks must fail)."
    ),
    power: float = typer.Option(
        0.5, "--power", help="Exponent of delta in the penalties (0.5 is sqrt; try 1)."
    ),
    speak_once: bool = typer.Option(
        False, "--speak-once", help="Only teams whose agents each speak once, in a fixed order."
    ),
    assume_speak_once: bool = typer.Option(
        False,
        "--assume-speak-once",
        help="Write the own-turn bounds with c_own = 0 on every team (wrong when an agent speaks twice).",
    ),
) -> None:
    """Check the occupancy-shift, Thm 3.4/3.6/3.7 (paper and own-turn forms) and Prop 3.3 bounds exactly."""
    import numpy as np

    from teamtr.theory.bounds import BOUND_NAMES, INFORMATIONAL, BoundForm, CheckTally
    from teamtr.theory.cases import check_case, random_case, speak_once_case

    started = time.perf_counter()
    form = BoundForm(c_scale=c_scale, power=power, assume_speak_once=assume_speak_once)
    make_case = speak_once_case if speak_once else random_case
    tally = CheckTally()
    console = Console(stderr=json_out)
    with Progress(console=console, transient=True, disable=json_out) as progress:
        task = progress.add_task("random teams", total=instances)
        for k in range(instances):
            tally.add(check_case(make_case(np.random.default_rng([seed, k])), form, seed=k))
            progress.advance(task)
    result = {
        "instances": instances,
        "violations": {name: tally.violations[name] for name in BOUND_NAMES},
        "checks": {name: tally.checks[name] for name in BOUND_NAMES},
        "worst_margin": {name: tally.worst_margin.get(name) for name in BOUND_NAMES},
        "max_used_fraction": {name: tally.max_used_fraction.get(name) for name in BOUND_NAMES},
        "informational": {
            name: {
                "checks": tally.checks[name],
                "violations": tally.violations[name],
                "max_used_fraction": tally.max_used_fraction.get(name),
            }
            for name in INFORMATIONAL
        },
        "form": {"c_scale": c_scale, "power": power, "assume_speak_once": assume_speak_once},
        "teams": "speak_once" if speak_once else "random",
        "seconds": time.perf_counter() - started,
    }
    if json_out:
        typer.echo(json.dumps(result))
        return
    teams = "speak-once" if speak_once else "random"
    table = Table(title=f"Exact bound checks on {instances} {teams} teams (lhs >= rhs; margin = lhs - rhs)")
    for col in ("bound", "checks", "violations", "worst margin", "max share of penalty used"):
        table.add_column(col, justify="right")
    for name in BOUND_NAMES:
        table.add_row(name, *_tally_cells(tally, name))
    for name in INFORMATIONAL:
        table.add_row(f"({name}, not a bound)", *_tally_cells(tally, name))
    console.print(table)
    console.print(f"({result['seconds']:.1f} s)")


def _tally_cells(tally: CheckTally, name: str) -> list[str]:
    return [
        str(tally.checks[name]),
        str(tally.violations[name]),
        f"{tally.worst_margin.get(name, float('nan')):.3g}",
        f"{tally.max_used_fraction.get(name, float('nan')):.3f}",
    ]
