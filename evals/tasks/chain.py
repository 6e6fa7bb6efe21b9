"""Chain arithmetic: the demo task. n roles add a running sum one operand each.

The task `12+7+30+5` is solved in turns: role 1 writes `12+7=19`, role 2 writes `19+30=49`, role 3
writes `49+5=54`. Each role's job (copy the previous result, add the next operand) is learnable by a
1M-parameter model, and every later role acts on the context the earlier ones produced: when an earlier
role changes, the later roles see different contexts (the occupancy shift TeamTR is about).
"""

from __future__ import annotations

import random
import re

from teamtr.evals.task import TaskInstance

_LAST_EQ = re.compile(r"=\s*(-?\d+)\s*$")


class ChainArithmetic:
    name = "chain"
    description = "running sum over n+1 operands, one addition per role (demo task)"

    def __init__(self, steps: int = 3, max_operand: int = 40) -> None:
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
    def demonstration(operands: list[int], step: int) -> str:
        """The correct message of the role that performs addition number `step` (1-based)."""
        partial = sum(operands[:step])
        return f"{partial}+{operands[step]}={partial + operands[step]}"

    def extract_answer(self, response: str) -> str | None:
        m = _LAST_EQ.search(response.strip())
        return m.group(1) if m else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        ans = self.extract_answer(response)
        return float(ans is not None and int(ans) == int(instance.answer))
