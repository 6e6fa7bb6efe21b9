"""`teamtr demo`: the warm-started chain team, evaluated, trained with TeamTR, evaluated again, reported.

teamtr demo --out runs/demo                       summary.json, report/*.png, the run directory
teamtr demo --warm-seeds 3 --out DIR              the demo once per warm-start seed (a differently built
                                                  warm model each): seeds.json with every gain and its spread
teamtr demo --compare --seeds 3 --out DIR         compare.json: warm start vs TeamTR vs naive sequential,
                                                  naive given the same rollout-token budget as TeamTR

Which tasks decide what: training prompts come from `task.train_seed`; the per-stage held-out returns
(`eval.stage_episodes`, `task.eval_seed`) are the validation set that picks the stage whose adapters the
demo keeps (the last stage whose return is within noise of the best one); the accuracies reported before
and after are on `eval.final_episodes` test tasks of another seed (DEMO_TEST_SEED), never used to choose
among stages. They are used for one veto: when the chosen stage's test accuracy is below the warm start's
beyond noise (`worse_beyond_noise`), no stage is kept (the warm start is what to serve) and the demo
says so.

The warm model is the one shipped in the package (training/warmstart/shipped.py: the same weights on
every machine); summary.json and the plots record its sha256.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.graphs.run_layout import read_metrics, versions_after_stage
from teamtr.graphs.team import derive_seed
from teamtr.training.config import TrainConfig
from teamtr.training.progress import RichCallbacks, TrainingProgress, progress_bars
from teamtr.training.run_dir import RunDir, model_path
from teamtr.training.stage_safety import worse_beyond_noise
from teamtr.training.trainer import Trainer, held_out_return
from teamtr.training.warmstart.shipped import SHIPPED_DIR, weights_digest

# the final test tasks' generator seed: disjoint from task.eval_seed's stage evaluations, which choose
# the kept stage, and from task.train_seed's training prompts
DEMO_TEST_SEED = 3_000_017

# The demo's settings (examples/demo.yaml holds the same): sized so that the whole demo, warm start
# included, stays within 10 minutes on a 2-core CPU machine. The warm model (shipped for this config:
# training/warmstart/shipped.py) was built until its greedy
# team accuracy reached 45% (or for its 600-step budget, keeping the best checkpoint): the gain depends
# on the warm start, and how these settings were chosen is in benchmarks/results/trainer_check/README.md,
# "History".
DEMO_CONFIG: dict[str, Any] = {
    "seed": 0,
    "stages": 8,
    "team": {"warm_start": {"stop_accuracy": 0.45}},
    "rollout": {"prompts_per_update": 16, "group_size": 8, "temperature": 1.0},
    "optim": {"lr": 3e-3, "epochs": 2, "minibatch_messages": 64},
    "trust_region": {"delta": 0.02},
    "eval": {"stage_episodes": 128, "final_episodes": 300, "temperature": 0.0},
}


def demo_config(base_config: Path | None, **overrides: Any) -> TrainConfig:
    cfg = TrainConfig.from_yaml(base_config) if base_config else TrainConfig.from_dict(DEMO_CONFIG)
    return cfg.with_overrides(overrides)


def demo_model(cfg: TrainConfig, warm_seed: int | None = None) -> str:
    """`team.model`, else the task's cached warm-started model built with `team.warm_start` (as
    training/run_dir.py `model_path`), its seed replaced by `warm_seed` when one is given."""
    if warm_seed is not None and not cfg.team.model:
        cfg = cfg.with_overrides({"team.warm_start": {**cfg.team.warm_start, "seed": warm_seed}})
    return model_path(cfg, progress=True)


def final_accuracy(engine: EmbeddedEngine, run: RunDir) -> dict[str, Any]:
    """Team accuracy on `eval.final_episodes` test tasks (DEMO_TEST_SEED) with the engine's adapters."""
    cfg = run.config
    task = run.task()
    tasks = task.generate(cfg.eval.final_episodes, seed=DEMO_TEST_SEED)
    team = run.team(run.roles, engine, temperature=cfg.eval.temperature, name="eval")
    return held_out_return(team, task, tasks, seed=derive_seed(cfg.seed, "final-eval"))


def warm_start_accuracy(cfg: TrainConfig) -> dict[str, Any]:
    """The team before training (fresh LoRA adapters: B = 0, the warm-started model itself), in the run
    directory the training then uses."""
    run = RunDir.create(cfg)
    return final_accuracy(run.engine("fresh"), run)


