"""`teamtr eval`: score a team (or a file of responses) on a task family or a real benchmark.

`TEAM_OR_RUN_DIR` may be `warm`, a model directory or a run directory (evals/teams.py `load_eval_team`
builds the team). A run of a user's own graph (team.graph) is evaluated by evals/graph_eval.py (printed by
cli/graph_eval.py): its v0 and newest adapters on its own tasks (or --task), scored by its reward (or
--verifier). This module parses the command and prints; the evaluation is evals/'s.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from teamtr.graphs.task import HELDOUT_SEED

app = typer.Typer()


def _parse_knobs(pairs: list[str]) -> list[dict]:
    """`-d houses=2,3 -d attributes=2` -> one knob dict per combination (a difficulty sweep)."""
    axes: dict[str, list] = {}
    for pair in pairs:
        key, sep, values = pair.partition("=")
        if not sep or not key or not values:
            raise typer.BadParameter(f"difficulty {pair!r}: want KNOB=VALUE[,VALUE...]")
        axes[key.strip()] = [
            int(v) if v.strip().lstrip("-").isdigit() else v.strip() for v in values.split(",")
        ]
    return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())] or [{}]


def _instances(task: str, limit: int, seed: int, knobs: list[dict], benchmarks_dir: Path | None):
    from teamtr.tasks import get_task
    from teamtr.tasks.datasets import benchmark_names, load_benchmark

    if task in benchmark_names():
        if knobs != [{}]:
            raise typer.BadParameter("difficulty knobs apply to generated task families, not benchmark files")
        family, instances = load_benchmark(task, benchmarks_dir)
        return family, instances[:limit]
    family = get_task(task)
    instances = []
    for knob in knobs:
        try:
            instances += family.generate(limit, seed, **knob)
        except (ValueError, TypeError) as e:
            raise typer.BadParameter(str(e), param_hint="--difficulty") from e
    return family, instances


def default_temperature(temperature: float | None, k: int) -> float:
    """The temperature `teamtr eval` samples at: the one given, else greedy (0, as training's held-out
    evaluation and serving answer) for one episode per instance, 1.0 for k > 1 (k greedy episodes of an
    instance would all be the same)."""
    if temperature is not None:
        return temperature
    return 0.0 if k == 1 else 1.0


@app.command("eval")
def eval_command(
    team_or_run_dir: Annotated[
        str | None, typer.Argument(help="'warm', a model directory, or a TeamTR run directory")
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(
            "--task", "-t", help="task family or benchmark name (a graph run: default its own tasks)"
        ),
    ] = None,
    verifier: Annotated[
        str | None,
        typer.Option(help="a graph run: score its answers with module:attr, verify(task, response) -> float"),
    ] = None,
    k: Annotated[int, typer.Option("-k", min=1, help="episodes per instance (pass@k, avg@k)")] = 1,
    limit: Annotated[int, typer.Option(min=1, help="instances (per difficulty setting)")] = 100,
    difficulty: Annotated[
        list[str] | None, typer.Option("--difficulty", "-d", help="KNOB=V[,V..]; several values sweep")
    ] = None,
    seed: Annotated[int, typer.Option(help="generator seed of the instances")] = HELDOUT_SEED,
    baseline: Annotated[
        str | None, typer.Option(help="'best-of-n': one model, best-of-N at the team's token budget")
    ] = None,
    responses: Annotated[
        Path | None, typer.Option(help="score a JSONL of {id, response[, tokens]} instead of running a team")
    ] = None,
    stage: Annotated[
        int | None,
        typer.Option(
            min=0, help="a run's adapters after this many stages (default: the newest; 0: the start)"
        ),
    ] = None,
    roles: Annotated[int, typer.Option(min=1, help="generic solver roles when the team has none")] = 3,
    single_turns: Annotated[
        int | None,
        typer.Option(min=1, help="baseline's turns (default: one per team role; 1 = one long message)"),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="default 0: greedy, as training's evaluation and serving answer; with -k above 1, 1.0 "
            "(k greedy episodes of an instance would all be the same)",
        ),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="a graph run: its held-out tasks from this JSONL file (rows as task.data's), scored as its "
            "own tasks (default: the run's task.eval_data, else its training tasks)",
        ),
    ] = None,
    max_new_tokens: Annotated[
        int | None, typer.Option(min=1, help="per message (default: 96 for blocksworld's plans, else 32)")
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="instances per engine batch")] = 16,
    threads: Annotated[int, typer.Option(min=1, help="torch threads")] = 1,
    benchmarks_dir: Annotated[
        Path | None,
        typer.Option(help="real benchmark files (default: $TEAMTR_BENCHMARKS_DIR or ../shared/benchmarks)"),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="result.json, episodes.jsonl and plots (default runs/eval/TASK)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    list_tasks: Annotated[
        bool, typer.Option("--list-tasks", help="list task families and benchmarks")
    ] = False,
) -> None:
    """pass@k and avg@k (95% bootstrap CIs, per difficulty) of a team on a task; optionally vs best-of-N."""
    from teamtr.evals.harness import best_of_n, evaluate, responses_file_runner
    from teamtr.evals.report import plot_result, print_result
    from teamtr.tasks import get_task, task_names
    from teamtr.tasks.datasets import benchmark_names

    console = Console(stderr=as_json)
    if list_tasks:
        for name in task_names():
            console.print(f"[bold]{name}[/bold]  {get_task(name).description}")
        for name in benchmark_names():
            console.print(f"[bold]{name}[/bold]  real benchmark file")
        return
    from teamtr.evals.graph_eval import graph_run_config

    graph_run = graph_run_config(team_or_run_dir)
    temperature = default_temperature(temperature, k)
    if verifier is not None and graph_run is None:
        raise typer.BadParameter("--verifier applies to a run of a user's graph (team.graph)")
    if data is not None and (graph_run is None or task is not None):
        raise typer.BadParameter(
            "--data applies to a run of a user's graph (team.graph), without --task", param_hint="--data"
        )
    if task is None and graph_run is None:
        raise typer.BadParameter("--task is required (see --list-tasks)", param_hint="--task")
    if baseline not in (None, "best-of-n"):
        raise typer.BadParameter("the only baseline is 'best-of-n'", param_hint="--baseline")
    if (team_or_run_dir is None) == (responses is None):
        raise typer.BadParameter("give a TEAM_OR_RUN_DIR, or --responses FILE (not both)")
    if responses is not None and baseline:
        raise typer.BadParameter("--baseline needs a model to sample from, not --responses")
    if baseline and k == 1:  # the single model gets the tokens of k team episodes: k = 1 is best-of-~1
        raise typer.BadParameter(
            "--baseline best-of-n compares at the tokens of k team episodes: give -k (e.g. -k 8)",
            param_hint="-k",
        )

    if task is not None and task not in task_names() + benchmark_names():
        known = ", ".join(task_names() + benchmark_names())
        raise typer.BadParameter(f"unknown task {task!r}; known: {known}", param_hint="--task")
    knobs = _parse_knobs(difficulty or [])
    if graph_run is not None:
        from teamtr.cli.graph_eval import report_graph_run

        if task is None and difficulty:
            raise typer.BadParameter(
                "difficulty knobs need --task FAMILY (a graph run's own tasks have none)"
            )

        family, instances = (
            (None, None) if task is None else _instances(task, limit, seed, knobs, benchmarks_dir)
        )
        report_graph_run(
            Path(team_or_run_dir),
            family=family,
            instances=instances,
            data=data,
            verifier=verifier,
            k=k,
            limit=limit,
            seed=seed,
            baseline=baseline is not None,
            stage=stage,
            single_turns=single_turns,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            threads=threads,
            out=out,
            as_json=as_json,
        )
        return
    team = None
    if team_or_run_dir is not None:  # check the team before spending time on instances
        from teamtr.evals.teams import load_eval_team

        try:
            team = load_eval_team(team_or_run_dir, task, roles, threads, stage)
        except (FileNotFoundError, ValueError) as e:
            raise typer.BadParameter(str(e), param_hint="TEAM_OR_RUN_DIR") from e
    family, instances = _instances(task, limit, seed, knobs, benchmarks_dir)
    from teamtr.tasks.roles import max_new_tokens_for  # per-family message budget

    max_new_tokens = max_new_tokens or max_new_tokens_for(task)
    show_progress = not as_json
    runners = None
    if team is None:
        team_runner = responses_file_runner(responses)
    else:
        from teamtr.evals.runners import EngineRunners

        runners = EngineRunners(
            team.engine,
            team.roles,
            family,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            seed=seed,
            team_options=team.team_options,
        )
        team_runner = runners.team()
    result = evaluate(family, instances, team_runner, k, batch_size, show_progress, seed)
    if baseline and runners is not None:
        result.baseline = best_of_n(
            family, instances, runners.single(turns=single_turns), result, batch_size, show_progress
        )
    out_dir = out or Path("runs") / "eval" / task
    result.save(out_dir)
    plots = plot_result(result, out_dir)
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    print_result(result, console)
    console.print(
        f"wrote {out_dir / 'result.json'}, {out_dir / 'episodes.jsonl'}, {', '.join(p.name for p in plots)}"
    )
