"""`teamtr warmstart`: build (or reuse) a task family's warm-started model, and `teamtr warmstart ship`:
put a build into the package (training/warmstart/shipped.py), the one way to make the demo's shipped
weights. The only entry point of training/warmstart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(invoke_without_command=True, no_args_is_help=False)


@app.callback()
def warmstart(
    ctx: typer.Context,
    task: Annotated[str, typer.Option("--task", "-t", help="task family")] = "chain",
    seed: Annotated[int, typer.Option(help="build seed (a different seed is a different cached model)")] = 0,
    threads: Annotated[int, typer.Option(min=1, help="torch threads while building")] = 1,
    out: Annotated[
        Path | None, typer.Option(help="build into this folder (always a new build) instead of the model cache")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON only")] = False,
) -> None:
    """Build (or reuse, from the cache or the shipped models) a task family's warm-started model and print
    its report."""
    if ctx.invoked_subcommand is not None:
        return
    from teamtr.tasks import task_names
    from teamtr.training.warmstart import build_warm_model, ensure_warm_model, load_report, warm_config_for

    if task not in task_names():
        raise typer.BadParameter(f"unknown task {task!r}; known: {', '.join(task_names())}", param_hint="--task")
    cfg = warm_config_for(task, seed=seed, threads=threads, adapt_threads=False)
    if out is None:
        path = ensure_warm_model(cfg, progress=not as_json)
        report = load_report(path)
    else:
        report, path = build_warm_model(cfg, out, progress=not as_json), out
    summary = {k: v for k, v in report.as_dict().items() if k not in ("history", "files")}
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    console = Console()
    console.print(report.summary())
    console.print(f"model: {path}")


@app.command("ship")
def ship(
    name: Annotated[str, typer.Option("--write", help="the shipped model's name")] = "chain-demo",
    source: Annotated[
        Path | None, typer.Option("--from", help="ship this finished build folder instead of building")
    ] = None,
    stop_accuracy: Annotated[float | None, typer.Option(help="the build's stop accuracy (default: the demo's)")] = None,
    seed: Annotated[int, typer.Option(help="build seed")] = 0,
) -> None:
    """Build the demo's warm model (or take a finished build folder) and ship it into the package; then
    commit training/warmstart/shipped/ and re-measure the figures that start from it."""
    from teamtr.training.warmstart.config import warm_config_for
    from teamtr.training.warmstart.shipped import DEMO_WARM_OVERRIDES, ship_folder, write_shipped

    if source is not None:
        entry = ship_folder(source, name)
    else:
        accuracy = DEMO_WARM_OVERRIDES["stop_accuracy"] if stop_accuracy is None else stop_accuracy
        entry = write_shipped(warm_config_for("chain", stop_accuracy=accuracy, seed=seed), name)
    typer.echo(json.dumps({"name": name, **entry}, indent=1, default=list))
