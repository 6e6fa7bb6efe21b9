"""The TeamTR bounds (docs/theory.md) in the form that holds for a finite-horizon layered team, and
their exact check on the records of one sequential stage.

Constants (derived in docs/theory.md; zeta = 0 because advantages are exact):
  A_max  = max r - min r             (|A^pi(s,m)| <= A_max for rewards at the end of the episode)
  W      = sum_{m=1}^{T-1} gamma^m   (how long a shift of the context distribution keeps counting)
  N_max  = max_j sum_{t: j speaks at t} gamma^t   (an agent's discounted number of turns)
  N_turn = max_j #{t: j speaks at t}
  c      = sqrt(2) * A_max * W * N_max
For T -> infinity and one turn per step these become the paper's W = gamma/(1-gamma), N = 1/(1-gamma),
c = sqrt(2) gamma A_max / (1-gamma)^2. delta_i is the KL of update i on the contexts of pi^(i-1),
KL(pi_cur || pi_new) averaged over the agent's d-weighted contexts (the quantity eq. 11 estimates).

  occupancy shift  ||d^(i-1) - d^0||_1 <= sqrt(2) W N_max sum_{k<i} sqrt(delta_k)
  Thm 3.4          J(pi^i) - J(pi^(i-1)) >= L_i - c sqrt(delta_i)
  Thm 3.4 (tight)  ... >= L_i - sqrt(2) eps_i W Ntilde_i sqrt(delta_i)   (eps_i, Ntilde_i exact, <= A_max, N_max)
  Thm 3.6          J(pi^n) - J(pi^0) >= sum_i L_i - c sum_i sqrt(delta_i)
  Prop 3.3         |L_i - L_i^stale| <= c sum_{k<i} sqrt(delta_k)                       (stale occupancy)
                                        + sqrt(2) N_max N_turn sqrt(delta_i^0) sum_{k<i} eps_k  (stale advantages)
  Thm 3.7          J(pi^n) - J(pi^0) >= sum_i L_i^stale - sum_i [c sqrt(delta_i) + Prop3.3_i]
                   (= sum_i L^stale - c sum_k (n-k+1) sqrt(delta_k) - advantage terms)

The paper's Prop 3.3 has only the first term: it covers stale contexts. A naive batch also carries stale
advantages (the returns of pi^0's episodes); the second term covers them (|Q^(i-1) - Q^0| <= N_turn
sum_{k<i} eps_k by the performance-difference lemma from (s, m)). `prop33_occupancy_only` checks the
paper's form against the fully stale surrogate and is reported, not counted, because it is not a bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from teamtr.theory.env import TeamInstance
from teamtr.theory.team import UpdateRecord

TOLERANCE = 1e-9  # floating-point slack on exact comparisons

BOUND_NAMES = (
    "occupancy_shift",
    "thm34",
    "thm34_tight",
    "thm36",
    "prop33",
    "thm37",
    "thm34_own",
    "thm36_own",
)
INFORMATIONAL = ("prop33_occupancy_only",)


@dataclass(frozen=True)
class BoundConstants:
    A_max: float
    W: float
    N_max: float
    N_turn: int
    W_own: dict[str, float] = field(default_factory=dict)  # agent -> W_own_j (0 for a speak-once agent)
    N_agent: dict[str, float] = field(default_factory=dict)  # agent -> N_j

    @property
    def speak_once(self) -> bool:
        """Every agent speaks on at most one turn, so no update can move its own agent's contexts."""
        return all(w == 0.0 for w in self.W_own.values())

    def c_own(self, agent: str) -> float:
        return math.sqrt(2.0) * self.A_max * self.W_own[agent] * self.N_agent[agent]

    @property
    def c(self) -> float:
        return math.sqrt(2.0) * self.A_max * self.W * self.N_max

    @property
    def c_occupancy(self) -> float:
        return math.sqrt(2.0) * self.W * self.N_max

    @classmethod
    def of(cls, instance: TeamInstance) -> BoundConstants:
        gamma, T = instance.gamma, instance.horizon
        speaks = [[bool((route == j).any()) for route in instance.router] for j in range(instance.n_agents)]
        turns = [[t for t in range(T) if s[t]] for s in speaks]
        return cls(
            A_max=float(instance.reward.max() - instance.reward.min()),
            W=float(sum(gamma**m for m in range(1, T))),
            N_max=max(sum(gamma**t for t in range(T) if s[t]) for s in speaks),
            N_turn=max(sum(s) for s in speaks),
            W_own={
                name: max((sum(gamma ** (t - u) for t in ts if t > u) for u in ts), default=0.0)
                for name, ts in zip(instance.agent_names, turns, strict=True)
            },
            N_agent={
                name: float(sum(gamma**t for t in ts))
                for name, ts in zip(instance.agent_names, turns, strict=True)
            },
        )


