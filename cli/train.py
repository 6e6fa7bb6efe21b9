"""Root commands `teamtr train CONFIG`, `teamtr report RUN_DIR...` and `teamtr demo`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

# training's modules (torch, transformers) are imported by the commands that run, not here: `teamtr
# --help` and a config error answer at once
app = typer.Typer()
console = Console()


def _overrides(pairs: list[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise typer.BadParameter(f"--set expects key=value, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


@app.command()
def train(
    config: Path = typer.Argument(
        ..., help="YAML config: every key, its default and what it does in docs/configuration.md (examples/)"
    ),
    run_dir: str | None = typer.Option(None, help="override run_dir"),
    set_: list[str] = typer.Option([], "--set", help="override a field, e.g. --set optim.lr=1e-3"),
    nproc: int = typer.Option(1, min=1, help="data-parallel ranks on this machine (runs torchrun)"),
    restart: bool = typer.Option(
        False, "--restart", help="start the run in run_dir over (its files move to RUN_DIR/previous/N/)"
    ),
) -> None:
    """Fine-tune every role of a team with TeamTR (or a baseline schedule); resumes an interrupted run.
    Under torchrun (or with --nproc K) each update is split over the ranks (docs/scale.md). Config keys:
    docs/configuration.md. A run that trained no update yet starts over by itself when its config changed;
    --restart starts over any run."""
    if nproc > 1 and "WORLD_SIZE" not in os.environ:  # start K ranks of this same command
        args = [str(config), *(["--run-dir", run_dir] if run_dir else []), *(a for p in set_ for a in ("--set", p))]
        args += ["--restart"] if restart else []
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
        raise typer.Exit(subprocess.call([*command, "-m", "teamtr.cli", "train", *args]))
    overrides = _overrides(set_)
    if run_dir:
        overrides["run_dir"] = run_dir
    from teamtr.training.config_file import read_config  # light: a bad config is reported at once

    cfg = read_config(config, overrides)  # one line of error naming the file and field if it is bad
    from teamtr.training.progress import RichCallbacks, progress_bars
    from teamtr.training.run_dir import check_config
    from teamtr.training.trainer import Trainer

    check_config(cfg, config)  # ... and the task, router, roles and graph, before anything is written
    if (note := held_out_note(cfg)) and os.environ.get("RANK", "0") == "0":
        console.print(f"[yellow]{note}[/]")
    if restart and os.environ.get("RANK", "0") == "0":  # the earlier run moves aside; the trainer starts anew
        from teamtr.training.run_dir import RunDir

        RunDir.create(cfg, restart=True)
    if os.environ.get("RANK", "0") != "0":  # another rank: no progress bars, no summary
        trainer = Trainer(cfg)
        trainer.train()
        if trainer.dp is not None:
            trainer.dp.close()
        return
    with progress_bars() as progress:
        callbacks = RichCallbacks(progress, roles_per_stage=0, temperature=cfg.rollout.temperature)
        trainer = Trainer(cfg, callbacks)
        summary = trainer.train()
    if trainer.dp is not None:
        trainer.dp.close()
    console.print_json(json.dumps(summary))
    console.print(trained_line(summary))
    console.print(f"run directory: {cfg.run_dir} (metrics.jsonl, tensorboard/, adapters/<adapter>/v<N>/)")


def held_out_note(cfg: Any) -> str | None:
    """A line saying so when a run on its own task list has no held-out list: its "held-out" return is
    then drawn from the tasks it trains on (docs/graphs.md, task.eval_data)."""
    if cfg.task.data is None or cfg.task.eval_data is not None or not cfg.eval.stage_episodes:
        return None
    if not cfg.task.data.endswith((".jsonl", ".json")):
        from teamtr.graphs.user_graph import DataFamily, data_family

        if not isinstance(data_family(cfg.task.data, cfg.task.name), DataFamily):
            return None  # a generator (`module:function` returning a TaskFamily): held out by task.eval_seed
    return (
        f"note: task.data {cfg.task.data} and no task.eval_data: the held-out return is drawn from the "
        "training tasks, so it is not held out; name a file of held-out tasks as task.eval_data"
    )


def trained_line(summary: dict[str, Any]) -> str:
    """What the run learned, in one line under its summary: how many updates trained."""
    trained, total = summary.get("updates_trained", 0), summary.get("updates", 0)
    line = (
        f"trained {trained} of {total} updates ({summary.get('updates_rejected', 0)} rejected by the trust "
        f"region, {summary.get('updates_skipped_no_signal', 0)} skipped: no reward spread)"
    )
    if total and not trained:
        line += "; [bold yellow]this run learned nothing[/]: its adapters are the ones it started from"
    return line


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="one or more run directories (plots overlay them)"),
    out: Path | None = typer.Option(None, help="where the PNGs go (default RUN_DIR/report)"),
) -> None:
    """PNG plots: return per stage, d_hat per update vs delta, certificate vs improvement, stale gap."""
    from teamtr.training.report import write_report
    from teamtr.training.run_dir import RunDir

    runs = [RunDir(d) for d in run_dirs]  # a clear error for a path that is not a run
    paths = write_report([r.path for r in runs], out)
    for p in paths:
        console.print(str(p))


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), help="output directory"),
    compare: bool = typer.Option(False, help="warm start vs TeamTR vs naive over several seeds"),
    seeds: int = typer.Option(3, help="seeds for --compare"),
    warm_seeds: int = typer.Option(0, help="run the demo once per warm-start seed 0..N-1 (seeds.json)"),
    config: Path | None = typer.Option(None, help="a config to start from instead of the demo's"),
) -> None:
    """Warm-started small team -> evaluation -> TeamTR -> evaluation -> report (summary.json)."""
    from teamtr.training.demo import run_compare, run_demo, run_demo_seeds

    if compare:
        run_compare(out, seeds=seeds, base_config=config, console=console)
    elif warm_seeds:
        run_demo_seeds(out, warm_seeds=warm_seeds, base_config=config, console=console)
    else:
        run_demo(out, base_config=config, console=console)