def stage_returns(run_dir: Path | str) -> dict[str, Any]:
    """The held-out (validation) return at the start (stage 0) and after each stage, each with its binomial
    standard error, the stages whose change is below -2 standard errors of a difference (a loss beyond
    the noise), the stages below the best earlier return by more than that (a slow decline, each step
    within the noise, shows only there), the best stage (the first with the highest return; 0 = the
    warm start) and the stage to keep (the last one not below the best beyond noise)."""
    stages = read_metrics(Path(run_dir), kind="stage")
    if not stages or stages[0].get("eval_before") is None:
        return {"returns": [], "se": [], "best": len(stages), "kept": len(stages), "losses_beyond_noise": [],
                "below_best_beyond_noise": []}  # fmt: skip
    returns = [stages[0]["eval_before"]] + [s["eval_after"] for s in stages]
    episodes = max(read_metrics(Path(run_dir), kind="eval")[0].get("episodes", 1), 1)
    se = [(p * (1 - p) / episodes) ** 0.5 for p in returns]

    def beyond_noise(drop_from: int, k: int) -> bool:
        return returns[drop_from] - returns[k] > 2 * (se[drop_from] ** 2 + se[k] ** 2) ** 0.5

    losses = [k for k in range(1, len(returns)) if beyond_noise(k - 1, k)]
    below_best = [k for k in range(1, len(returns)) if beyond_noise(returns.index(max(returns[:k])), k)]
    best = returns.index(max(returns))
    return {
        "returns": returns,
        "se": se,
        "best": best,
        # the most trained stage whose return is within the noise of the best one: the validation peak
        # of 128 episodes is often one of several returns within 2 standard errors (selected by noise)
        "kept": max(k for k in range(len(returns)) if not beyond_noise(best, k)),
        "losses_beyond_noise": losses,
        "below_best_beyond_noise": below_best,
    }


def train_and_evaluate(
    cfg: TrainConfig, callbacks: TrainingProgress | None = None, keep_best: bool = False
) -> dict[str, Any]:
    """Train, then the test accuracy of the last stage's adapters, or with `keep_best` of the stage that
    `stage_returns` keeps by the stage evaluations (and of the last stage's too when they differ)."""
    t0 = time.perf_counter()
    trainer = Trainer(cfg, callbacks)
    summary = trainer.train()
    run = RunDir(cfg.run_dir)
    last = final_accuracy(trainer.engine, run)
    stages = stage_returns(cfg.run_dir)
    kept = stages["kept"] if keep_best else summary["stages"]
    after = last
    if kept != summary["stages"]:
        versions = versions_after_stage(cfg.run_dir, kept)
        after = final_accuracy(run.engine(version=versions, threads=cfg.torch_threads), run)
    return {
        "summary": summary,
        "after": after,
        "last": last,
        "kept_stage": kept,
        "stages": stages,
        "seconds": time.perf_counter() - t0,
        "run_dir": cfg.run_dir,
    }


