"""The power of `teamtr improve`'s default gate and canary (docs/improve.md), by simulation: rewards are
Bernoulli (a verifier or thumbs-up feedback), the incumbent's at 0.5, the candidate's 0.5 + delta.

    canary  two-sided 95% confidence sequence on paired differences, looked at after every pair, promote
            when the lower bound > 0, roll back when the upper < 0 or at the cap (400 canary episodes)
    gate    one-sided 95% lower bound on n held-out prompts' differences (one greedy answer each)

    .venv/bin/python benchmarks/improve_power.py
"""

from __future__ import annotations

import numpy as np

from teamtr.training.improve.stats import confidence_path

REPS, CAP, P = 1000, 400, 0.5


def canary(delta: float, rng: np.random.Generator) -> tuple[float, float, float]:
    promoted = rolled_back_early = 0
    stops = []
    for _ in range(REPS):
        d = (rng.random(CAP) < P + delta).astype(float) - (rng.random(CAP) < P)
        lower, upper = confidence_path(d, -1, 1, 0.05)
        up, down = (
            np.argmax(lower > 0) if (lower > 0).any() else CAP,
            np.argmax(upper < 0) if (upper < 0).any() else CAP,
        )
        if up < down:
            promoted += 1
        elif down < CAP:
            rolled_back_early += 1
        stops.append(min(up, down, CAP - 1) + 1)
    return promoted / REPS, rolled_back_early / REPS, float(np.median(stops))


def gate(delta: float, n: int, rng: np.random.Generator) -> float:
    passed = 0
    for _ in range(REPS):
        d = (rng.random(n) < P + delta).astype(float) - (rng.random(n) < P)
        passed += confidence_path(d, -1, 1, 0.05, sides=1, horizon=n)[0][-1] > 0
    return passed / REPS


def main() -> None:
    rng = np.random.default_rng(0)
    print("canary (cap 400): delta, P(promote), P(rolled back early), median pairs at the stop")
    for delta in (-0.1, 0.0, 0.1, 0.2, 0.3, 0.5):
        print(f"  {delta:+.1f}", *(f"{x:.3f}" for x in canary(delta, rng)))
    print("gate: n held-out prompts, P(pass) at delta 0, 0.1, 0.2, 0.3, 0.5")
    for n in (12, 32, 64, 128, 256, 512):
        print(f"  {n:4d}", *(f"{gate(d, n, rng):.3f}" for d in (0.0, 0.1, 0.2, 0.3, 0.5)))


if __name__ == "__main__":
    main()
