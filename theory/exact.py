"""Exact dynamic programming on a `TeamInstance`: occupancy, values, advantages, KLs, trust-region steps.

Notation (finite horizon T, discount gamma, reward only at the end):
  p_t(s)     probability that the context at turn t is s             (forward pass)
  d(s)       gamma^t p_t(s), the unnormalised discounted occupancy   (sums to sum_t gamma^t)
  Q_t(s,m)   expected discounted return after message m in s          (backward pass)
  V_t(s)     sum_m pi(m|s) Q_t(s,m);  A = Q - V;  J = sum_s p_0(s) V_0(s)
Performance difference (exact): J(pi') - J(pi) = sum_s d^{pi'}(s) sum_m pi'(m|s) A^pi(s,m).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from teamtr.theory.env import TeamInstance

Logits = list[np.ndarray]


@dataclass
class Evaluation:
    """Exact statistics of one team (one set of per-context policies)."""

    policy: list[np.ndarray]  # per layer (K_t, M): pi(m|s)
    p: list[np.ndarray]  # per layer (K_t,): context distribution at turn t
    d: list[np.ndarray]  # per layer (K_t,): gamma^t p_t
    Q: list[np.ndarray]  # per layer (K_t, M)
    V: list[np.ndarray]  # per layer (K_t,)
    J: float

    @property
    def A(self) -> list[np.ndarray]:
        return [Q - V[:, None] for Q, V in zip(self.Q, self.V, strict=True)]


def log_softmax(z: np.ndarray, axis: int = 1) -> np.ndarray:
    shifted = z - z.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def policies(logits: Logits) -> list[np.ndarray]:
    out = []
    for z in logits:
        e = np.exp(z - z.max(axis=1, keepdims=True))
        out.append(e / e.sum(axis=1, keepdims=True))
    return out


def evaluate(instance: TeamInstance, logits: Logits) -> Evaluation:
    pi = policies(logits)
    gamma = instance.gamma
    p = [instance.initial]
    for t, P in enumerate(instance.transitions[:-1]):
        p.append(np.einsum("s,sm,smn->n", p[t], pi[t], P))
    d = [gamma**t * pt for t, pt in enumerate(p)]
    T = instance.horizon
    Q: list[np.ndarray] = [np.empty(0)] * T
    V: list[np.ndarray] = [np.empty(0)] * T
    next_value = instance.reward  # the terminal reward is collected right after the last message
    for t in reversed(range(T)):
        Q[t] = instance.transitions[t] @ next_value
        V[t] = (pi[t] * Q[t]).sum(axis=1)
        next_value = gamma * V[t]
    J = float(instance.initial @ V[0])
    return Evaluation(policy=pi, p=p, d=d, Q=Q, V=V, J=J)


def masked_sum(values: list[np.ndarray], mask: list[np.ndarray]) -> float:
    return float(sum(v[m].sum() for v, m in zip(values, mask, strict=True)))


def agent_occupancy(ev: Evaluation, mask: list[np.ndarray]) -> list[np.ndarray]:
    """d restricted to an agent's contexts (zero elsewhere)."""
    return [np.where(m, d, 0.0) for d, m in zip(ev.d, mask, strict=True)]


def agent_weights(ev: Evaluation, mask: list[np.ndarray]) -> list[np.ndarray]:
    """rho_j: the agent's (discount-weighted) per-message context distribution, d on S_j normalised."""
    occ = agent_occupancy(ev, mask)
    total = sum(o.sum() for o in occ)
    if total <= 0:
        return occ
    return [o / total for o in occ]


def kl_per_context(old: list[np.ndarray], new: list[np.ndarray]) -> list[np.ndarray]:
    """KL(pi_old(.|s) || pi_new(.|s)) for every context."""
    out = []
    for a, b in zip(old, new, strict=True):
        out.append((a * (np.log(np.clip(a, 1e-300, None)) - np.log(np.clip(b, 1e-300, None)))).sum(axis=1))
    return out


def weighted_kl(weights: list[np.ndarray], old: list[np.ndarray], new: list[np.ndarray]) -> float:
    return float(sum((w * k).sum() for w, k in zip(weights, kl_per_context(old, new), strict=True)))


def surrogate(
    occupancy: list[np.ndarray],
    advantages: list[np.ndarray],
    new_policy: list[np.ndarray],
    mask: list[np.ndarray],
) -> float:
    """L = sum_{s in S_j} d(s) sum_m pi_new(m|s) A(s,m): the advantage of the new messages on the batch."""
    total = 0.0
    for d, A, pi, m in zip(occupancy, advantages, new_policy, mask, strict=True):
        total += float((d[m] * (pi[m] * A[m]).sum(axis=1)).sum())
    return total


