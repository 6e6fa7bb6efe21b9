"""The confidence bounds the gate and the canary decide on: an always-valid confidence sequence for the
mean of bounded values (the predictable plug-in empirical-Bernstein sequence of Waudby-Smith & Ramdas,
"Estimating means of bounded random variables by betting", JRSS B 2023, Theorem 2 / eq. (13)).

Valid at every n at once, so the canary may look after every episode and stop as soon as a bound
crosses (no peeking penalty beyond what the width already pays), and the gate's fixed-n bound is a
special case. Needs only independence and the values' range (no normal approximation, no bootstrap):
rewards in [lo, hi] make a difference of two rewards lie in [lo - hi, hi - lo].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BET_CAP = 0.75  # the paper's c: bets at most this big (1/2 or 3/4 there)


@dataclass(frozen=True)
class Bound:
    n: int
    mean: float
    lower: float  # -inf when one-sided upper, ...
    upper: float  # ... +inf when one-sided lower


def confidence_path(
    values: list[float] | np.ndarray,
    lo: float,
    hi: float,
    alpha: float,
    sides: int = 2,
    horizon: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) after each of the values (the running intersection), on the values' scale.
    `horizon`: the bets are tuned for that one n (the paper's fixed-time choice): still valid at every
    n, tightest at n = horizon (the gate's fixed number of prompts)."""
    y = (np.asarray(values, dtype=np.float64) - lo) / (hi - lo)  # in [0, 1]
    log_term = math.log(sides / alpha)
    t = np.arange(1, y.size + 1)
    mu = (0.5 + np.cumsum(y)) / (t + 1)  # mu_hat_t
    var = (0.25 + np.cumsum((y - mu) ** 2)) / (t + 1)  # sigma_hat^2_t
    mu_prev = np.concatenate([[0.5], mu[:-1]])
    var_prev = np.concatenate([[0.25], var[:-1]])
    spread = t * np.log1p(t) if horizon is None else np.full(t.size, float(horizon))
    lam = np.minimum(np.sqrt(2 * log_term / (var_prev * spread)), BET_CAP)
    psi = (-np.log1p(-lam) - lam) / 4
    v = 4 * (y - mu_prev) ** 2
    lam_sum = np.cumsum(lam)
    center = np.cumsum(lam * y) / lam_sum
    radius = (log_term + np.cumsum(v * psi)) / lam_sum
    lower = np.maximum.accumulate(np.maximum(center - radius, 0.0))
    upper = np.minimum.accumulate(np.minimum(center + radius, 1.0))
    return lo + (hi - lo) * lower, lo + (hi - lo) * upper


def confidence_sequence(
    values: list[float], lo: float, hi: float, alpha: float, sides: int = 2, horizon: int | None = None
) -> Bound:
    """Bounds on the mean of i.i.d. values in [lo, hi], valid with probability >= 1 - alpha uniformly over
    n (the running intersection: the tightest bound seen so far). sides=1: the lower bound only, at
    level alpha; sides=2: both, alpha shared between them."""
    x = np.asarray(values, dtype=np.float64)
    if x.size and (x.min() < lo - 1e-12 or x.max() > hi + 1e-12):
        raise ValueError(f"values outside their stated range [{lo}, {hi}]: {x.min()}..{x.max()}")
    if x.size == 0:
        return Bound(0, math.nan, -math.inf, math.inf)
    lower, upper = confidence_path(x, lo, hi, alpha, sides, horizon)
    return Bound(
        n=int(x.size),
        mean=float(x.mean()),
        lower=float(lower[-1]),
        upper=math.inf if sides == 1 else float(upper[-1]),
    )


def paired_differences(candidate: list[float], incumbent: list[float]) -> list[float]:
    """The canary's pairs: the k-th candidate episode's reward minus the k-th incumbent episode's, in the
    order they were served (independent episodes of the same traffic; the surplus of one arm waits)."""
    return [c - i for c, i in zip(candidate, incumbent, strict=False)]


def test_name(non_inferiority: float | None) -> str:
    """What a gate or canary tests: superiority (the default), or non-inferiority with its margin."""
    return "superiority" if non_inferiority is None else f"non-inferiority (margin {non_inferiority:g})"
