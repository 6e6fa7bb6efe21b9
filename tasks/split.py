"""Split information: each role holds one lookup table; only the team together can answer.

The coordination family. A start symbol is followed through `hops` tables (`a2>b1` maps a2 to b1);
table i is private to role i, so role i must read the symbol the previous role wrote, look it up in its
own table and pass the result on; the last role's message is the answer. No role can skip another:
it rewards exactly the hand-offs a team must learn, and a role that learns to write its result in the
form the next role reads improves the team.

    public prompt (every role):  start a2, 3 tables
    role 1's view: a1>b3 a2>b1 a3>b2     role 2's view: b1>c2 ...     role 3's view: c2>d1 ...
    answer: d1   (the roles write the rows they used: `a2>b1`, `b1>c2`, `c2>d1`)

Optional hooks (not part of the TaskFamily protocol): `role_view(instance, i)` is the private text of
role i, which a team graph appends to that role's context; `full_prompt(instance)` is the prompt with
every table, for a single model (the best-of-N baseline) that plays all roles at once;
`demonstration(instance, i)` is the correct message of role i (warm-start data).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from teamtr.graphs.task import TaskInstance
from teamtr.tasks._knobs import KnobbedFamily
from teamtr.tasks._text import last_line
from teamtr.tasks.family_settings import WarmStart

_FINAL_LINE = re.compile(r"(?:[a-z]\d+>)?([a-z]\d+)")


@dataclass(frozen=True)
class SplitDifficulty:
    """Defaults: 3 hops (one per role of a 3-role team), tables of 4 entries (a guess is right 1/4 of
    the time). hops=1, size=2 is very easy."""

    hops: int = 3
    size: int = 4  # entries per table

    def __post_init__(self) -> None:
        if not 1 <= self.hops <= 25 or not 1 <= self.size <= 9:
            raise ValueError("split: hops must be in 1..25 and size in 1..9")


def _symbol(layer: int, k: int) -> str:
    return f"{chr(ord('a') + layer)}{k}"


class Split(KnobbedFamily[SplitDifficulty]):
    name = "split"
    description = "pointer chase through per-role private tables (split information; coordination)"
    knobs_type = SplitDifficulty
    system_prompt = "Look up the symbol."
    # a guess is right 1/4 of the time; each role's context is its own (its private table), so nothing is
    # packed: smaller batches, more steps (not learnt within this budget)
    warm_start = WarmStart(dict(max_steps=1000, batch_size=8, stop_accuracy=0.45, band=(0.35, 0.75)))

    def generate(self, n: int, seed: int, **difficulty: int) -> list[TaskInstance]:
        knobs = self.knobs(difficulty)
        out = []
        for i in range(n):
            rng = self.instance_rng(seed, knobs, i)
            tables = []
            for layer in range(knobs.hops):
                targets = list(range(1, knobs.size + 1))
                rng.shuffle(targets)
                tables.append({_symbol(layer, k + 1): _symbol(layer + 1, t) for k, t in enumerate(targets)})
            start = _symbol(0, rng.randint(1, knobs.size))
            path = [start]
            for table in tables:
                path.append(table[path[-1]])
            views = [
                " ".join(f"{a}>{b}" for a, b in sorted(t.items(), key=lambda kv: rng.random()))
                for t in tables
            ]
            out.append(
                TaskInstance(
                    id=self.instance_id(seed, knobs, i),
                    prompt=f"start {start}, {knobs.hops} tables",
                    answer=path[-1],
                    difficulty=f"hops={knobs.hops},size={knobs.size}",
                    meta={"views": views, "path": path},
                )
            )
        return out

    @staticmethod
    def role_view(instance: TaskInstance, role_index: int) -> str:
        """Role i's private table (0-based; roles beyond the number of tables see nothing)."""
        views = instance.meta["views"]
        return views[role_index] if role_index < len(views) else ""

    @staticmethod
    def full_prompt(instance: TaskInstance) -> str:
        return instance.prompt + "\n" + "\n".join(instance.meta["views"])

    @staticmethod
    def demonstration(instance: TaskInstance, role_index: int) -> str:
        """Role i's correct message: the row of its own table it used, `b1>c3` (the symbol the
        previous role passed on, then its lookup). Writing the key first makes the lookup a copy of
        what follows that key in the table, which a small model learns; the next role reads the last
        symbol."""
        path = instance.meta["path"]
        return f"{path[role_index]}>{path[role_index + 1]}"

    def extract_answer(self, response: str) -> str | None:
        """The final line is the answer symbol, optionally after the key it was looked up with
        (`d2` or `c3>d2`)."""
        match = _FINAL_LINE.fullmatch(last_line(response) or "")
        return match.group(1) if match else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        return float(self.extract_answer(response) == instance.answer)
