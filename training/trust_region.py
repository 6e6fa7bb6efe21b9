"""MONITOR step: keep each update inside its KL trust region (docs/training.md, "Trust region").

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from teamtr.training.config import TrustRegionConfig


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
