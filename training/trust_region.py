"""MONITOR step: keep each update inside its KL trust region (docs/training.md, "Trust region").

check = probe (the default): `ExactRegion` measures the exact vocabulary-sum KL per message on the batch's
contexts and on a held-out probe of the role's contexts; teamtr_step checks it after every optimiser step and
line-searches a step that would leave back onto the region (training/teamtr_step.py).

check = sampled (before 2026-12; leaks out of sample):
    adaptive beta   after an update, beta *= factor if d_hat > 1.5 delta; beta /= factor if d_hat < delta/1.5
    early stop      the inner epochs stop as soon as the running d_hat exceeds delta (inside `attempt`)
    backtracking    an attempt that ends with d_hat > delta is undone (adapter AND optimizer state restored
                    exactly) and retried with lr / 2 and beta * 2, at most K times; then it is rejected and
                    the agent keeps its old weights

The enforcement is generic: it sees an `attempt(lr, beta) -> AttemptResult` callable and a snapshot/restore
pair; the accepted attempt comes back in the outcome, with whatever the caller measured in it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import torch

from teamtr.engines.embedded_scoring import CompletionStates
from teamtr.training.config import TrustRegionConfig
from teamtr.training.token_counts import pass_tokens
from teamtr.training.vocab_kl import MessageKL, Side, message_divergences, message_sums


@dataclass
class AttemptLog:
    lr: float
    beta: float
    d_hat: float
    epochs_run: int
    early_stopped: bool
    inside: bool


@dataclass
class AttemptResult:
    d_hat: float  # on the update's whole batch, after the last inner step
    epochs_run: int
    early_stopped: bool
    new_logp: torch.Tensor | None = None  # log pi_new of the batch's tokens at the attempt's final weights


@dataclass
class TrustRegionOutcome:
    accepted: bool
    d_hat: float  # of the accepted attempt (0.0 when rejected: the policy did not move)
    accepted_attempt: AttemptResult | None = None  # None when rejected (the weights were restored)
    attempts: list[AttemptLog] = field(default_factory=list)
    left_region: bool = False  # the first attempt ended outside delta (paper's "left the region")
    beta_next: float = 0.0  # the penalty the agent's next update starts from

    @property
    def backtracks(self) -> int:
        return max(len(self.attempts) - 1, 0)


class AdapterState:
    """An exact snapshot of trainable tensors and an optimizer's state (restore is bit-identical)."""

    def __init__(self, params: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer | None) -> None:
        self._params = params
        self._optimizer = optimizer
        self.saved_params: dict[str, torch.Tensor] = {}
        self.saved_optimizer: dict[str, Any] | None = None

    def save(self) -> AdapterState:
        self.saved_params = {k: v.detach().clone() for k, v in self._params.items()}
        self.saved_optimizer = copy.deepcopy(self._optimizer.state_dict()) if self._optimizer else None
        return self

    def restore(self) -> None:
        with torch.no_grad():
            for k, v in self._params.items():
                v.copy_(self.saved_params[k])
        if self._optimizer is not None and self.saved_optimizer is not None:
            self._optimizer.load_state_dict(copy.deepcopy(self.saved_optimizer))


def next_beta(beta: float, d_hat: float, cfg: TrustRegionConfig) -> float:
    """Adaptive KL penalty: grow when the update overshot delta, shrink when it stayed well inside."""
    if cfg.penalty != "adaptive":
        return beta
    if d_hat > 1.5 * cfg.delta:
        beta *= cfg.beta_factor
    elif d_hat < cfg.delta / 1.5:
        beta /= cfg.beta_factor
    return min(max(beta, cfg.beta_min), cfg.beta_max)


def enforce_trust_region(
    attempt: Callable[[float, float], AttemptResult],
    snapshot: Callable[[], Callable[[], None]],
    cfg: TrustRegionConfig,
    lr: float,
    beta: float,
) -> TrustRegionOutcome:
    """Run `attempt` until its update ends inside the region, backtracking at most K times.

    `snapshot()` captures the adapter + optimizer state and returns the function that restores it.
    With the trust region disabled the first attempt is always accepted (d_hat is still logged).
    """
    if cfg.penalty == "none":
        beta = 0.0
    restore = snapshot()
    outcome = TrustRegionOutcome(accepted=False, d_hat=0.0, beta_next=beta)
    for k in range(cfg.max_backtracks + 1 if cfg.enabled else 1):
        result = attempt(lr, beta)
        inside = (not cfg.enabled) or result.d_hat <= cfg.delta
        outcome.attempts.append(
            AttemptLog(lr, beta, result.d_hat, result.epochs_run, result.early_stopped, inside)
        )
        if k == 0:
            outcome.left_region = result.d_hat > cfg.delta
        if inside:
            outcome.accepted, outcome.d_hat, outcome.accepted_attempt = True, result.d_hat, result
            outcome.beta_next = next_beta(beta, result.d_hat, cfg)
            return outcome
        restore()  # undo exactly, then retry a smaller step
        lr, beta = lr / 2.0, (beta * 2.0 if cfg.penalty != "none" else 0.0)
        beta = min(max(beta, cfg.beta_min if cfg.penalty != "none" else 0.0), cfg.beta_max)
    outcome.beta_next = next_beta(beta, cfg.delta * 2.0, cfg)  # rejected: the region was too small a target
    return outcome


