"""The tests the gate and the canary decide on, and the sizing `teamtr improve` prints before it starts.

gate (one look, a fixed number n of held-out prompts): a one-sided paired test at level
    alpha = 1 - confidence (`gate_test`):
    - binary rewards (every per-prompt reward at either end of its range) and superiority: the exact sign
      test on the discordant prompts (McNemar's exact test): under "not better", a prompt the two teams
      answer differently is won by the candidate with probability <= 1/2, so with b won and c lost,
      p = P(Binomial(b + c, 1/2) >= b). Exact at every n, no approximation;
    - otherwise (mean rewards over several sampled episodes, graded rewards, or a non-inferiority
      margin): the one-sided paired t-test of the mean per-prompt difference against -margin, p from
      Student's t with n - 1 degrees of freedom. Approximation: the mean difference is near normal (the
      central limit theorem; the differences are bounded, so it is close from a few dozen prompts on;
      at a handful of prompts with skewed differences its level can be off by a few points).

canary (looked at after every poll, stops at the first crossing): a betting test (`canary_crossings`),
    the diversified-Kelly capital process of Waudby-Smith & Ramdas ("Estimating means of bounded random
    variables by betting", JRSS B 2023, Section 5: the average of the capitals of constant bets on a
    grid of bet sizes). For differences d in [-1, 1] (rescaled from the reward range) and the null
    "mean <= m0" (m0 = 0, or -margin):

        K_t(m0) = mean over beta in BETS of  prod_{i <= t} (1 + beta (d_i - m0))

    a nonnegative supermartingale under the null, so by Ville's inequality P(sup_t K_t >= 1/a) <= a:
    promoting at the first t where K_t >= 2 / (1 - confidence) is wrong with probability at most
    (1 - confidence) / 2, however often it is looked at. The mirror process (1 - beta (d_i - m0)) tests
    "mean >= m0" the same way (rolled back early as shown worse). Pairs enter in a fixed order (the
    canary episodes' start order), so the first crossing is a stopping time.

Also here: the always-valid empirical-Bernstein confidence sequence the gate used to decide on
(`confidence_path`, Waudby-Smith & Ramdas Theorem 2; kept for benchmarks/improve_power.py's comparison
and for tests that bound a gain they look at once or often).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

BET_CAP = 0.75  # the empirical-Bernstein sequence's c (1/2 or 3/4 in the paper)
# the canary's diversified-Kelly grid of bet sizes on differences in [-1, 1]: the growth-optimal
# constant bet is about gain / variance of the difference, so this covers gains of ~0.05 to ~0.5
BETS = (0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
BET_LIMIT = 0.9  # no bet risks more than this share of the capital on one pair


@dataclass(frozen=True)
class Bound:
    n: int
    mean: float
    lower: float  # -inf when one-sided upper, ...
    upper: float  # ... +inf when one-sided lower


# ---- the gate: one look at n prompts -------------------------------------------------------------------


@dataclass(frozen=True)
class GateTest:
    method: str  # "exact sign test (McNemar)" | "paired t-test"
    n: int
    mean: float  # mean per-prompt difference, candidate - incumbent
    lower: float  # the one-sided lower `confidence` bound of the mean difference (see gate_test)
    p_value: float
    passed: bool
    wins: int = 0  # prompts the candidate did better on ...
    losses: int = 0  # ... and worse


def _is_binary(values: np.ndarray, lo: float, hi: float) -> bool:
    return bool(np.all(np.isclose(values, lo) | np.isclose(values, hi)))


def gate_test(
    candidate: list[float] | np.ndarray,
    incumbent: list[float] | np.ndarray,
    lo: float,
    hi: float,
    confidence: float,
    margin: float = 0.0,
) -> GateTest:
    """The gate's decision on per-prompt rewards (index i: the same prompt) in [lo, hi]: pass when the
    candidate is shown better (margin 0) or not worse by more than `margin`, one-sided at
    alpha = 1 - confidence.

    Sign test: `lower` is the discordant share times (2 theta_L - 1) times the range, theta_L the exact
    (Clopper-Pearson) lower bound of P(the candidate wins | the prompt is discordant); it is >= 0
    exactly when the test passes (the sign test and that bound are the same statement). t-test: the
    t lower bound, never below the range's own floor lo - hi (so a margin >= hi - lo passes whatever
    the data, as the range alone proves it)."""
    c, i = np.asarray(candidate, dtype=np.float64), np.asarray(incumbent, dtype=np.float64)
    if c.shape != i.shape:
        raise ValueError(f"the gate pairs prompts: {c.size} candidate rewards, {i.size} incumbent")
    alpha, width = 1.0 - confidence, hi - lo
    d = c - i
    n = int(d.size)
    mean = float(d.mean()) if n else math.nan
    if margin == 0.0 and n and _is_binary(c, lo, hi) and _is_binary(i, lo, hi):
        wins, losses = int((d > 0).sum()), int((d < 0).sum())
        k = wins + losses
        p = float(sps.binom.sf(wins - 1, k, 0.5)) if k else 1.0
        theta = float(sps.beta.ppf(alpha, wins, k - wins + 1)) if wins else 0.0
        lower = (k / n) * (2 * theta - 1) * width if k else 0.0
        return GateTest("exact sign test (McNemar)", n, mean, lower, p, p <= alpha, wins, losses)
    floor = lo - hi
    if n < 2:
        lower, p = floor, (0.0 if floor > -margin else 1.0)
    else:
        se = float(d.std(ddof=1)) / math.sqrt(n)
        if se == 0.0:
            lower, p = mean, (0.0 if mean > -margin else 1.0)
        else:
            lower = mean - float(sps.t.ppf(confidence, n - 1)) * se
            p = float(sps.t.sf((mean + margin) / se, n - 1))
        if floor > -margin:
            lower, p = max(lower, floor), 0.0
    lower = max(lower, floor)
    return GateTest(
        "paired t-test", n, mean, lower, p, lower > -margin, int((d > 0).sum()), int((d < 0).sum())
    )


def gate_power(delta: float, n: int, confidence: float, base: float = 0.5) -> float:
    """Exact power of the sign-test gate at n prompts, binary rewards, the incumbent right with
    probability `base`, the candidate with base + delta, independently (no pairing gain: the worst case).
    """
    pc, pi = base + delta, base
    q = pc * (1 - pi) + pi * (1 - pc)  # P(discordant)
    if n < 1 or q <= 0:
        return 0.0
    theta = pc * (1 - pi) / q
    k = np.arange(n + 1)
    # the smallest number of wins that passes with k discordant prompts (k + 1: never)
    need = np.where(k > 0, sps.binom.isf(1.0 - confidence, np.maximum(k, 1), 0.5) + 1, 1)
    return float(np.sum(sps.binom.pmf(k, n, q) * sps.binom.sf(need - 1, k, theta)))


def gate_detectable(n: int, confidence: float, power: float = 0.8, base: float = 0.5) -> float:
    """The smallest gain (0.005 steps) the gate passes with `power` at n prompts (nan: none up to 1 - base)."""
    for delta in np.arange(0.005, 1 - base + 1e-9, 0.005):
        if gate_power(float(delta), n, confidence, base) >= power:
            return float(round(delta, 3))
    return math.nan


def gate_prompts_for(delta: float, confidence: float, power: float = 0.8, base: float = 0.5) -> int:
    """The fewest held-out prompts at which the gate passes a gain of `delta` with `power` (and every
    larger n up to 1.25x it: the sign test's power saw-tooths with n)."""
    lo, hi = 1, 2
    while gate_power(delta, hi, confidence, base) < power:
        lo, hi = hi, hi * 2
        if hi > 1 << 20:
            return -1
    while lo < hi:  # bisection on the saw-tooth's envelope, then step up until it holds above
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if gate_power(delta, mid, confidence, base) < power else (lo, mid)
    while any(gate_power(delta, m, confidence, base) < power for m in range(lo, lo + max(2, lo // 4))):
        lo += 1
    return lo


# ---- the canary: a betting test looked at after every pair ---------------------------------------------


def _capital(z: np.ndarray, m: float, sign: int) -> np.ndarray:
    """log of the diversified-Kelly capital after each pair (last axis), betting that the mean of z in
    [-1, 1] is above m (sign 1) or below it (sign -1)."""
    room = 1 + m if sign > 0 else 1 - m  # the most a pair can lose per unit bet
    cap = BET_LIMIT / room if room > 0 else math.inf
    g = sign * (z - m)
    logs = [np.cumsum(np.log1p(min(b, cap) * g), axis=-1) for b in BETS]
    return np.logaddexp.reduce(logs, axis=0) - math.log(len(BETS))


def canary_crossings(
    d: np.ndarray, lo: float, hi: float, confidence: float, margin: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """For paired differences d (last axis: pairs in order; any leading axes: independent runs) of
    rewards in [lo, hi]: the index of the pair at which the promote test (null: mean <= -margin) first
    rejects, and the one at which the roll-back test (null: mean >= -margin) first does; d.shape[-1]
    where it never does. Each errs with probability <= (1 - confidence) / 2 (Ville's inequality)."""
    width = hi - lo
    z = np.asarray(d, dtype=np.float64) / width
    m = -margin / width
    n = z.shape[-1]
    threshold = math.log(2 / (1 - confidence))

    def first(hit: np.ndarray) -> np.ndarray:
        return np.where(hit.any(axis=-1), hit.argmax(axis=-1), n)

    if n == 0:
        return np.zeros(z.shape[:-1], dtype=int), np.zeros(z.shape[:-1], dtype=int)
    if m < -1:  # "not worse by more than the margin" holds for any rewards in the range
        up = np.zeros(z.shape[:-1], dtype=int)
    else:
        up = first(_capital(z, m, 1) >= threshold)
    down = np.full(z.shape[:-1], n) if m >= 1 else first(_capital(z, m, -1) >= threshold)
    return up, down


def canary_bounds(d: list[float] | np.ndarray, lo: float, hi: float, confidence: float) -> Bound:
    """The confidence sequence the canary's tests make (shown, not decided on): the means m on a grid of
    0.01 (of the difference's range) that neither test has rejected at any pair so far; [lower, upper]
    is their span."""
    z = np.asarray(d, dtype=np.float64) / (hi - lo)
    if z.size == 0:
        return Bound(0, math.nan, lo - hi, hi - lo)
    threshold = math.log(2 / (1 - confidence))
    grid = np.linspace(-1, 1, 201)
    kept = [m for m in grid if _capital(z, m, 1).max() < threshold and _capital(z, m, -1).max() < threshold]
    mean = float(z.mean())
    if not kept:  # every m rejected (cannot happen below ~1e6 pairs): the mean alone
        kept = [mean]
    width = hi - lo
    return Bound(int(z.size), mean * width, min(kept) * width, max(kept) * width)


def canary_simulate(
    delta: float, pairs: int, confidence: float, runs: int = 2000, seed: int = 0, base: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """canary_crossings on `runs` simulated canaries of `pairs` pairs: binary rewards, the incumbent's
    right with probability `base`, the candidate's with base + delta, independently (no pairing gain).
    The same seed gives the same draws at every delta (so power is monotone in delta)."""
    rng = np.random.default_rng(seed)
    u, v = rng.random((runs, pairs)), rng.random((runs, pairs))
    d = (u < base + delta).astype(np.float64) - (v < base)
    return canary_crossings(d, 0.0, 1.0, confidence)


def canary_promoted(delta: float, pairs: int, confidence: float, runs: int = 2000, seed: int = 0) -> float:
    """The share of simulated canaries promoted within `pairs` pairs (the first crossing is promote's)."""
    up, down = canary_simulate(delta, pairs, confidence, runs, seed)
    return float(np.mean((up < pairs) & (up < down)))


def canary_detectable(pairs: int, confidence: float, power: float = 0.8, runs: int = 400) -> float:
    """The smallest gain (0.01 steps) promoted with `power` within `pairs` pairs, by simulation."""
    if canary_promoted(0.5, pairs, confidence, runs) < power:
        return math.nan
    lo, hi = 1, 50  # in hundredths
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if canary_promoted(mid / 100, pairs, confidence, runs) < power else (lo, mid)
    return lo / 100


def canary_pairs_for(delta: float, confidence: float, power: float = 0.8, runs: int = 400) -> int:
    """The pairs within which a gain of `delta` is promoted with `power` (the power-quantile of the
    simulated stopping time), by simulation (-1: not within 64,000)."""
    cap = 1000
    while cap <= 64_000:
        up, down = canary_simulate(delta, cap, confidence, runs)
        stop = np.where((up < down) & (up < cap), up + 1, cap + 1)
        q = float(np.quantile(stop, power))
        if q <= cap:
            return int(math.ceil(q))
        cap *= 4
    return -1


# ---- sizing: what a window and a cap can detect ------------------------------------------------------


def sizing(
    held_out: int,
    distinct: int,
    held_out_fraction: float,
    gate_confidence: float,
    canary_pairs: int,
    canary_share: float,
    canary_confidence: float,
    target: float = 0.1,
    power: float = 0.8,
) -> list[str]:
    """What `teamtr improve` says before it starts: the smallest gain in mean reward its gate (at
    `held_out` prompts of a window of `distinct`) and its canary (within `canary_pairs` pairs) detect with
    `power`, and the served prompts a gain of `target` needs. Binary rewards at 0.5, arms independent:
    the worst case (graded rewards, or a pairing that correlates the arms, need fewer)."""
    gate_gain = gate_detectable(held_out, gate_confidence, power)
    gate_need = gate_prompts_for(target, gate_confidence, power)
    window_need = math.ceil(gate_need / held_out_fraction)
    canary_gain = canary_detectable(canary_pairs, canary_confidence, power)
    canary_need = canary_pairs_for(target, canary_confidence, power)
    more = max(0, window_need - distinct)

    def gain(x: float, digits: int) -> str:
        return f"a gain of +{x:.{digits}f}" if math.isfinite(x) else "no gain up to +0.5 (the most from 0.5)"

    return [
        f"sizing ({power:.0%} power; binary rewards at 0.5, arms independent: the worst case): the gate "
        f"({held_out} held-out prompts, one-sided {gate_confidence:.0%}) detects {gain(gate_gain, 3)}; "
        f"+{target:g} needs {gate_need} held-out prompts, a window of {window_need} "
        f"distinct prompts at --held-out {held_out_fraction:g}: "
        + (f"{more} more served prompts" if more else "this window has them"),
        f"sizing: the canary (cap {canary_pairs} pairs, {(1 - canary_confidence) / 2:.1%} per side, looked "
        f"at after every pair) detects {gain(canary_gain, 2)} within its cap; +{target:g} needs "
        f"{canary_need} pairs, {math.ceil(canary_need / max(canary_share, 1e-9))} served requests at share "
        f"{canary_share:g}"
        + (
            f" (more than its cap: raise --canary-episodes to {canary_need})"
            if canary_need > canary_pairs
            else ""
        ),
    ]


# ---- the always-valid empirical-Bernstein sequence (the old gate's bound) ------------------------------


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
    n, tightest at n = horizon."""
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


def test_name(non_inferiority: float | None) -> str:
    """What a gate or canary tests: superiority (the default), or non-inferiority with its margin."""
    return "superiority" if non_inferiority is None else f"non-inferiority (margin {non_inferiority:g})"
