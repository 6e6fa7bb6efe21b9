"""Chain arithmetic: the demo task. n roles add a running sum one operand each.

The task `3+7+9+5` is solved in turns, each role reducing the previous line by one addition: role 1
writes `10+9+5`, role 2 writes `19+5`, role 3 writes `24`, the team's final answer. Each role's job
(add the first two numbers, copy the rest) is local and learnable by a 1M-parameter model, and every
later role acts on the context the earlier ones produced: when an earlier role changes, the later roles
see different contexts (the occupancy shift TeamTR is about).
"""

from __future__ import annotations

import random
import re

from teamtr.graphs.task import TaskInstance
from teamtr.tasks.family_settings import WarmStart

_INTEGER = re.compile(r"-?\d+")


class ChainArithmetic:
    name = "chain"
    description = "running sum over n+1 operands, one addition per role (demo task)"
    system_prompt = "Add the first two numbers."
    # the chain demo's model is WarmStartConfig's defaults; its step budget grows beyond 4 roles (the team-size
    # study, docs/study.md: team accuracy is the product of every role's on messages that lengthen with the
    # team). The sizes within the measured ones keep their budget, hence their cached models
    warm_start = WarmStart(scaled_budget=(4, 300))

    def __init__(self, steps: int = 3, max_operand: int = 9) -> None:
        if steps < 1:
            raise ValueError("steps must be >= 1")
        self.steps = steps
        self.max_operand = max_operand

    def generate(self, n: int, seed: int, **difficulty) -> list[TaskInstance]:
        steps = int(difficulty.get("steps", self.steps))
        hi = int(difficulty.get("max_operand", self.max_operand))
        rng = random.Random(f"{self.name}:{seed}:{steps}:{hi}")
        out = []
        for i in range(n):
            ops = [rng.randint(1, hi) for _ in range(steps + 1)]
            out.append(
                TaskInstance(
                    id=f"{self.name}-{seed}-{i}",
                    prompt="+".join(map(str, ops)),
                    answer=sum(ops),
                    difficulty=f"steps={steps},max={hi}",
                    meta={"operands": ops},
                )
            )
        return out

    @staticmethod
    def demonstration(operands: list[int], step: int, separator: str = "+") -> str:
        """The correct message of the role that performs addition number `step` (1-based).

        `separator` joins the numbers of a message (`"+"`: `19+5`); another one (`" + "`: `19 + 5`) is a
        different message protocol for the same task, which the final answer (one integer) does not see.
        """
        return separator.join(map(str, [sum(operands[: step + 1]), *operands[step + 1 :]]))

    def answer_for(self, prompt: str) -> int | None:
        """The ground truth of a prompt seen without its instance (a served one): the sum of its operands,
        or None when the text is not a chain task."""
        parts = prompt.strip().split("+")
        if len(parts) < 2 or not all(_INTEGER.fullmatch(p.strip()) for p in parts):
            return None
        return sum(int(p) for p in parts)

    def extract_answer(self, response: str) -> str | None:
        """The final message must be one integer: the fully reduced sum."""
        lines = response.strip().splitlines()
        last = lines[-1].strip() if lines else ""
        return last if _INTEGER.fullmatch(last) else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        ans = self.extract_answer(response)
        return float(ans is not None and int(ans) == int(instance.answer))
