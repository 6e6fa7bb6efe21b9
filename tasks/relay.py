"""Blind relay: one role holds a value, the others pass it on without seeing it (hidden coupling).

The first role sees a private input, `value 7`, that the other roles' contexts do not include, and
writes the value once; the warm model writes its typical slip (value + 1 mod 10) part of the time.
Then roles 2..n take turns, two rounds (`RelayOrder`), each seeing only the public prompt and the
transcript, and each writes the value it believes: a copy of the last one, or a correction of the
typical slip (last - 1 mod 10). Reward 1 iff the final value is the private one. Two corrections of one
slip make a new error (as in refiner / critic loops), so a later role's right message depends on what
its teammates do, and it cannot see whether a slip happened: the coupling is hidden. `legibility` l is
the probability that a later role also sees the private input (drawn per role and episode); l = 1 is
the negative control. The exact twin is theory/env.py `relay_instance`.

The private views travel in `meta["role_views"]` (one text per role, in team order), which
graphs/team.py appends to each role's system prompt. The warm start's demonstrations are drawn per
instance and turn (`meta["demos"]`): role 1 writes the value with probability 1 - `slip`, else the
slip; a blind role copies, or with probability `correction / (2 (n - 1))` per turn corrects; a role
that sees the value writes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from teamtr.graphs.task import TaskInstance
from teamtr.tasks._knobs import KnobbedFamily
from teamtr.tasks._text import last_line
from teamtr.tasks.family_settings import WarmStart

ROUNDS = 2  # the later roles' rounds
_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class RelayDifficulty:
    """steps: roles n (>= 2); legibility: P(a later role sees the private input); slip: role 1's
    demonstrated slip rate; correction: a blind role's demonstrated corrections per episode in total."""

    steps: int = 4
    legibility: float = 0.0
    slip: float = 0.6
    correction: float = 0.3

    def __post_init__(self) -> None:
        if not 2 <= self.steps <= 12:
            raise ValueError("relay: steps (roles) must be in 2..12")
        for name in ("legibility", "slip", "correction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"relay: {name} must be in [0, 1]")


def speakers(n_roles: int) -> list[int]:
    """Role index of every turn: role 0 once, then roles 1..n-1 for ROUNDS rounds."""
    return [0] + [1 + k % (n_roles - 1) for k in range(ROUNDS * (n_roles - 1))]


def __getattr__(name: str):
    """`RelayOrder` and `relay_order` (the relay's router, a RoundRobin of graphs/team.py) are imported on
    first use: langgraph stays out of the task registry, so the CLI answers --help and errors at once."""
    if name in ("RelayOrder", "relay_order"):
        from teamtr.tasks import relay_order as module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class BlindRelay(KnobbedFamily[RelayDifficulty]):
    name = "relay"
    description = "pass on a value only the first role sees (hidden coupling; legibility knob)"
    knobs_type = RelayDifficulty
    system_prompt = "Pass on the value."
    # the demonstrations are drawn with slips and corrections, so greedy decoding (the argmax) is right nearly
    # always once the model copies (100% at step 40, when T = 1 was 15%): train a fixed number of steps (one
    # evaluation, at the end) so that the sampled mixture is learnt; the T = 1 team accuracy is the figure the
    # study needs in 40-60% (benchmarks/relay_study.py's warm cell)
    warm_start = WarmStart(dict(max_steps=600, eval_every=600, stop_accuracy=1.0, band=(0.0, 1.0)))

    def generate(self, n: int, seed: int, **difficulty: float) -> list[TaskInstance]:
        knobs = self.knobs(difficulty)
        roles = knobs.steps
        per_turn = knobs.correction / (ROUNDS * (roles - 1))
        out = []
        for i in range(n):
            rng = self.instance_rng(seed, knobs, i)
            value = rng.randrange(10)
            sees = [True] + [rng.random() < knobs.legibility for _ in range(roles - 1)]
            demos = [(value + (rng.random() < knobs.slip)) % 10]
            for r in speakers(roles)[1:]:
                demos.append(value if sees[r] else (demos[-1] - (rng.random() < per_turn)) % 10)
            out.append(
                TaskInstance(
                    id=self.instance_id(seed, knobs, i),
                    prompt=f"relay {roles}",
                    answer=value,
                    difficulty=f"steps={roles},l={knobs.legibility}",
                    meta={
                        "value": value,
                        "role_views": [f"value {value}" if s else "" for s in sees],
                        "demos": [str(d) for d in demos],
                    },
                )
            )
        return out

    @staticmethod
    def demonstration(instance: TaskInstance, turn: int) -> str:
        """The warm start's message at turn `turn` (0-based, over every turn of the episode)."""
        return instance.meta["demos"][turn]

    @staticmethod
    def stratum(instance: TaskInstance) -> int:
        """What every later turn's context depends on: the private value (training balances batches over it)."""
        return instance.meta["value"]

    def extract_answer(self, response: str) -> str | None:
        line = last_line(response) or ""
        return line if _DIGIT.fullmatch(line) else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        """1 iff the final message is the private value."""
        return float(self.extract_answer(response) == str(instance.meta["value"]))