def expected_gain(advantages: list[np.ndarray], new_policy: list[np.ndarray]) -> list[np.ndarray]:
    """g(s) = sum_m pi_new(m|s) A(s,m) per context."""
    return [(pi * A).sum(axis=1) for A, pi in zip(advantages, new_policy, strict=True)]


def l1_distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(sum(np.abs(x - y).sum() for x, y in zip(a, b, strict=True)))


@dataclass
class TrustRegionStep:
    logits: Logits  # the whole team's logits with the agent's contexts moved
    eta: float  # step size along the natural gradient (exponential tilt by the advantage)
    kl: float  # rho-weighted KL(pi_cur || pi_new) on the batch, <= delta
    surrogate: float  # L on the batch


def trust_region_step(
    logits: Logits,
    mask: list[np.ndarray],
    occupancy: list[np.ndarray],
    advantages: list[np.ndarray],
    delta: float,
    max_eta: float = 1e4,
) -> TrustRegionStep:
    """Maximise L = E_{s~d, m~pi_new}[A(s,m)] over agent j's contexts subject to the rho-weighted
    KL(pi_cur || pi_new) <= delta, along the natural-gradient direction of a tabular softmax:
    pi_new ∝ pi_cur * exp(eta * A) (the mirror-ascent step). L and the KL both grow with eta, so the
    line search is a root find (Brent) for the eta on the trust-region boundary."""
    if delta <= 0:
        raise ValueError(f"delta must be > 0, got {delta}")
    # the agent's contexts of every layer as the rows of one table
    z = np.concatenate([zt[m] for zt, m in zip(logits, mask, strict=True)])
    adv = np.concatenate([At[m] for At, m in zip(advantages, mask, strict=True)])
    occ = np.concatenate([dt[m] for dt, m in zip(occupancy, mask, strict=True)])
    if occ.sum() <= 0 or not np.isfinite(adv).all():
        return _no_step(logits, occupancy, advantages, mask)
    rho = occ / occ.sum()
    log_old = log_softmax(z, axis=1)
    p_old = np.exp(log_old)

    def excess_kl(eta: float) -> float:
        return (
            float((rho * (p_old * (log_old - log_softmax(z + eta * adv, axis=1))).sum(axis=1)).sum()) - delta
        )

    hi = 1.0
    while excess_kl(hi) <= 0 and hi < max_eta:  # the KL is unbounded in eta unless A is flat on the batch
        hi *= 2.0
    if excess_kl(hi) <= 0:
        eta = hi
    else:
        eta = brentq(excess_kl, 0.0, hi, xtol=1e-14, rtol=1e-12)
        while excess_kl(eta) > 0:  # land inside the region, not on its far side
            eta *= 1.0 - 1e-9
    new_logits = [
        np.where(m[:, None], zt + eta * At, zt) for zt, At, m in zip(logits, advantages, mask, strict=True)
    ]
    new_policy = policies(new_logits)
    return TrustRegionStep(
        logits=new_logits,
        eta=eta,
        kl=excess_kl(eta) + delta,
        surrogate=surrogate(occupancy, advantages, new_policy, mask),
    )


def _no_step(
    logits: Logits, occupancy: list[np.ndarray], advantages: list[np.ndarray], mask: list[np.ndarray]
) -> TrustRegionStep:
    same = [z.copy() for z in logits]
    return TrustRegionStep(same, 0.0, 0.0, surrogate(occupancy, advantages, policies(same), mask))


def trajectory_ess_fraction(
    instance: TeamInstance, behaviour: list[np.ndarray], target: list[np.ndarray]
) -> float:
    """ESS/B of whole-episode importance weights w = P_target(tau)/P_behaviour(tau) for episodes of the
    behaviour team, in the limit of a large batch: ESS/B = (E w)^2 / E w^2 = 1 / E_behaviour[w^2].
    E[w^2] = sum_tau P_t(tau)^2 / P_b(tau) is a forward pass (the transition factors cancel)."""
    u = instance.initial.copy()
    for t, P in enumerate(instance.transitions):
        ratio_sq = target[t] ** 2 / np.clip(behaviour[t], 1e-300, None)
        u = np.einsum("s,sm,smn->n", u, ratio_sq, P)
    return float(1.0 / u.sum())
