"""Constraint logic in the style of AutoLogi: give any assignment that satisfies every constraint.

AutoLogi's items are open-ended arrangement puzzles checked by constraint code rather than compared to
one reference answer. The same here, generated: n items (A, B, C, ...) take distinct positions 1..n,
and constraints true of a hidden arrangement are added until at most `max_solutions` arrangements
remain (counted with python-constraint2). Any arrangement meeting every constraint is correct.

    A B C in 1-3, all different. A<B C!=1 B=C+1
    answer:
    A=1,B=3,C=2

Constraints: `X<Y` X before Y; `X=Y+1` X right after Y; `X!=k` X not at k; `X=k` X at k; `X~Y` X next
to Y. AutoLogi itself ships as executable Python checks; nothing is executed here, constraints are data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from teamtr.graphs.task import TaskInstance
from teamtr.tasks._knobs import KnobbedFamily
from teamtr.tasks._text import last_line
from teamtr.tasks.family_settings import WarmStart

_ASSIGNMENT = re.compile(r"([A-Z])\s*=\s*(\d+)")


@dataclass(frozen=True)
class AutologiDifficulty:
    """Defaults: 3 items, at most 2 valid arrangements. items=2 is very easy."""

    items: int = 3  # number of items to place (2..8)
    max_solutions: int = 2  # stop adding constraints once at most this many arrangements remain

    def __post_init__(self) -> None:
        if not 2 <= self.items <= 8:
            raise ValueError("autologi: items must be in 2..8")
        if self.max_solutions < 1:
            raise ValueError("autologi: max_solutions must be >= 1")


def holds(constraint: list, position: dict[str, int]) -> bool:
    """Whether one constraint `[op, x, y_or_k]` holds for an arrangement."""
    op, x, y = constraint
    if op == "<":
        return position[x] < position[y]
    if op == "+1":
        return position[x] == position[y] + 1
    if op == "~":
        return abs(position[x] - position[y]) == 1
    if op == "=k":
        return position[x] == y
    if op == "!=k":
        return position[x] != y
    raise ValueError(f"unknown constraint {op!r}")


def render(constraint: list) -> str:
    op, x, y = constraint
    return {"<": f"{x}<{y}", "+1": f"{x}={y}+1", "~": f"{x}~{y}", "=k": f"{x}={y}", "!=k": f"{x}!={y}"}[op]


def solutions(items: list[str], constraints: list[list]) -> list[dict[str, int]]:
    """Every arrangement satisfying all constraints (python-constraint2)."""
    return list(_problem(items, constraints).getSolutionIter())


def count_solutions(items: list[str], constraints: list[list], limit: int = 10**6) -> int:
    """How many arrangements satisfy all constraints (python-constraint2), stopping at `limit`."""
    count = 0
    for _ in _problem(items, constraints).getSolutionIter():
        count += 1
        if count >= limit:
            break
    return count


def _problem(items: list[str], constraints: list[list]):
    from constraint import AllDifferentConstraint, Problem

    problem = Problem()
    problem.addVariables(items, list(range(1, len(items) + 1)))
    problem.addConstraint(AllDifferentConstraint(), items)
    for c in constraints:
        names = [c[1], c[2]] if c[0] in ("<", "+1", "~") else [c[1]]
        problem.addConstraint(lambda *v, c=c, names=names: holds(c, dict(zip(names, v, strict=True))), names)
    return problem


class Autologi(KnobbedFamily[AutologiDifficulty]):
    name = "autologi"
    description = "arrange items under constraints; any arrangement meeting all of them is correct"
    knobs_type = AutologiDifficulty
    system_prompt = "Place the items."
    # as zebra: a band above the level of a guess (not learnt within this budget)
    warm_start = WarmStart(dict(max_steps=1000, stop_accuracy=0.5, band=(0.4, 0.75)))

    def generate(self, n: int, seed: int, **difficulty: int) -> list[TaskInstance]:
        knobs = self.knobs(difficulty)
        items = [chr(ord("A") + i) for i in range(knobs.items)]
        out = []
        for i in range(n):
            rng = self.instance_rng(seed, knobs, i)
            slots = list(range(1, knobs.items + 1))
            rng.shuffle(slots)
            hidden = dict(zip(items, slots, strict=True))
            constraints: list[list] = []
            while count_solutions(items, constraints, knobs.max_solutions + 1) > knobs.max_solutions:
                candidate = _random_true_constraint(rng, items, hidden)
                if candidate not in constraints:
                    constraints.append(candidate)
            out.append(
                TaskInstance(
                    id=self.instance_id(seed, knobs, i),
                    prompt=f"{' '.join(items)} in 1-{knobs.items}, all different. "
                    + " ".join(render(c) for c in constraints),
                    answer=",".join(f"{x}={hidden[x]}" for x in items),  # one valid answer, not the only
                    difficulty=f"items={knobs.items},sols<={knobs.max_solutions}",
                    meta={"items": items, "constraints": constraints},
                )
            )
        return out

    @staticmethod
    def demonstration(instance: TaskInstance, role_index: int) -> str:
        """Warm-start data: every role of a generic team writes the first valid arrangement in
        lexicographic order (A's position first). One answer per prompt, even when two arrangements are
        valid: the hidden one would be a coin flip the prompt cannot predict."""
        items, constraints = instance.meta["items"], instance.meta["constraints"]
        first = min(tuple(s[x] for x in items) for s in solutions(items, constraints))
        return ",".join(f"{x}={k}" for x, k in zip(items, first, strict=True))

    def extract_answer(self, response: str) -> str | None:
        line = last_line(response)
        return line if line and _ASSIGNMENT.search(line) else None

    def parse(self, response: str) -> dict[str, int] | None:
        """The arrangement in the final line, or None if a letter is assigned twice."""
        line = self.extract_answer(response)
        if line is None:
            return None
        pairs = _ASSIGNMENT.findall(line)
        position = {x: int(k) for x, k in pairs}
        return position if len(position) == len(pairs) else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        position = self.parse(response)
        items = instance.meta["items"]
        if position is None or sorted(position) != items:
            return 0.0
        if sorted(position.values()) != list(range(1, len(items) + 1)):  # inputs check: a permutation
            return 0.0
        return float(all(holds(c, position) for c in instance.meta["constraints"]))


def _random_true_constraint(rng, items: list[str], hidden: dict[str, int]) -> list:
    x, y = rng.sample(items, 2)
    kind = rng.choice(["<", "+1", "~", "=k", "!=k", "<"])
    if kind == "<":
        x, y = sorted((x, y), key=hidden.get)
        return ["<", x, y]
    if kind == "+1":
        right = {p: name for name, p in hidden.items()}
        if hidden[x] == 1:
            return ["!=k", x, rng.choice([k for k in hidden.values() if k != 1])]
        return ["+1", x, right[hidden[x] - 1]]
    if kind == "~":
        neighbours = [z for z in items if abs(hidden[z] - hidden[x]) == 1]
        return ["~", x, rng.choice(neighbours)]
    if kind == "=k":
        return ["=k", x, hidden[x]]
    return ["!=k", x, rng.choice([k for k in range(1, len(items) + 1) if k != hidden[x]])]
