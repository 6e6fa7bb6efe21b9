"""The team-size study: TeamTR vs naive sequential on LLM teams of n = 2, 4, 6 roles.

    .venv/bin/python benchmarks/team_size_study.py                       # the full study (docs/study.md)
    .venv/bin/python benchmarks/team_size_study.py --report-only         # tables and plots from the JSONL

For each task (`chain` with n + 1 operands, `convention` with n additions), each team size n and each seed:
the warm-started model of that task and size (training/warmstart, built once and cached), evaluated
greedily on the same held-out tasks before training (`warm`), then three runs from that same warm start,
with the same seed (so the same training prompts and the same evaluation tasks):

  teamtr          TeamTR with suffix resampling, `stages` stages
  naive_updates   naive sequential, the same number of stages (= updates: the paper's protocol); it also
                  samples a fresh batch after each update only to measure the stale gap (not trained on)
  naive_tokens    naive sequential until it has used TeamTR's rollout tokens (more stages)

Resumable: every finished cell (task, n, seed, arm) is one line of `cells.jsonl`, skipped on a rerun; a
cell interrupted mid-run resumes from its run directory's checkpoint (teamtr train's resume). The exact
lab's scaling study at the same sizes is one more cell (`exact`). `summary.json`, `table.md` and the two
PNGs are rewritten from the JSONL at the end of every run (docs/study.md reads them).

Statistics, table and figures: benchmarks/team_size_stats.py (bootstrap intervals over seeds and tasks,
TeamTR - naive paired by seed and task with a paired bootstrap interval and p-value, log-log slopes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module, also in spawned workers
from team_size_stats import ARMS, analyse, cell_key, plot, table_markdown  # noqa: E402


@dataclass
class StudyConfig:
    out: Path = Path("benchmarks/results/team_size_study")
    tasks: list[str] = field(default_factory=lambda: ["chain", "convention"])
    sizes: list[int] = field(default_factory=lambda: [2, 4, 6])
    seeds: int = 5
    stages: int = 2
    prompts: int = 8  # B
    group: int = 8  # G
    lr: float = 3e-3
    delta: float = 0.05
    epochs: int = 2
    eval_episodes: int = 400  # held-out tasks per evaluation: binomial 95% half-width <= 4.9 points
    model: str | None = None  # one base model for every cell (tests); None: each task and size's warm start
    exact_seeds: int = 5  # the exact lab's scaling study at the same sizes (0: skip)
    bootstrap: int = 4000
    workers: int = 2  # processes running (task, n, seed) groups side by side, one torch thread each


# ---- cells ----------------------------------------------------------------------------------------------


def read_cells(path: Path) -> dict[str, dict[str, Any]]:
    """Finished cells by key; a torn last line (a kill while writing) is ignored and rerun."""
    cells: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            cells[rec["key"]] = rec
    return cells


def append_cell(path: Path, record: dict[str, Any]) -> None:
    """One line per finished cell; workers append under an exclusive lock, so lines never interleave."""
    import fcntl

    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(record) + "\n")
        f.flush()


def record_config(out: Path, config: dict[str, Any]) -> None:
    """The study's design in `config.json`, written by its first invocation; a later one with other
    arguments (e.g. a subset of arms run beside it) is appended to `invocations.jsonl` instead, so
    config.json stays the design rather than the last command."""
    path = out / "config.json"
    text = json.dumps(config, default=str, indent=1)
    if not path.is_file():
        path.write_text(text)
    elif json.loads(path.read_text()) != json.loads(text):
        append_cell(out / "invocations.jsonl", {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), **json.loads(text)})


def warm_model(task: str, n: int, cfg: StudyConfig) -> str:
    if cfg.model:
        return cfg.model
    from teamtr.training.warmstart import ensure_warm_model, warm_config_for

    options = {} if task == "chain" else {"task_options": {"steps": n}}
    path = ensure_warm_model(warm_config_for(task, steps=n, **options), progress=False)
    require_in_band(path, f"{task} n = {n}")
    return str(path)


def require_in_band(path: str | Path, what: str) -> None:
    """No arm can learn from a warm model whose build ended outside its band (one at 0% has no reward to
    learn from): stop before spending the runs on it."""
    from teamtr.training.warmstart import load_report

    report = load_report(path)
    if not report.in_band:
        raise RuntimeError(f"{what}: the warm start ended outside its band: {report.summary()}")


def train_config(task: str, n: int, seed: int, arm: str, model: str, cfg: StudyConfig, budget: int | None):
    from teamtr.training.config import TrainConfig

    naive = arm != "teamtr"
    return TrainConfig.from_dict(
        {
            "seed": seed,
            # naive_tokens: the token budget ends the run at the first stage boundary past it
            "stages": cfg.stages * (4 * n if arm == "naive_tokens" else 1),
            "max_rollout_tokens": budget if arm == "naive_tokens" else None,
            "run_dir": str(cfg.out / "runs" / task / f"n{n}" / f"seed{seed}" / arm),
            "task": {"name": task, "options": {"steps": n}},
            "team": {"model": model},
            "schedule": {
                "kind": "naive" if naive else "teamtr",
                "resample": "suffix",
                "diagnose_stale_gap": arm == "naive_updates",
            },
            "rollout": {"prompts_per_update": cfg.prompts, "group_size": cfg.group, "temperature": 1.0},
            "optim": {"lr": cfg.lr, "epochs": cfg.epochs, "minibatch_messages": 64},
            "trust_region": {"delta": cfg.delta, "heldout_episodes": 0},
            "eval": {"stage_episodes": 0, "final_episodes": cfg.eval_episodes, "temperature": 0.0},
        }
    )


def evaluate(engine: Any, run: Any, seed: int) -> list[float]:
    """Greedy team reward on each of the `eval.final_episodes` held-out tasks (the same tasks for every
    cell of a task and size: `task.eval_seed`)."""
    from teamtr.graphs.team import derive_seed

    task = run.task()
    tasks = task.generate(run.config.eval.final_episodes, seed=run.config.task.eval_seed)
    team = run.team(run.roles, engine, temperature=0.0, name="eval")
    trajectories = team.run(tasks, group_size=1, verifier=task, seed=derive_seed(seed, "final-eval"))
    by_id = {t.task_id: t.reward for t in trajectories}
    return [float(by_id[t.id]) for t in tasks]


def run_warm(task: str, n: int, model: str, cfg: StudyConfig) -> dict[str, Any]:
    from teamtr.training.run_dir import RunDir

    tcfg = train_config(task, n, 0, "teamtr", model, cfg, None).with_overrides(
        {"run_dir": str(cfg.out / "runs" / task / f"n{n}" / "warm")}
    )
    run = RunDir.create(tcfg)
    rewards = evaluate(run.engine("fresh"), run, 0)  # fresh LoRA adapters (B = 0): the warm model itself
    return {"rewards": rewards, "accuracy": float(np.mean(rewards)), "model": model, **warm_build(model)}


def warm_build(model: str) -> dict[str, Any]:
    """How the warm model was built (its training/warmstart report), when it is a warm start."""
    from teamtr.training.warmstart import load_report

    try:
        report = load_report(model)
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # a model given with --model, not built by training/warmstart
    return {
        "build": {
            "optimizer_steps": report.optimizer_steps,
            "max_steps": report.config["max_steps"],
            "team_accuracy": report.greedy.team_accuracy,
            "in_band": report.in_band,
            "stopped_because": report.stopped_because,
        }
    }


def run_arm(task: str, n: int, seed: int, arm: str, model: str, cfg: StudyConfig, budget: int | None):
    from teamtr.graphs.run_layout import read_metrics
    from teamtr.training.run_dir import RunDir
    from teamtr.training.trainer import Trainer

    tcfg = train_config(task, n, seed, arm, model, cfg, budget)
    trainer = Trainer(tcfg)
    summary = trainer.train()
    rewards = evaluate(trainer.engine, RunDir(tcfg.run_dir), seed)
    updates = read_metrics(Path(tcfg.run_dir), kind="update")
    return {
        "rewards": rewards,
        "accuracy": float(np.mean(rewards)),
        "stages": summary["stages"],
        "updates": summary["updates"],
        "train_tokens": summary["train_tokens"],
        "rejected_fraction": summary["rejected_fraction"],
        "left_region_fraction": summary["left_region_fraction"],
        "stale_gap": [u["stale_gap"] for u in updates if u.get("stale_gap") is not None],
        "occupancy_divergence": [
            u["occupancy_divergence"] for u in updates if u.get("occupancy_divergence") is not None
        ],
        "train_reward": [u.get("reward") for u in updates],
    }


def run_exact(cfg: StudyConfig) -> dict[str, Any]:
    """The exact lab's scaling study at the study's sizes, both families (docs/theory.md sections 5, 5b)."""
    from teamtr.theory.scaling import ScalingConfig, run_scaling

    out: dict[str, Any] = {}
    for family in cfg.tasks:
        res = run_scaling(ScalingConfig(agents=list(cfg.sizes), family=family, seeds=cfg.exact_seeds))
        out[family] = {
            "alphas": {k: {"value": v["value"], "ci95": v["ci95"]} for k, v in res["alphas"].items()},
            "return_gap": {row["n"]: row["return_gap"]["mean"] for row in res["table"]},
            "seconds": res["seconds"],
        }
    return out


def planned_cells(cfg: StudyConfig) -> Iterator[tuple[str, int, int | None, str]]:
    for task in cfg.tasks:
        for n in cfg.sizes:
            yield task, n, None, "warm"
            for seed in range(cfg.seeds):
                for arm in ARMS:
                    yield task, n, seed, arm


def run_cell(task: str, n: int, seed: int | None, arm: str, cfg: StudyConfig) -> dict[str, Any]:
    """One cell, appended to cells.jsonl when it finishes (naive_tokens reads TeamTR's tokens from it)."""
    import torch

    torch.set_num_threads(1)
    path = cfg.out / "cells.jsonl"
    t0 = time.perf_counter()
    model = warm_model(task, n, cfg)
    if arm == "warm":
        result = run_warm(task, n, model, cfg)
    else:
        budget = None
        if arm == "naive_tokens":
            budget = read_cells(path)[cell_key(task, n, seed, "teamtr")]["train_tokens"]
        result = run_arm(task, n, seed, arm, model, cfg, budget)
    record = {"key": cell_key(task, n, seed, arm), "task": task, "n": n, "seed": seed, "arm": arm, **result}
    record["seconds"] = time.perf_counter() - t0
    append_cell(path, record)
    return record


def run_group(task: str, n: int, seed: int, cfg: StudyConfig) -> None:
    """The warm start of (task, n) if no worker has evaluated it yet (under a lock: once), then the seed's
    three arms in order (naive_tokens needs TeamTR's token count), skipping finished cells."""
    import fcntl

    path = cfg.out / "cells.jsonl"
    with (cfg.out / f".warm-{task}-n{n}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cell_key(task, n, None, "warm") not in read_cells(path):
            run_cell(task, n, None, "warm", cfg)
    for arm in ARMS:
        if cell_key(task, n, seed, arm) not in read_cells(path):
            run_cell(task, n, seed, arm, cfg)


def run_study(cfg: StudyConfig, console: Any = None) -> dict[str, Any]:
    """Every cell not yet in cells.jsonl: each (task, n, seed) group (with the warm start of its task and
    size) on one of `workers` processes, one torch thread each; a progress bar follows the JSONL."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, wait

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console(stderr=True)
    cfg.out.mkdir(parents=True, exist_ok=True)
    path = cfg.out / "cells.jsonl"
    record_config(cfg.out, asdict(cfg))
    plan = list(planned_cells(cfg))
    done = read_cells(path)
    console.print(f"{len(plan)} cells, {sum(cell_key(*c) in done for c in plan)} already in {path}")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("cells", total=len(plan))
        seen: set[str] = set()

        def refresh() -> None:
            nonlocal done
            done = read_cells(path)
            for key in sorted(set(done) - seen):
                rec = done[key]
                seen.add(key)
                if rec.get("arm") in ARMS or rec.get("arm") == "warm":
                    extra = (
                        f", {rec['train_tokens']} tokens, {rec['updates']} updates"
                        if rec["arm"] != "warm"
                        else ""
                    )
                    progress.console.print(
                        f"{key}: accuracy {rec['accuracy']:.3f}{extra} ({rec['seconds']:.0f} s)"
                    )
            progress.update(bar, completed=sum(cell_key(*c) in done for c in plan))

        refresh()
        # smallest teams first, so that a partial run has whole team sizes of both tasks
        groups = [(t, n, s) for n in cfg.sizes for t in cfg.tasks for s in range(cfg.seeds)]
        groups = [
            (t, n, s)
            for t, n, s in groups
            if cell_key(t, n, None, "warm") not in done or any(cell_key(t, n, s, a) not in done for a in ARMS)
        ]
        progress.update(bar, description=f"{len(groups)} seed groups on {cfg.workers} workers")
        if groups:
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=cfg.workers, mp_context=ctx) as pool:
                futures = [pool.submit(run_group, *g, cfg) for g in groups]
                pending = set(futures)
                while pending:
                    _, pending = wait(pending, timeout=5)
                    refresh()
                for f in futures:
                    f.result()  # a failed cell stops the study with its error (finished cells are kept)
        if cfg.exact_seeds and len(cfg.sizes) >= 2 and "exact" not in done:  # a slope needs two sizes
            progress.update(bar, description="exact lab")
            t0 = time.perf_counter()
            append_cell(
                path, {"key": "exact", "arm": "exact", **run_exact(cfg), "seconds": time.perf_counter() - t0}
            )
        refresh()
    return write_outputs(cfg, done)


def write_outputs(cfg: StudyConfig, cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    result = analyse(cfg, cells)
    result["cells_done"] = sorted(cells)
    result["cells_planned"] = len(list(planned_cells(cfg))) + (
        1 if cfg.exact_seeds and len(cfg.sizes) >= 2 else 0
    )
    (cfg.out / "summary.json").write_text(json.dumps(result, indent=1))
    (cfg.out / "table.md").write_text(table_markdown(result))
    result["plots"] = [str(p) for p in plot(result, cfg.out)]
    return result


def parse_args(argv: list[str] | None) -> tuple[StudyConfig, bool]:
    d = StudyConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=d.out)
    p.add_argument("--tasks", nargs="+", default=d.tasks)
    p.add_argument("--sizes", nargs="+", type=int, default=d.sizes)
    for name in (
        "seeds",
        "stages",
        "prompts",
        "group",
        "epochs",
        "eval_episodes",
        "exact_seeds",
        "bootstrap",
        "workers",
    ):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name))
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--delta", type=float, default=d.delta)
    p.add_argument("--model", default=None, help="one base model for every cell (default: the warm starts)")
    p.add_argument("--report-only", action="store_true", help="rewrite the outputs from cells.jsonl")
    a = vars(p.parse_args(argv))
    report_only = a.pop("report_only")
    return StudyConfig(**a), report_only


def main(argv: list[str] | None = None) -> None:
    import torch

    torch.set_num_threads(1)
    cfg, report_only = parse_args(argv)
    if report_only:
        result = write_outputs(cfg, read_cells(cfg.out / "cells.jsonl"))
    else:
        result = run_study(cfg)
    print((cfg.out / "table.md").read_text())
    print(
        f"{len(result['cells_done'])} of {result['cells_planned']} cells done; {result['seconds']:.0f} s of cell time"
    )


if __name__ == "__main__":
    sys.exit(main())