def run_demo(
    out: Path,
    base_config: Path | None = None,
    console: Console | None = None,
    warm_seed: int | None = None,
    keep_best: bool = True,
) -> dict[str, Any]:
    from teamtr.training.report import write_report

    console = console or Console()
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    cfg = demo_config(base_config, run_dir=str(run_dir))
    model = demo_model(cfg, warm_seed)  # builds (or reuses) the cached warm-started model
    cfg = cfg.with_overrides({"team.model": model})
    console.print(f"warm-started model: {model}")
    before = warm_start_accuracy(cfg)
    console.print(
        f"warm start: held-out team accuracy {before['accuracy']:.1%} ({before['episodes']} episodes)"
    )
    with progress_bars() as progress:
        result = train_and_evaluate(cfg, RichCallbacks(progress, roles_per_stage=0), keep_best=keep_best)
    selected, after = result["kept_stage"], result["after"]
    vetoed = selected != 0 and worse_beyond_noise(before, after)
    kept = 0 if vetoed else selected
    plots = write_report([run_dir], out / "report", test_accuracy={"warm start": before, **_stage_rows(result)})
    weights = weights_digest(model)
    summary = {
        "warm_seed": cfg.team.warm_start.get("seed", 0) if warm_seed is None else warm_seed,
        "model": model,
        # the warm model's weights: figures reproduce from the same digest (the shipped model's)
        "weights_sha256": weights,
        "weights_shipped": Path(model).resolve().is_relative_to(SHIPPED_DIR),
        "accuracy_before": before["accuracy"],
        "accuracy_before_se": _se(before),
        "accuracy_after": before["accuracy"] if vetoed else after["accuracy"],
        "accuracy_after_se": _se(before if vetoed else after),
        "improvement": 0.0 if vetoed else after["accuracy"] - before["accuracy"],
        "episodes_evaluated": after["episodes"],
        # the adapters kept: those after `kept_stage` stages (0: the warm start, no stage kept)
        "kept_stage": kept,
        # the stage the validation returns chose, its test accuracy, and why it was not kept
        "selected_stage": selected,
        "accuracy_selected_stage": after["accuracy"],
        "no_stage_kept_because": (
            f"stage {selected}'s test accuracy {after['accuracy']:.1%} is below the warm start's "
            f"{before['accuracy']:.1%} by more than 2 standard errors"
            if vetoed
            else None
        ),
        "accuracy_last_stage": result["last"]["accuracy"],
        "stage_returns": result["stages"]["returns"],
        "stage_return_se": result["stages"]["se"],
        "stages_losing_beyond_noise": result["stages"]["losses_beyond_noise"],
        "stages_below_best_beyond_noise": result["stages"]["below_best_beyond_noise"],
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
    console.print(result_table(before, after, result["last"], selected, summary["stages"], vetoed))
    console.print(
        f"{after['episodes']} held-out episodes each; {summary['seconds']:.0f} s in all; warm model "
        f"{'shipped' if summary['weights_shipped'] else 'built here'}, weights sha256 {str(weights)[:12]}"
    )
    if vetoed:
        console.print(f"no stage kept: {summary['no_stage_kept_because']}; serve the warm start")
    if summary["stages_below_best_beyond_noise"]:
        console.print(
            f"validation return fell beyond its noise below the best earlier stage after stages "
            f"{summary['stages_below_best_beyond_noise']}; kept: stage {kept}"
        )
    console.print(
        f"summary: {out / 'summary.json'}\nplots: {out / 'report'}\nrun (metrics, adapters): {run_dir}"
    )
    stage_flag = "" if kept == summary["stages"] else f" --stage {kept}"
    console.print(f"serve the team reported above: teamtr serve {run_dir}{stage_flag}")
    return summary


def result_table(
    before: dict[str, Any], after: dict[str, Any], last: dict[str, Any], selected: int, stages: int, vetoed: bool
) -> Table:
    """The demo's final table: the warm start, the stage chosen (named, with whether it is the one kept)
    and, when another, the last stage; the kept row is marked, as README's Serve section says it prints."""
    table = Table(title="TeamTR demo: chain arithmetic, 3 roles (held-out tasks)")
    table.add_column("team")
    table.add_column("accuracy", justify="right")
    table.add_row("warm start" + (" (kept: no stage beat it)" if vetoed else ""), f"{before['accuracy']:.1%}")
    verdict = "chosen, not kept" if vetoed else "kept"
    table.add_row(f"after TeamTR: stage {selected} of {stages} ({verdict})", f"{after['accuracy']:.1%}")
    if selected != stages:
        table.add_row(f"after the last stage ({stages} of {stages})", f"{last['accuracy']:.1%}")
    return table


def _se(acc: dict[str, Any]) -> float:
    p = acc["accuracy"]
    return (p * (1 - p) / max(acc["episodes"], 1)) ** 0.5


def _stage_rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The test accuracies after training for the report's plot: the chosen stage, and the last one."""
    last = result["summary"]["stages"]
    rows = {f"stage {result['kept_stage']} (chosen)": result["after"]}
    if result["kept_stage"] != last:
        rows[f"stage {last} (last)"] = result["last"]
    return rows


def _mean_std(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def run_demo_seeds(
    out: Path, warm_seeds: int = 3, base_config: Path | None = None, console: Console | None = None
) -> dict[str, Any]:
    """The demo once per warm-start seed 0..warm_seeds-1 (out/warm-seed<s>); seeds.json: every seed's
    summary, the mean and std of each accuracy and gain, the smallest gain."""
    console = console or Console()
    out.mkdir(parents=True, exist_ok=True)
    per_seed = [
        run_demo(out / f"warm-seed{s}", base_config=base_config, console=console, warm_seed=s)
        for s in range(warm_seeds)
    ]
    result = {
        "per_seed": per_seed,
        **{
            k: _mean_std([r[k] for r in per_seed])
            for k in ("accuracy_before", "accuracy_after", "improvement", "seconds")
        },
        "min_improvement": min(r["improvement"] for r in per_seed),
    }
    (out / "seeds.json").write_text(json.dumps(result, indent=1))
    table = Table(title=f"TeamTR demo over {warm_seeds} warm-start seeds (test tasks)")
    for col in ("warm seed", "warm start", "after", "gain", "kept stage", "seconds"):
        table.add_column(col)
    for r in per_seed:
        table.add_row(
            str(r["warm_seed"]), f"{r['accuracy_before']:.1%}", f"{r['accuracy_after']:.1%}",
            f"{100 * r['improvement']:+.1f}", f"{r['kept_stage']}/{r['stages']}", f"{r['seconds']:.0f}",
        )  # fmt: skip
    console.print(table)
    imp = result["improvement"]
    console.print(
        f"gain {100 * imp['mean']:+.1f} +- {100 * imp['std']:.1f} points; seeds.json: {out / 'seeds.json'}"
    )
    return result


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
