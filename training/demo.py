"""`teamtr demo`: the warm-started chain team, evaluated, trained with TeamTR, evaluated again, reported.

teamtr demo --out runs/demo                       summary.json, report/*.png, the run directory
teamtr demo --compare --seeds 3 --out DIR         compare.json: warm start vs TeamTR vs naive sequential,
                                                  naive given the same rollout-token budget as TeamTR
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from teamtr.graphs.team import derive_seed
from teamtr.serving.embedded import EmbeddedEngine
from teamtr.training.config import TrainConfig
from teamtr.training.progress import RichCallbacks, TrainingProgress, progress_bars
from teamtr.training.run_dir import RunDir, model_path
from teamtr.training.trainer import Trainer, held_out_return

# The demo's settings (examples/demo.yaml holds the same): chosen on this 2-core machine so that the
# whole demo, warm start included, stays within 10 minutes.
DEMO_CONFIG: dict[str, Any] = {
    "seed": 0,
    "stages": 8,
    "rollout": {"prompts_per_update": 16, "group_size": 8, "temperature": 1.0},
    "optim": {"lr": 3e-3, "epochs": 2, "minibatch_messages": 64},
    "trust_region": {"delta": 0.05},
    "eval": {"stage_episodes": 128, "final_episodes": 300, "temperature": 0.0},
}


def demo_config(base_config: Path | None, **overrides: Any) -> TrainConfig:
    cfg = TrainConfig.from_yaml(base_config) if base_config else TrainConfig.from_dict(DEMO_CONFIG)
    return cfg.with_overrides(overrides)


def final_accuracy(engine: EmbeddedEngine, run: RunDir) -> dict[str, Any]:
    """Team accuracy on `eval.final_episodes` held-out tasks with the engine's current adapters."""
    cfg = run.config
    task = run.task()
    tasks = task.generate(cfg.eval.final_episodes, seed=cfg.task.eval_seed)
    team = run.team(run.roles, engine, temperature=cfg.eval.temperature, name="eval")
    return held_out_return(team, task, tasks, seed=derive_seed(cfg.seed, "final-eval"))


def warm_start_accuracy(cfg: TrainConfig) -> dict[str, Any]:
    """The team before training (fresh LoRA adapters: B = 0, the warm-started model itself), in the run
    directory the training then uses."""
    run = RunDir.create(cfg)
    return final_accuracy(run.engine("fresh"), run)


