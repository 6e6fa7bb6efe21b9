"""The scaling study (docs/theory.md): how the price of stale rollouts grows with the team size n.

For every n and seed: one team of the chosen family (`chain_instance` or `convention_instance`, two rounds
of round-robin turns, warm-started),
trained from the same initial team for `stages` stages under each schedule through the shared stage loop.
Measured exactly, per stage, then averaged over the stages:

  stale gap              sum_i |L_i^used - (J(pi^i) - J(pi^(i-1)))|: what the surrogate each update
                         optimised promised vs what the update really did (joint: |sum_i L_i - dJ_stage|)
  occupancy divergence   sum_i ||rho_j^(pi^i) - rho_j^(data_i)||_1: the contexts agent j acts on after its
                         update vs the contexts it was trained on (rho_j = its d-weighted context distribution)
  return                 J after the last stage; per n also TeamTR's minus naive's, paired by seed
  left region            stability: fraction of updates whose exact KL on the contexts the agent really
                         acts on (pi^(i-1)'s) exceeds delta; and the largest such KL / delta

alpha = slope of the least-squares fit of log(metric) on log(n) over all (n, seed) points; the 95%
interval is slope +- t_{0.975, dof} * stderr (scipy.stats.linregress).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from teamtr.theory.env import (
    TeamInstance,
    chain_instance,
    chain_warm_logits,
    convention_instance,
    convention_warm_logits,
    relay_instance,
    relay_warm_logits,
)
from teamtr.theory.exact import Logits
from teamtr.theory.team import TabularTeam, train
from teamtr.training.stage import ScheduleConfig, ScheduleKind, StageRecord

SCHEDULES: tuple[ScheduleKind, ...] = ("naive", "teamtr", "joint", "importance_weighting")
FAMILIES = ("chain", "convention", "relay")
FITTED_METRICS = ("stale_gap", "occupancy_divergence")


@dataclass
class ScalingConfig:
    agents: list[int] = field(default_factory=lambda: list(range(2, 9)))  # n = 2..8, as in the paper
    # chain: a dominant best message per turn; convention: it depends on the team; relay: the twin of the
    # LLM blind relay (tasks/relay.py): only agent 0 holds the value, the others copy or correct
    family: str = "chain"
    seeds: int = 5
    stages: int = 3  # K
    delta: float = 0.01  # per-message KL radius (the paper's default)
    rounds: int = 2  # each agent speaks `rounds` times per episode (T = rounds * n)
    messages: int = 3
    flavours: int = 2
    competence: float = 4.0  # warm start: logit bonus of the message that keeps the chain intact
    conventions: int = 3  # convention family: conventions C (the offset lives in Z_C)
    legibility: float = 0.0  # convention / relay: probability that a role can read the offset
    slip: float = 4.0  # convention family: agent 0's logit bonus on switching (~half the time at 4)
    noise: float = 0.5  # std of the random initial logits
    relay_values: int = 10  # relay: the value is a digit
    relay_slip: float = 0.6  # relay: agent 0's probability of writing true + 1
    relay_correction: float = 0.3  # relay: blind agents' corrections (value - 1) per episode, in total
    relay_stray: float = 0.02  # relay: probability mass per turn on every other message
    relay_first_stray: float | None = None  # relay: agent 0's (None: relay_stray)
    iw_agents: int = 5  # the importance-weighting ablation's team size (paper: n = 5)
    iw_deltas: list[float] = field(default_factory=lambda: [0.01, 0.1, 0.5])
    iw_competence: float = 0.0  # the ablation starts from a cold team: updates move probability a lot

    def __post_init__(self) -> None:
        if len(self.agents) < 2 or min(self.agents) < 2:
            raise ValueError("need at least two team sizes, each >= 2, to fit an exponent")
        if self.seeds < 1 or self.stages < 1 or self.delta <= 0 or self.rounds < 1:
            raise ValueError("seeds, stages, rounds must be >= 1 and delta > 0")
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")


@dataclass
class RunMetrics:
    n: int
    seed: int
    schedule: str
    stale_gap: float
    occupancy_divergence: float
    return_initial: float
    return_final: float
    left_region: float
    max_kl_ratio: float


def _stage_gap(stage: StageRecord) -> float:
    if stage.updates and stage.updates[0].data == "joint":
        return abs(sum(u.surrogate_used for u in stage.updates) - stage.updates[0].improvement)
    return sum(abs(u.surrogate_used - u.improvement) for u in stage.updates)


def make_team(cfg: ScalingConfig, n: int, seed: int, competence: float) -> tuple[TeamInstance, Logits]:
    """The (n, seed) team of cfg.family and its warm start: the same for every schedule."""
    rng = np.random.default_rng([n, seed])
    if cfg.family == "relay":
        instance = relay_instance(n, rounds=cfg.rounds, values=cfg.relay_values, legibility=cfg.legibility)
        per_turn = cfg.relay_correction / (cfg.rounds * (n - 1))  # as tasks/relay.py draws them
        logits = relay_warm_logits(
            instance, rng, cfg.relay_slip, per_turn, cfg.relay_stray, cfg.noise, cfg.relay_first_stray
        )
        return instance, logits
    if cfg.family == "convention":
        instance = convention_instance(
            n, rng, rounds=cfg.rounds, conventions=cfg.conventions, legibility=cfg.legibility
        )
        return instance, convention_warm_logits(instance, rng, competence, cfg.slip, cfg.noise)
    instance = chain_instance(n, rng, rounds=cfg.rounds, n_messages=cfg.messages, flavours=cfg.flavours)
    return instance, chain_warm_logits(instance, rng, competence, cfg.noise)


def run_one(
    cfg: ScalingConfig,
    n: int,
    seed: int,
    schedule: ScheduleKind,
    delta: float | None = None,
    competence: float | None = None,
) -> tuple[RunMetrics, list[StageRecord]]:
    competence = cfg.competence if competence is None else competence
    instance, logits = make_team(cfg, n, seed, competence)
    team = TabularTeam(instance, logits, delta or cfg.delta)
    j0 = team.evaluation().J
    stages = train(team, ScheduleConfig(kind=schedule), cfg.stages, seed)
    updates = [u for s in stages for u in s.updates]
    radius = delta or cfg.delta
    metrics = RunMetrics(
        n=n,
        seed=seed,
        schedule=schedule,
        stale_gap=float(np.mean([_stage_gap(s) for s in stages])),
        occupancy_divergence=float(np.mean([sum(u.context_divergence for u in s.updates) for s in stages])),
        return_initial=j0,
        return_final=team.evaluation().J,
        left_region=float(np.mean([u.kl_intermediate > radius * (1 + 1e-6) for u in updates])),
        max_kl_ratio=float(max(u.kl_intermediate for u in updates) / radius),
    )
    return metrics, stages


def paired_return_gap(runs: list[RunMetrics], n: int) -> dict[str, Any]:
    """TeamTR's final return minus naive's at team size n, paired by seed (same team, same warm start):
    mean, 95% normal half-width, and how many seeds TeamTR is ahead in (by more than 1e-4)."""
    naive = {r.seed: r.return_final for r in runs if r.n == n and r.schedule == "naive"}
    diffs = np.array([r.return_final - naive[r.seed] for r in runs if r.n == n and r.schedule == "teamtr"])
    half = float(1.96 * diffs.std(ddof=1) / np.sqrt(len(diffs))) if len(diffs) > 1 else math.nan
    ahead = int((diffs > 1e-4).sum())
    return {"mean": float(diffs.mean()), "ci95_half": half, "ahead": ahead, "seeds": len(diffs)}


def fit_exponent(ns: list[float], values: list[float]) -> dict[str, Any]:
    """log-log least squares with a 95% confidence interval on the slope."""
    x, y = np.log(np.asarray(ns, float)), np.log(np.maximum(np.asarray(values, float), 1e-300))
    fit = stats.linregress(x, y)
    dof = len(x) - 2
    half = float(stats.t.ppf(0.975, dof) * fit.stderr) if dof > 0 else math.inf
    return {
        "value": float(fit.slope),
        "ci95": [float(fit.slope - half), float(fit.slope + half)],
        "intercept": float(fit.intercept),
        "r2": float(fit.rvalue**2),
        "points": len(x),
    }


def run_scaling(cfg: ScalingConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    runs: list[RunMetrics] = []
    for n in cfg.agents:
        for schedule in SCHEDULES:
            for seed in range(cfg.seeds):
                runs.append(run_one(cfg, n, seed, schedule)[0])
            if progress:
                progress(f"n={n} {schedule}")

    table = []
    for n in cfg.agents:
        row: dict[str, Any] = {"n": n}
        for schedule in SCHEDULES:
            mine = [r for r in runs if r.n == n and r.schedule == schedule]
            for key in ("stale_gap", "occupancy_divergence", "return_final", "left_region", "max_kl_ratio"):
                row[f"{key}_{schedule}"] = float(np.mean([getattr(r, key) for r in mine]))
            row["return_initial"] = float(np.mean([r.return_initial for r in mine]))
        row["return_gap"] = paired_return_gap(runs, n)
        table.append(row)

    alphas: dict[str, dict[str, Any]] = {}
    for schedule in ("naive", "teamtr"):
        mine = [r for r in runs if r.schedule == schedule]
        for metric in FITTED_METRICS:
            alphas[f"{metric}_{schedule}"] = fit_exponent(
                [r.n for r in mine], [getattr(r, metric) for r in mine]
            )

    iw = importance_weighting_ablation(cfg)
    return {
        "alpha_naive": {**alphas["stale_gap_naive"], "metric": "stale_gap"},
        "alpha_teamtr": {**alphas["stale_gap_teamtr"], "metric": "stale_gap"},
        "alphas": alphas,
        "paper": {
            "alpha_naive": {"stale_gap": 1.94, "occupancy_divergence": 1.91},
            "alpha_teamtr": {"stale_gap": 1.07, "occupancy_divergence": 1.05},
            "stale_gap_n8": {"naive": 1.89, "teamtr": 0.15},
            "return_n8": {"naive": 58.7, "teamtr": 87.9},
            "ess_fraction_n5": {"2": 0.42, "5": 0.04},
        },
        "table": table,
        "importance_weighting": iw,
        "runs": [asdict(r) for r in runs],
        "config": asdict(cfg),
        "seconds": time.perf_counter() - started,
    }


def importance_weighting_ablation(cfg: ScalingConfig) -> dict[str, Any]:
    """ESS/B of whole-episode weights from the stage-start batch towards pi^(i-1), by update index i,
    for an n = cfg.iw_agents team trained with the importance_weighting schedule (mean over stages, seeds)."""
    out: dict[str, Any] = {"n": cfg.iw_agents, "competence": cfg.iw_competence, "by_delta": {}}
    for delta in cfg.iw_deltas:
        by_index: dict[int, list[float]] = {}
        for seed in range(cfg.seeds):
            _m, stages = run_one(cfg, cfg.iw_agents, seed, "importance_weighting", delta, cfg.iw_competence)
            for stage in stages:
                for u in stage.updates:
                    by_index.setdefault(u.index, []).append(u.ess_fraction)
        out["by_delta"][str(delta)] = {str(i): float(np.mean(v)) for i, v in sorted(by_index.items())}
    return out


def plot_scaling(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    runs = result["runs"]
    colours = {"naive": "tab:red", "teamtr": "tab:blue"}
    for ax, metric, title in zip(
        axes[:2], FITTED_METRICS, ("stale gap", "occupancy divergence"), strict=True
    ):
        for schedule, colour in colours.items():
            mine = [r for r in runs if r["schedule"] == schedule]
            ns = np.array([r["n"] for r in mine])
            ax.scatter(ns, [r[metric] for r in mine], s=12, alpha=0.5, color=colour)
            fit = result["alphas"][f"{metric}_{schedule}"]
            grid = np.linspace(ns.min(), ns.max(), 50)
            lo, hi = fit["ci95"]
            ax.plot(
                grid,
                np.exp(fit["intercept"]) * grid ** fit["value"],
                color=colour,
                label=f"{schedule}: alpha={fit['value']:.2f} [{lo:.2f}, {hi:.2f}]",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["n"] for r in runs}))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("agents n")
        ax.set_title(f"{title} per stage (exact)")
        ax.legend()
    ax = axes[2]
    for delta, by_index in result["importance_weighting"]["by_delta"].items():
        ax.plot([int(i) for i in by_index], list(by_index.values()), marker="o", label=f"delta={delta}")
    ax.plot([2, 5], [0.42, 0.04], "k--", marker="x", label="paper (LLM, n=5)")
    ax.set_xlabel("update index i in the stage")
    ax.set_ylabel("ESS / B")
    ax.set_ylim(0, 1.05)
    ax.set_title(
        f"importance weights of the stale batch (cold team, n={result['importance_weighting']['n']})"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_metrics(result: dict[str, Any], path: Path) -> Path:
    """One JSON line per (n, seed, schedule) run, then one line with the fits and the ablation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for run in result["runs"]:
            f.write(json.dumps({"kind": "run", **run}) + "\n")
        summary = {k: result[k] for k in ("alphas", "importance_weighting", "config", "seconds")}
        f.write(json.dumps({"kind": "summary", **summary}) + "\n")
    return path
