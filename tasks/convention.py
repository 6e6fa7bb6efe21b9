"""Convention chain: the chain's running sums, in the notation the first role chose.

The prompt is a chain task, `3+7+9+5`. Role k writes the partial sums so far and the operands left:
role 1 `10:9+5`, role 2 `10,19:5`, role 3 `10,19,24` (the final message: every partial sum). A partial
sum may be written in one of two notations, digits (`19`) or reversed digits (`91`, least significant
first); the first role picks one, and every later role must read and continue in the notation actually
used. The verifier accepts the final list in either notation, only if every entry is right in that
same notation: `10,19,24` and `01,91,42` pass, `01,19,24` does not.

So a role's right message depends on what the earlier roles wrote (unlike `chain`, whose right message
is the same whatever the teammates do), and a one-digit partial sum reads the same in both notations:
a role that meets `7:9+5` cannot tell which notation the team is in, and either continuation is right
until a later role makes the choice visible (the partly unreadable contexts of the exact lab's
`convention_instance`, theory/env.py). Each role's job is local: copy the previous message's
sums, add the last sum and the first operand left in the notation the sums are in, copy the rest.

Hooks (as in the other families): `demonstration(instance, i)`, role i's correct message in the
instance's demonstrated notation (`meta["reversed"]`, drawn per instance, about half of each), and
`alternative(instance, i)`, the same message in the other notation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from teamtr.graphs.task import TaskInstance
from teamtr.tasks._knobs import KnobbedFamily
from teamtr.tasks._text import last_line
from teamtr.tasks.family_settings import WarmStart

_FINAL = re.compile(r"\d+(?:,\d+)*")


@dataclass(frozen=True)
class ConventionDifficulty:
    """Defaults: 3 additions (one per role of a 3-role team), operands 1..9 (sums up to 36)."""

    steps: int = 3
    max_operand: int = 9

    def __post_init__(self) -> None:
        if not 1 <= self.steps <= 12 or not 1 <= self.max_operand <= 99:
            raise ValueError("convention: steps must be in 1..12 and max_operand in 1..99")


def _write(value: int, reversed_digits: bool) -> str:
    return str(value)[::-1] if reversed_digits else str(value)


def partial_sums(operands: list[int]) -> list[int]:
    """The running sums after each addition: [a+b, a+b+c, ...]."""
    out, total = [], operands[0]
    for x in operands[1:]:
        total += x
        out.append(total)
    return out


class ConventionChain(KnobbedFamily[ConventionDifficulty]):
    name = "convention"
    description = "running sums kept in the notation the first role chose (digits or reversed digits)"
    knobs_type = ConventionDifficulty
    system_prompt = "Continue the sums."
    # the chain's sums, each role copying the earlier ones in the first role's notation: chain's defaults;
    # beyond 3 roles the budget grows (convention at 4 roles ran out of 600 steps at 0%)
    warm_start = WarmStart(scaled_budget=(3, 700))

    def generate(self, n: int, seed: int, **difficulty: int) -> list[TaskInstance]:
        knobs = self.knobs(difficulty)
        out = []
        for i in range(n):
            rng = self.instance_rng(seed, knobs, i)
            ops = [rng.randint(1, knobs.max_operand) for _ in range(knobs.steps + 1)]
            out.append(
                TaskInstance(
                    id=self.instance_id(seed, knobs, i),
                    prompt="+".join(map(str, ops)),
                    answer=sum(ops),
                    difficulty=f"steps={knobs.steps},max={knobs.max_operand}",
                    meta={"operands": ops, "reversed": rng.random() < 0.5},
                )
            )
        return out

    @staticmethod
    def message(operands: list[int], role_index: int, reversed_digits: bool) -> str:
        """Role i's (0-based) correct message in one notation: sums so far, then `:` and what is left."""
        sums = ",".join(_write(s, reversed_digits) for s in partial_sums(operands)[: role_index + 1])
        rest = operands[role_index + 2 :]
        return f"{sums}:{'+'.join(map(str, rest))}" if rest else sums

    @classmethod
    def demonstration(cls, instance: TaskInstance, role_index: int) -> str:
        return cls.message(instance.meta["operands"], role_index, instance.meta["reversed"])

    @classmethod
    def alternative(cls, instance: TaskInstance, role_index: int) -> str:
        """The same message in the notation the demonstration does not use (also right for role 1)."""
        return cls.message(instance.meta["operands"], role_index, not instance.meta["reversed"])

    def extract_answer(self, response: str) -> str | None:
        """The final line must be the complete comma-separated list of sums; the answer is its last
        entry read in the notation in which every entry is written without a leading zero (digits
        first where both read cleanly, e.g. when every entry is one digit)."""
        line = last_line(response) or ""
        if not _FINAL.fullmatch(line):
            return None
        entries = line.split(",")
        for reversed_digits in (False, True):
            read = [e[::-1] if reversed_digits else e for e in entries]
            if all(r == str(int(r)) for r in read):
                return read[-1]
        return None

    def verify(self, instance: TaskInstance, response: str) -> float:
        """1 iff the final line lists every partial sum, all right in one and the same notation."""
        line = last_line(response) or ""
        ops = instance.meta["operands"]
        return float(line in (self.message(ops, len(ops) - 2, False), self.message(ops, len(ops) - 2, True)))
