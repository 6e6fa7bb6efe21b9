"""Does the chain team work as a chain? How often each adder's greedy message is the correct reduction
of the line it received, and whether the final answer depends on the message before it.

    .venv/bin/python benchmarks/chain_dependence.py RUN_DIR [--stage K] [--tasks 300]

RUN_DIR: a chain run (`teamtr demo`'s `runs/demo/run`); `--stage K`: the adapters after K stages (0 = the
warm model itself; default: the newest). The team answers the demo's test tasks (training/demo.py
DEMO_TEST_SEED) greedily, as `teamtr demo` evaluates it. Printed:

- per adder, the share of episodes whose message is exactly the line it received with its first two
  numbers added (`10+9+5` after `3+7+9+5`), whatever that line was;
- the final answer's accuracy split by whether the message before the last adder's was the correct
  reduction of the task (so the true running sum): if the last adder builds on that message, the two
  accuracies differ widely; if it reads the sum off the task prompt (every role sees it in the shared
  context), they are about equal.

Measured figures: docs/training.md, "The chain team does not work as a chain".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from teamtr.graphs.task import TaskInstance
from teamtr.graphs.trajectory import Trajectory
from teamtr.tasks.chain import ChainArithmetic


def reduced(line: str) -> str | None:
    """The line with its first two numbers added, or None when it is not `a+b(+c...)` of integers."""
    parts = line.strip().split("+")
    if len(parts) < 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts]
    return "+".join(map(str, [numbers[0] + numbers[1], *numbers[2:]]))


def dependence(tasks: Sequence[TaskInstance], episodes: Sequence[Trajectory]) -> dict[str, Any]:
    """Per-adder reduction accuracy and the final answer's accuracy given the previous message's truth."""
    roles = len(episodes[0].turns)
    correct = [0] * roles
    split = {"previous_right": [0, 0], "previous_wrong": [0, 0]}  # [final right, episodes]
    for task, episode in zip(tasks, episodes, strict=True):
        line = task.prompt
        for k, turn in enumerate(episode.turns):
            correct[k] += turn.text.strip() == reduced(line)
            line = turn.text.strip()
        truth = ChainArithmetic.demonstration(task.meta["operands"], roles - 1)
        before_last = episode.turns[-2].text.strip() if roles > 1 else task.prompt
        key = "previous_right" if before_last == truth else "previous_wrong"
        split[key][0] += episode.reward == 1.0
        split[key][1] += 1
    n = len(episodes)
    return {
        "episodes": n,
        "team_accuracy": sum(e.reward for e in episodes) / n,
        "reduction_accuracy": [c / n for c in correct],
        **{
            f"final_right_if_{k}": {"rate": right / total if total else None, "episodes": total}
            for k, (right, total) in split.items()
        },
    }


def main() -> None:
    from teamtr.training.demo import DEMO_TEST_SEED
    from teamtr.training.run_dir import RunDir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--stage", type=int, default=None, help="adapters after K stages (default: newest)")
    ap.add_argument("--tasks", type=int, default=300)
    args = ap.parse_args()
    run = RunDir(args.run_dir)
    if run.config.task.name != "chain":
        raise SystemExit(f"{args.run_dir}: a chain run is needed, this one trains {run.config.task.name!r}")
    engine = run.engine(version=run.stage_versions(args.stage))
    task = run.task()
    tasks = task.generate(args.tasks, seed=DEMO_TEST_SEED)
    team = run.team(run.roles, engine, temperature=0.0, name="eval")
    result = dependence(tasks, team.run(tasks, group_size=1, verifier=task, seed=1))
    print(json.dumps({"run_dir": args.run_dir, "stage": args.stage, **result}, indent=1))


if __name__ == "__main__":
    main()
