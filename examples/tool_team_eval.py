"""How the tool team plays on held-out chain tasks, at each saved version of a run: accuracy (with a 95%
interval), how often the solver calls `calc`, how often a call is invalid or its expression is not the
task's own, by the saved adapters (v0 = the warm start the run began from).

    python -m examples.tool_team_eval runs/tool_team --episodes 200 --versions 0 latest
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from teamtr.graphs.spec import build_team
from teamtr.graphs.trajectory import Trajectory
from teamtr.training.run_dir import RunDir


def tool_use(trajectories: list[Trajectory], prompts: list[str]) -> dict[str, Any]:
    """Accuracy with a normal-approximation 95% interval, and the solver's tool use, per episode."""
    n = len(trajectories)
    acc = sum(t.reward for t in trajectories) / n
    calls = [[c for turn in t.turns for c in turn.tool_calls] for t in trajectories]
    invalid = [sum(len(turn.invalid_tool_calls) for turn in t.turns) for t in trajectories]
    exact = [
        any(c["arguments"].get("expression") == p for c in cs) for cs, p in zip(calls, prompts, strict=True)
    ]
    return {
        "episodes": n,
        "accuracy": round(acc, 4),
        "accuracy_ci95": round(1.96 * math.sqrt(acc * (1 - acc) / n), 4),
        "tool_call_rate": round(sum(bool(c) for c in calls) / n, 4),  # episodes with >= 1 valid call
        "exact_expression_rate": round(sum(exact) / n, 4),  # ... one of them on the task's expression
        "invalid_call_rate": round(sum(bool(i) for i in invalid) / n, 4),  # episodes with >= 1 invalid call
        "accuracy_when_calling": round(
            sum(t.reward for t, c in zip(trajectories, calls, strict=True) if c)
            / max(1, sum(bool(c) for c in calls)),
            4,
        ),
    }


def evaluate(run_dir: Path, version: int | None, episodes: int, temperature: float, seed: int = 7) -> dict:
    """The team at `version` of every adapter (None: the latest) on `episodes` held-out tasks."""
    run = RunDir(run_dir)
    task = run.task()
    engine = run.engine(version=version)
    team = build_team(run.config.team, run.roles, engine, temperature=temperature, name="eval")
    tasks = task.generate(episodes, seed=run.config.task.eval_seed + 1000)  # not the stage-eval tasks
    trajectories = team.run(tasks, group_size=1, verifier=task, seed=seed)
    return {"version": "latest" if version is None else version, "temperature": temperature,
            **tool_use(trajectories, [t.prompt for t in tasks])}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.tool_team_eval", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--versions", nargs="+", default=["0", "latest"])
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)
    for v in args.versions:
        row = evaluate(args.run_dir, None if v == "latest" else int(v), args.episodes, args.temperature)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