@dataclass(frozen=True)
class BoundForm:
    """How the penalty is written. The true form is c_scale=1, power=0.5; a deliberately wrong form
    (c/10, or delta instead of sqrt(delta)) must be caught by the checks."""

    c_scale: float = 1.0
    power: float = 0.5
    assume_speak_once: bool = False  # write the own-turn bounds with c_own = 0 whatever the team (wrong)

    def root(self, delta: float) -> float:
        return max(delta, 0.0) ** self.power


@dataclass
class Check:
    """One inequality lhs >= base - penalty (lhs: what happened, exactly; base - penalty: the bound)."""

    name: str
    lhs: float
    base: float
    penalty: float
    stage: int
    index: int | None = None

    @property
    def rhs(self) -> float:
        return self.base - self.penalty

    @property
    def violated(self) -> bool:
        return self.lhs < self.rhs - TOLERANCE

    @property
    def used_fraction(self) -> float:
        """How much of the penalty the exact outcome needed: (base - lhs) / penalty; > 1 is a violation."""
        return (self.base - self.lhs) / self.penalty if self.penalty > 1e-12 else -math.inf


@dataclass
class CheckTally:
    checks: dict[str, int] = field(default_factory=lambda: {n: 0 for n in BOUND_NAMES + INFORMATIONAL})
    violations: dict[str, int] = field(default_factory=lambda: {n: 0 for n in BOUND_NAMES + INFORMATIONAL})
    worst_margin: dict[str, float] = field(default_factory=dict)  # most negative lhs - rhs seen
    max_used_fraction: dict[str, float] = field(
        default_factory=dict
    )  # tightness: largest share of the penalty used

    def add(self, checks: Sequence[Check]) -> None:
        for check in checks:
            self.checks[check.name] += 1
            self.violations[check.name] += int(check.violated)
            self.worst_margin[check.name] = min(
                self.worst_margin.get(check.name, math.inf), check.lhs - check.rhs
            )
            self.max_used_fraction[check.name] = max(
                self.max_used_fraction.get(check.name, -math.inf), check.used_fraction
            )


def check_stage(
    records: Sequence[UpdateRecord], constants: BoundConstants, form: BoundForm = BoundForm()
) -> list[Check]:
    """All bounds on one sequential stage (records in update order, i = 1..n)."""
    if not records or any(r.data == "joint" for r in records):
        raise ValueError("check_stage needs the records of one sequential (non-joint) stage")
    c = form.c_scale * constants.c
    c_occ = form.c_scale * constants.c_occupancy
    stage = records[0].stage
    checks: list[Check] = []
    prop33: list[float] = []
    roots = [form.root(r.kl_intermediate) for r in records]
    for i, r in enumerate(records):
        earlier_roots = sum(roots[:i])
        earlier_eps = sum(q.eps for q in records[:i])
        checks.append(
            Check(
                "occupancy_shift", -r.occupancy_shift_from_start, 0.0, c_occ * earlier_roots, stage, r.index
            )
        )
        checks.append(Check("thm34", r.improvement, r.surrogate_intermediate, c * roots[i], stage, r.index))
        tight = form.c_scale * math.sqrt(2.0) * r.eps * constants.W * r.agent_mass_intermediate * roots[i]
        checks.append(Check("thm34_tight", r.improvement, r.surrogate_intermediate, tight, stage, r.index))
        stale_gap = abs(r.surrogate_intermediate - r.surrogate_stale)
        occupancy_term = c * earlier_roots
        advantage_term = (
            form.c_scale
            * math.sqrt(2.0)
            * constants.N_max
            * constants.N_turn
            * form.root(r.kl_stage_start)
            * earlier_eps
        )
        prop33.append(occupancy_term + advantage_term)
        checks.append(Check("prop33", -stale_gap, 0.0, prop33[i], stage, r.index))
        checks.append(Check("prop33_occupancy_only", -stale_gap, 0.0, occupancy_term, stage, r.index))
    own_penalties = [
        0.0 if form.assume_speak_once else form.c_scale * constants.c_own(r.role) * roots[i]
        for i, r in enumerate(records)
    ]
    for r, own in zip(records, own_penalties, strict=True):
        checks.append(Check("thm34_own", r.improvement, r.surrogate_intermediate, own, stage, r.index))
    total = sum(r.improvement for r in records)
    checks.append(
        Check("thm36_own", total, sum(r.surrogate_intermediate for r in records), sum(own_penalties), stage)
    )
    checks.append(
        Check("thm36", total, sum(r.surrogate_intermediate for r in records), c * sum(roots), stage)
    )
    stale_penalty = sum(c * roots[i] + prop33[i] for i in range(len(records)))
    checks.append(Check("thm37", total, sum(r.surrogate_stale for r in records), stale_penalty, stage))
    return checks
