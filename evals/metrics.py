"""pass@k and avg@k over per-instance samples, with bootstrap confidence intervals.

pass@k uses the unbiased estimator of Chen et al. (2021): with n >= k samples of which c are correct,
pass@k = 1 - C(n - c, k) / C(n, k), averaged over instances. avg@k is the mean reward of the samples
(for 0/1 rewards: the per-sample accuracy). Confidence intervals are percentile bootstrap intervals over
instances (scipy.stats.bootstrap), so they reflect which problems happened to be drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

CORRECT = 1.0  # a sample counts as correct for pass@k when its reward is at least this


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one instance with n samples, c correct (1 - C(n-c, k) / C(n, k))."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class Estimate:
    """A point estimate with a (low, high) confidence interval."""

    value: float
    low: float
    high: float

    def as_dict(self) -> dict:
        return asdict(self)


def bootstrap_mean(values: Sequence[float], confidence: float = 0.95, seed: int = 0) -> Estimate:
    """Mean with a percentile bootstrap interval over the values (one per instance)."""
    from scipy.stats import bootstrap

    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to estimate from")
    mean = float(data.mean())
    if data.size < 2 or np.all(data == data[0]):  # no spread: the interval is the point
        return Estimate(mean, mean, mean)
    result = bootstrap(
        (data,),
        np.mean,
        confidence_level=confidence,
        n_resamples=2000,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return Estimate(mean, float(result.confidence_interval.low), float(result.confidence_interval.high))


def per_instance_pass_at_k(rewards: Sequence[Sequence[float]], k: int) -> list[float]:
    return [pass_at_k(len(r), sum(x >= CORRECT for x in r), k) for r in rewards]


def summarize(
    rewards: Sequence[Sequence[float]], k: int, confidence: float = 0.95, seed: int = 0
) -> dict[str, dict]:
    """pass@k and avg@k (with intervals) for per-instance reward lists of at least k samples each."""
    if not rewards:
        raise ValueError("no instances")
    short = [len(r) for r in rewards if len(r) < k]
    if short:
        raise ValueError(f"every instance needs >= k={k} samples; some have {min(short)}")
    pass_k = per_instance_pass_at_k(rewards, k)
    avg_k = [float(np.mean(r)) for r in rewards]
    return {
        "pass_at_k": bootstrap_mean(pass_k, confidence, seed).as_dict(),
        "avg_at_k": bootstrap_mean(avg_k, confidence, seed).as_dict(),
    }


def pass_at_k_curve(rewards: Sequence[Sequence[float]]) -> dict[int, float]:
    """pass@j for j = 1..n (n = the fewest samples of any instance), for plots."""
    n = min(len(r) for r in rewards)
    return {j: float(np.mean(per_instance_pass_at_k(rewards, j))) for j in range(1, n + 1)}
