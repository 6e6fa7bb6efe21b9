"""Zebra (logic grid) puzzles in the style of ZebraLogic, with a unique solution.

The puzzle itself (a hidden grid, then clues reduced to a minimal set that still has exactly one
solution, checked with a SAT solver) comes from reasoning-gym's zebra generator. Its English rendering
is hundreds of characters per clue, too long for models that read one character per token, so the
prompt here is a compact rendering of the same clues:

    3 houses. name:alice,bob,carol food:kiwi,pie,tea
    bob@1 alice=pie alice<carol kiwi~bob
    house 2 food?

`X@2` X is in house 2; `X=Y` same house; `X<Y` X directly left of Y; `X~Y` next to each other;
`X!2` X not in house 2; `X<<Y` somewhere left; `X_Y` one house between; `X__Y` two houses between.
The answer is one value (the cell asked for). `solutions()` re-solves the rendered clues with
python-constraint2, independently of the generator, so tests can prove each puzzle's uniqueness.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import Any

from teamtr.graphs.task import TaskInstance
from teamtr.tasks._knobs import KnobbedFamily
from teamtr.tasks._text import last_line
from teamtr.tasks.family_settings import WarmStart

# reasoning-gym clue class -> (compact operator, arity kind)
_CLUE_SYMBOLS = {
    "found_at": "@",
    "not_at": "!",
    "same_house": "=",
    "consecutive": "<",
    "beside": "~",
    "left_of": "<<",
    "right_of": ">>",
    "one_between": "_",
    "two_between": "__",
}


_NAME_CHARS = 6  # values are cut to this many letters when that keeps them unique (short prompts)


@dataclass(frozen=True)
class ZebraDifficulty:
    """Defaults: 3 houses x 2 attributes. 2x2 is very easy; ZebraLogic goes up to 6x6. What the small
    warm-started models reach on them: docs/evals.md, "Headroom"."""

    houses: int = 3
    attributes: int = 2

    def __post_init__(self) -> None:
        if not (2 <= self.houses <= 7 and 2 <= self.attributes <= 7):
            raise ValueError("zebra: houses and attributes must be in 2..7")


def _value_names(solution: dict) -> dict[Any, str]:
    """Short, unique, lower-case names for the grid values: the first 6 letters where that is unique,
    else the whole word, with a category prefix when two categories share a word (Name.alice and
    Children.alice)."""
    full = {lit: lit.name.lower().replace("_", "") for lit in solution}
    counts: dict[str, int] = {}
    for name in full.values():
        counts[name] = counts.get(name, 0) + 1
    full = {
        lit: name if counts[name] == 1 else f"{type(lit).__name__.lower()[:3]}{name}"
        for lit, name in full.items()
    }
    short = {lit: name[:_NAME_CHARS] for lit, name in full.items()}
    clashes = {s for s in short.values() if list(short.values()).count(s) > 1}
    return {lit: full[lit] if short[lit] in clashes else short[lit] for lit in full}


class Zebra(KnobbedFamily[ZebraDifficulty]):
    name = "zebra"
    description = "logic grid puzzle with a unique solution (reasoning-gym generator, compact clues)"
    knobs_type = ZebraDifficulty
    system_prompt = "Solve the grid."
    # a well-formed guess is right about 1/3 of the time (one of 3 values; 1-2 of 6 arrangements): stop well
    # above that, where the model has learnt something (it does not learn the task within this budget)
    warm_start = WarmStart(
        dict(max_steps=800, batch_size=8, eval_every=60, stop_accuracy=0.5, band=(0.4, 0.75))
    )

    def generate(self, n: int, seed: int, **difficulty: int) -> list[TaskInstance]:
        from reasoning_gym.logic.contrib.logic_puzzle.generate import generate_puzzle

        knobs = self.knobs(difficulty)
        out = []
        for i in range(n):
            rng = self.instance_rng(seed, knobs, i)
            _, puzzle = generate_puzzle(Random(rng.randrange(2**31)), knobs.houses, knobs.attributes)
            names = _value_names(puzzle.solution)
            categories: dict[str, list[str]] = {}
            grid: dict[str, int] = {}
            for lit, house in puzzle.solution.items():
                categories.setdefault(type(lit).__name__.lower(), []).append(names[lit])
                grid[names[lit]] = house
            clues = sorted(_compact_clue(clue, names) for clue in puzzle.clues)
            house = rng.randint(1, knobs.houses)
            category = rng.choice(sorted(categories))
            answer = next(v for v in categories[category] if grid[v] == house)
            header = " ".join(f"{c}:{','.join(sorted(vs))}" for c, vs in sorted(categories.items()))
            clue_text = " ".join(_render_clue(c) for c in clues)
            out.append(
                TaskInstance(
                    id=self.instance_id(seed, knobs, i),
                    prompt=f"{knobs.houses} houses. {header}\n{clue_text}\nhouse {house} {category}?",
                    answer=answer,
                    difficulty=f"{knobs.houses}x{knobs.attributes}",
                    meta={
                        "houses": knobs.houses,
                        "categories": categories,
                        "clues": [list(c) for c in clues],
                        "solution": grid,
                        "question": [house, category],
                    },
                )
            )
        return out

    @staticmethod
    def demonstration(instance: TaskInstance, role_index: int) -> str:
        """Warm-start data: every role of a generic team writes the value asked for (the verifier accepts it)."""
        return str(instance.answer)

    def extract_answer(self, response: str) -> str | None:
        line = last_line(response)
        return line.lower().rstrip(".") if line else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        return float(self.extract_answer(response) == instance.answer)

    @staticmethod
    def solutions(meta: dict, limit: int = 2) -> list[dict[str, int]]:
        """Up to `limit` grids satisfying the rendered clues, found by python-constraint2."""
        from constraint import AllDifferentConstraint, Problem

        problem = Problem()
        houses = range(1, meta["houses"] + 1)
        for values in meta["categories"].values():
            problem.addVariables(values, list(houses))
            problem.addConstraint(AllDifferentConstraint(), values)
        relations = {
            "=": lambda a, b: a == b,
            "<": lambda a, b: b == a + 1,
            "~": lambda a, b: abs(a - b) == 1,
            "<<": lambda a, b: a < b,
            ">>": lambda a, b: a > b,
            "_": lambda a, b: abs(a - b) == 2,
            "__": lambda a, b: abs(a - b) == 3,
        }
        for op, a, b in meta["clues"]:
            if op == "@":
                problem.addConstraint(lambda x, h=int(b): x == h, [a])
            elif op == "!":
                problem.addConstraint(lambda x, h=int(b): x != h, [a])
            else:
                problem.addConstraint(relations[op], [a, b])
        found = []
        for solution in problem.getSolutionIter():
            found.append(dict(solution))
            if len(found) >= limit:
                break
        return found


def _compact_clue(clue, names: dict) -> tuple[str, str, str]:
    symbol = _CLUE_SYMBOLS[type(clue).__name__]
    if symbol in ("@", "!"):
        return (symbol, names[clue.value], str(clue.house))
    return (symbol, names[clue.value1], names[clue.value2])


def _render_clue(clue: tuple[str, str, str]) -> str:
    op, a, b = clue
    return f"{a}{op}{b}"
