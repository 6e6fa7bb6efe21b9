"""`teamtr eval RUN_DIR` for a run that trains its own LangGraph graph (team.graph, docs/graphs.md): the
evaluation is evals/graph_eval.py's (what scores an episode, the paired before / after); this module
turns its errors into the command's and prints and writes what it found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console


def versions_text(labels: tuple[str, str], role_versions: dict[str, dict[str, int]]) -> str:
    """`v0 (planner v0, solver v0) vs newest (planner v3, solver v2)`."""
    sides = [
        f"{label} ({', '.join(f'{r} v{v}' for r, v in role_versions[label].items())})" for label in labels
    ]
    return " vs ".join(sides)


def report_graph_run(run_dir: Path, *, out: Path | None, as_json: bool, **options: Any) -> dict[str, Any]:
    """Before (v0) and after (newest, or `stage`) of a graph run: evals/graph_eval.py `evaluate_graph_run`
    with `options`, printed and written to `out` (default runs/eval/<run>); its result.json summary."""
    from teamtr.evals.compare import comparison_table
    from teamtr.evals.graph_eval import GraphEvalError, evaluate_graph_run
    from teamtr.evals.report import print_result

    try:
        evaluation = evaluate_graph_run(run_dir, show_progress=not as_json, **options)
    except GraphEvalError as e:
        raise typer.BadParameter(str(e), param_hint=e.option) from None
    out_dir = out or Path("runs") / "eval" / evaluation.run_path.resolve().name
    plots = evaluation.save(out_dir)
    summary = evaluation.summary()
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return summary
    console = Console()
    console.print(
        f"{evaluation.run_path}: graph {evaluation.graph}, scored by {evaluation.scored_by}, on {evaluation.tasks_from}"
    )
    sampled = "greedy" if evaluation.temperature == 0 else f"temperature {evaluation.temperature:g}"
    console.print(f"{sampled}; compared: {versions_text(evaluation.labels, evaluation.role_versions)}")
    print_result(evaluation.after, console)
    console.print(comparison_table(evaluation.before, evaluation.after, evaluation.change, evaluation.labels))
    console.print(
        f"wrote {out_dir / 'result.json'}, {out_dir / 'episodes.jsonl'}, {out_dir / 'before'}/, "
        f"{', '.join(p.name for p in plots)}"
    )
    return summary