@dataclass
class RegionCheck:
    """The exact KL of the adapter now against pi_cur, in the units of delta, on two sets of contexts."""

    batch: float  # mean over the batch's messages (contexts the step was fitted on)
    probe: float  # mean over the probe's held-out messages (contexts it was not fitted on)
    probe_ucb: float  # one-sided upper confidence bound of `probe` (normal approximation over messages)
    delta: float
    scale: float = 1.0  # the point's displacement from pi_cur over the optimiser's (> 1: extrapolated)

    @property
    def value(self) -> float:
        """What is held to delta: the larger of the batch's mean and the probe's bound (nan if non-finite)."""
        v = max(self.batch, self.probe_ucb)
        return v if math.isfinite(v) else math.nan

    @property
    def inside(self) -> bool:
        return self.value <= self.delta  # False for nan: a non-finite step is outside the region

    def to_dict(self) -> dict[str, float]:
        return {
            "kl_batch_exact": self.batch,
            "kl_probe": self.probe,
            "kl_probe_ucb": self.probe_ucb,
            "extrapolate_scale": self.scale,
        }


class ExactRegion:
    """KL(pi_cur, pi_now) of one role on fixed sets of contexts (`cfg.direction`: forward, reverse, max).

    pi_cur is the adapter's weights when this is made; `check()` measures the adapter as it is now. The
    messages are sampled from pi_cur, so the forward KL summed per message is eq. 11 computed exactly
    (chain rule, no sampling noise inside a position); reverse charges mass pi_now moves where pi_cur had
    little, which forward barely sees."""

    def __init__(
        self,
        side: Side,
        temperature: float,
        batch: tuple[list[list[int]], list[list[int]]],
        probe: tuple[list[list[int]], list[list[int]]],
        cfg: TrustRegionConfig,
    ) -> None:
        self.side, self.temperature, self.cfg = side, temperature, cfg
        self.start = side.engine.snapshot_adapter(side.adapter, side.base)
        self.sets = {"batch": batch, "probe": probe}
        # pi_cur's hidden states per set, from the first check on (vocab_kl.message_divergences)
        self.cur_states: dict[str, list[CompletionStates]] = {"batch": [], "probe": []}
        self.z = NormalDist().inv_cdf(cfg.probe_confidence)
        self.passed_tokens = 0  # tokens through the model in its KL passes (training/token_counts.py count 3)

    def per_message(self, which: str) -> torch.Tensor:
        """[M] the constrained KL of each message of one set (per token when the region is per token)."""
        prompts, completions = self.sets[which]
        if not prompts:
            return torch.zeros(0)
        cached = self.cur_states[which]
        first = not cached
        kl, _ = message_divergences(
            self.side, prompts, completions, self.start, self.temperature, before_states=cached
        )
        # pi_now's pass; pi_cur's only the first time
        self.passed_tokens += (2 if first else 1) * pass_tokens(prompts, completions)
        return self.constrained(kl)

    def constrained(self, kl: MessageKL) -> torch.Tensor:
        """[M] the KL the region constrains of each message: `direction`, per token when per_token."""
        values = kl.of(self.cfg.direction)
        return values / kl.tokens.clamp_min(1.0) if self.cfg.per_token else values

    def penalty(self, index: torch.Tensor, checkpoint_body: bool = False) -> torch.Tensor:
        """The constrained KL (`direction`) of the batch's messages `index` at the adapter as it is now,
        their mean, with its gradient: eq. 10's d_hat under `penalty_kl = exact`. Zero before the first
        check has kept pi_cur's states: until then no step was taken, and at pi_now = pi_cur the KL and its
        gradient are both zero. `checkpoint_body`: the policy's gradient checkpointing."""
        cur = self.cur_states["batch"]
        if not cur or not len(index):
            return torch.zeros(())
        rows = [h for s in cur for h in s.hidden.split(s.lengths)]  # pi_cur's states, one entry per message
        prompts, completions = self.sets["batch"]
        chosen = index.tolist()
        ps, cs = [prompts[i] for i in chosen], [completions[i] for i in chosen]
        with self.side.active():
            now = self.side.states(ps, cs, checkpoint_body)
            before = CompletionStates(
                torch.cat([rows[i] for i in chosen]), now.targets, now.lengths, now.head
            )
            sums = message_sums(before, now, self.temperature)
        self.passed_tokens += pass_tokens(ps, cs)
        tokens = torch.tensor(now.lengths, dtype=sums.dtype, device=sums.device)
        return self.constrained(MessageKL(forward=sums[:, 0], reverse=sums[:, 1], tokens=tokens)).mean()

    def check(self) -> RegionCheck:
        batch, probe = self.per_message("batch"), self.per_message("probe")
        mean = float(probe.mean()) if len(probe) else 0.0
        spread = float(probe.std()) / math.sqrt(len(probe)) if len(probe) > 1 else 0.0
        return RegionCheck(
            batch=float(batch.mean()) if len(batch) else 0.0,
            probe=mean,
            probe_ucb=mean + self.z * spread,
            delta=self.cfg.delta,
        )
