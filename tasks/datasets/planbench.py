"""PlanBench Blocksworld, task 1 (plan generation): the one-shot prompts and VAL-style plan checking.

The model's plan (the text before `[PLAN END]`, if present) is read line by line with PlanBench's action
templates ("unstack the red block from on top of the blue block", "put down the red block", ...; PDDL
lines like `(unstack red blue)` or `(unstack d c)` are accepted too), colours are mapped back to the
instance's letters, and the plan is simulated on the instance's own PDDL domain and problem files,
parsed and grounded by pyperplan: correct iff every action is applicable and the goal holds at the end.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from teamtr.graphs.task import TaskInstance
from teamtr.tasks.blocksworld import ground, to_pddl_action, validate_plan
from teamtr.tasks.datasets.paths import benchmarks_dir, require_file

# plan-bench/configs/blocksworld.yaml: encoded_objects
COLOURS = dict(
    zip(
        "abcdefghijkl",
        "red blue orange yellow white magenta black cyan green violet silver gold".split(),
        strict=True,
    )
)
LETTER_OF = {colour: letter for letter, colour in COLOURS.items()}
_TEMPLATES = [
    (re.compile(r"unstack the (\w+) block from on top of the (\w+) block"), "unstack"),
    (re.compile(r"stack the (\w+) block on top of the (\w+) block"), "stack"),
    (re.compile(r"pick up the (\w+) block"), "pick-up"),
    (re.compile(r"put down the (\w+) block"), "put-down"),
]


def parse_plan_text(text: str) -> list[str]:
    """PDDL actions (letters) from a PlanBench-style plan; unreadable lines are skipped like PlanBench."""
    text = text.split("[PLAN END]")[0].lower()
    actions = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        for pattern, verb in _TEMPLATES:
            match = pattern.search(line)
            if match:
                args = [LETTER_OF.get(x, x) for x in match.groups()]
                actions.append(f"({verb} {' '.join(args)})")
                break
        else:
            pddl = to_pddl_action(line)
            if pddl is not None:
                verb, *args = pddl.strip("()").split()
                actions.append(f"({' '.join([verb, *[LETTER_OF.get(a, a) for a in args]])})")
    return actions


class PlanBenchBlocksworld:
    name = "planbench"
    description = "PlanBench Blocksworld t1 plan generation, validated by simulation (pyperplan)"

    def generate(self, n: int, seed: int, **difficulty):
        raise NotImplementedError("planbench is a benchmark file; use load_planbench")

    def extract_answer(self, response: str) -> str | None:
        actions = parse_plan_text(response)
        return "\n".join(actions) if actions else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        actions = parse_plan_text(response)
        if not actions:
            return 0.0
        ok, _ = validate_plan(ground(instance.meta["domain"], instance.meta["problem"]), actions)
        return float(ok)


def load_planbench(root: str | Path | None = None) -> tuple[PlanBenchBlocksworld, list[TaskInstance]]:
    folder = benchmarks_dir(root) / "planbench_blocksworld"
    prompts = json.loads(require_file(folder / "task_1_plan_generation.json", "PlanBench t1").read_text())
    domain = require_file(folder / "generated_domain.pddl", "PlanBench domain").read_text()
    instances = []
    for item in prompts["instances"]:
        problem = require_file(
            folder / "generated_basic" / f"instance-{item['instance_id']}.pddl", "PlanBench instance"
        ).read_text()
        blocks = len(re.search(r"\(:objects([^)]*)\)", problem).group(1).split())
        instances.append(
            TaskInstance(
                id=f"planbench-{item['instance_id']}",
                prompt=item["query"],
                answer=item["ground_truth_plan"],
                difficulty=f"blocks={blocks}",
                meta={"domain": domain, "problem": problem},
            )
        )
    return PlanBenchBlocksworld(), instances