def train_and_evaluate(cfg: TrainConfig, callbacks: TrainingProgress | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    trainer = Trainer(cfg, callbacks)
    summary = trainer.train()
    after = final_accuracy(trainer.engine, RunDir(cfg.run_dir))
    return {"summary": summary, "after": after, "seconds": time.perf_counter() - t0, "run_dir": cfg.run_dir}


def run_demo(out: Path, base_config: Path | None = None, console: Console | None = None) -> dict[str, Any]:
    from teamtr.training.report import write_report

    console = console or Console()
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    cfg = demo_config(base_config, run_dir=str(run_dir))
    model = model_path(cfg)  # builds (or reuses) the cached warm-started model
    cfg = cfg.with_overrides({"team.model": model})
    console.print(f"warm-started model: {model}")
    before = warm_start_accuracy(cfg)
    console.print(
        f"warm start: held-out team accuracy {before['accuracy']:.1%} ({before['episodes']} episodes)"
    )
    with progress_bars() as progress:
        result = train_and_evaluate(cfg, RichCallbacks(progress, roles_per_stage=0))
    after = result["after"]
    plots = write_report([run_dir], out / "report")
    summary = {
        "accuracy_before": before["accuracy"],
        "accuracy_after": after["accuracy"],
        "improvement": after["accuracy"] - before["accuracy"],
        "episodes_evaluated": after["episodes"],
        "eval_temperature": cfg.eval.temperature,
        "stages": result["summary"]["stages"],
        "updates": result["summary"]["updates"],
        "rollout_tokens": result["summary"]["train_tokens"],
        "certificate_rank_correlation": result["summary"]["certificate_rank_correlation"],
        "seconds": time.perf_counter() - t0,
        "run_dir": str(run_dir),
        "plots": [str(p) for p in plots],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    table = Table(title="TeamTR demo: chain arithmetic, 3 roles (held-out tasks)")
    table.add_column("team")
    table.add_column("accuracy", justify="right")
    table.add_row("warm start", f"{before['accuracy']:.1%}")
    table.add_row("after TeamTR", f"{after['accuracy']:.1%}")
    console.print(table)
    console.print(f"{after['episodes']} held-out episodes each; {summary['seconds']:.0f} s in all")
    console.print(
        f"summary: {out / 'summary.json'}\nplots: {out / 'report'}\nrun (metrics, adapters): {run_dir}"
    )
    return summary


def _mean_std(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def run_compare(
    out: Path, seeds: int = 3, base_config: Path | None = None, console: Console | None = None
) -> dict:
    """Warm start vs TeamTR vs naive sequential over `seeds` seeds; naive at TeamTR's rollout-token budget."""
    from teamtr.training.report import write_report

    console = console or Console()
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    cfg0 = demo_config(base_config)
    model = model_path(cfg0)
    per_seed: list[dict[str, Any]] = []
    for seed in range(seeds):
        cfg = cfg0.with_overrides(
            {"seed": seed, "team.model": model, "run_dir": str(out / f"teamtr-seed{seed}")}
        )
        warm = warm_start_accuracy(cfg)
        tr = train_and_evaluate(cfg)
        budget = tr["summary"]["train_tokens"]
        naive_cfg = cfg.with_overrides(
            {
                "run_dir": str(out / f"naive-seed{seed}"),
                "schedule.kind": "naive",
                "stages": cfg.stages * 10,  # the token budget ends the run
                "max_rollout_tokens": budget,
            }
        )
        nv = train_and_evaluate(naive_cfg)
        row = {
            "seed": seed,
            "warm_start": warm["accuracy"],
            "teamtr": tr["after"]["accuracy"],
            "naive": nv["after"]["accuracy"],
            "teamtr_rollout_tokens": tr["summary"]["train_tokens"],
            "naive_rollout_tokens": nv["summary"]["train_tokens"],
            "teamtr_stages": tr["summary"]["stages"],
            "naive_stages": nv["summary"]["stages"],
            "episodes_evaluated": warm["episodes"],
        }
        per_seed.append(row)
        console.print(
            f"seed {seed}: warm start {row['warm_start']:.1%}  TeamTR {row['teamtr']:.1%} "
            f"({row['teamtr_rollout_tokens']} tokens)  naive {row['naive']:.1%} ({row['naive_rollout_tokens']} tokens)"
        )
    result = {
        "per_seed": per_seed,
        **{k: _mean_std([r[k] for r in per_seed]) for k in ("warm_start", "teamtr", "naive")},
        "rollout_tokens": {
            "teamtr": _mean_std([r["teamtr_rollout_tokens"] for r in per_seed]),
            "naive": _mean_std([r["naive_rollout_tokens"] for r in per_seed]),
        },
        "eval_temperature": cfg0.eval.temperature,
        "seconds": time.perf_counter() - t0,
    }
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    write_report([out / f"teamtr-seed{s}" for s in range(seeds)] + [out / f"naive-seed{s}" for s in range(seeds)],
                 out / "report")  # fmt: skip
    table = Table(title=f"held-out team accuracy, mean +- std over {seeds} seeds")
    for col in ("team", "accuracy", "rollout tokens"):
        table.add_column(col)
    table.add_row(
        "warm start", f"{result['warm_start']['mean']:.1%} +- {result['warm_start']['std']:.1%}", "0"
    )
    for k in ("teamtr", "naive"):
        table.add_row(
            k,
            f"{result[k]['mean']:.1%} +- {result[k]['std']:.1%}",
            f"{result['rollout_tokens'][k]['mean']:.0f}",
        )
    console.print(table)
    console.print(f"compare.json: {out / 'compare.json'}")
    return result
