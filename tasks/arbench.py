"""Active reasoning in the style of AR-Bench GN (guessing numbers): find a hidden code by asking.

A secret of `digits` distinct digits from 0..pool-1 is hidden. Asking a guess returns bulls-and-cows
feedback as AR-Bench GN does, written `xAyB`: x digits right and in the right place, y right but
misplaced. The team's final message must state the secret.

Two ways to play, one verifier:
- interactive: a team graph node calls `oracle(instance, question)` with a guess and appends the
  feedback to the shared transcript (the optional hook; the `TaskFamily` protocol does not need it);
- from hints: with `hints="unique"` (default) the prompt already lists guesses and their feedback,
  enough that exactly one secret fits them, so the task is a deduction a team can solve without
  the hook; `hints=k` lists k random guesses; `hints=0` is the pure interactive game.

    code 3 of 0-4. 012:1A1B 340:0A2B 213:0A2B
    102
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from teamtr.graphs.task import TaskInstance
from teamtr.tasks._knobs import KnobbedFamily
from teamtr.tasks._text import last_line
from teamtr.tasks.family_settings import WarmStart


@dataclass(frozen=True)
class ArbenchDifficulty:
    """Defaults: 2 digits from 0-3 (12 codes), hints until the code is unique: small enough for a tiny
    model to learn part of it (why not more: docs/evals.md, "Headroom"). digits=1, pool=2 is very
    easy; AR-Bench GN is digits=4, pool=10, hints=0 with 25 questions."""

    digits: int = 2
    pool: int = 4
    hints: int | str = "unique"  # "unique" or a number of hint guesses (0 = interactive only)

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= self.pool <= 10:
            raise ValueError("arbench: need 1 <= digits <= pool <= 10")
        if self.hints != "unique" and (not isinstance(self.hints, int) or self.hints < 0):
            raise ValueError("arbench: hints must be 'unique' or an integer >= 0")


def feedback(secret: str, guess: str) -> str:
    """Bulls and cows as `xAyB`."""
    bulls = sum(s == g for s, g in zip(secret, guess, strict=True))
    cows = len(set(secret) & set(guess)) - bulls
    return f"{bulls}A{cows}B"


class Arbench(KnobbedFamily[ArbenchDifficulty]):
    name = "arbench"
    description = "guess a hidden code from bulls-and-cows feedback (AR-Bench GN style; optional oracle)"
    knobs_type = ArbenchDifficulty
    system_prompt = "Find the code."
    warm_start = WarmStart(dict(max_steps=1600))  # reaches its band within it

    def generate(self, n: int, seed: int, **difficulty) -> list[TaskInstance]:
        knobs = self.knobs(difficulty)
        codes = ["".join(p) for p in itertools.permutations("0123456789"[: knobs.pool], knobs.digits)]
        out = []
        for i in range(n):
            rng = self.instance_rng(seed, knobs, i)
            secret = rng.choice(codes)
            hints: list[tuple[str, str]] = []
            candidates = codes
            while (knobs.hints == "unique" and len(candidates) > 1) or (
                knobs.hints != "unique" and len(hints) < knobs.hints
            ):
                asked = {g for g, _ in hints}
                unasked = [c for c in codes if c != secret and c not in asked]
                if not unasked:
                    break
                guess = rng.choice(unasked)
                hints.append((guess, feedback(secret, guess)))
                candidates = [c for c in candidates if feedback(c, guess) == hints[-1][1]]
            hint_text = " ".join(f"{g}:{f}" for g, f in hints)
            out.append(
                TaskInstance(
                    id=self.instance_id(seed, knobs, i),
                    prompt=f"code {knobs.digits} of 0-{knobs.pool - 1}. {hint_text}".strip(),
                    answer=secret,
                    difficulty=f"digits={knobs.digits},pool={knobs.pool},hints={knobs.hints}",
                    meta={"digits": knobs.digits, "pool": knobs.pool, "hints": hints},
                )
            )
        return out

    def oracle(self, instance: TaskInstance, question: str) -> str:
        """The simulated oracle: feedback on the last guess of `digits` distinct digits in `question`."""
        digits = instance.meta["digits"]
        guesses = re.findall(rf"(?<!\d)\d{{{digits}}}(?!\d)", question)
        valid = [g for g in guesses if len(set(g)) == digits and int(max(g)) < instance.meta["pool"]]
        if not valid:
            return f"ask {digits} different digits from 0-{instance.meta['pool'] - 1}"
        return feedback(instance.answer, valid[-1])

    @staticmethod
    def demonstration(instance: TaskInstance, role_index: int) -> str:
        """Warm-start data: every role of a generic team writes the secret code (the verifier accepts it)."""
        return str(instance.answer)

    def extract_answer(self, response: str) -> str | None:
        line = last_line(response)
        return line if line and line.isdigit() else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        return float(self.extract_answer(response) == instance.answer)
