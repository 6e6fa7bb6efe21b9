"""The certificate proxy (docs/training.md, "Certificate and diagnostics"), per update and per stage.

    c          = sqrt(2) * gamma * A_max / (1 - gamma)^2
    term_i     = L_hat_i - c * sqrt(d_hat_i) - zeta_hat_i / (1 - gamma)      (Thm 3.4, docs/theory.md)
    C_stage    = sum_i term_i                   (Thm 3.6; summed by training/stage.py `run_stage`)
    zeta_hat_i = zeta_clip + zeta_ratio + zeta_norm

With gamma near 1 the absolute bound is vacuous; it is logged as a diagnostic, and its rank correlation
with the realised improvement (held-out team return after - before each stage) is reported over a run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from scipy.stats import spearmanr


def certificate_constant(gamma: float, a_max: float) -> float:
    """c = sqrt(2) gamma A_max / (1 - gamma)^2."""
    if not 0 < gamma < 1:
        raise ValueError("gamma must be in (0, 1)")
    return math.sqrt(2.0) * gamma * a_max / (1.0 - gamma) ** 2


@dataclass
class CertificateTerm:
    """One update's contribution to the stage certificate, with its parts."""

    surrogate: float  # L_hat_i
    d_hat: float  # the KL estimate the trust region monitors
    zeta_clip: float
    zeta_ratio: float
    zeta_norm: float
    c: float
    gamma: float

    @property
    def zeta(self) -> float:
        return self.zeta_clip + self.zeta_ratio + self.zeta_norm

    @property
    def kl_penalty(self) -> float:
        # k1 can come out slightly negative on a finite sample; the bound needs a KL, which is >= 0
        return self.c * math.sqrt(max(self.d_hat, 0.0))

    @property
    def value(self) -> float:
        return self.surrogate - self.kl_penalty - self.zeta / (1.0 - self.gamma)

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d.update(zeta=self.zeta, kl_penalty=self.kl_penalty, value=self.value)
        return d


def stage_certificate(terms: Sequence[CertificateTerm]) -> float:
    """C_stage = sum_i [L_hat_i - c sqrt(d_hat_i) - zeta_hat_i / (1 - gamma)]."""
    return float(sum(t.value for t in terms))


def rank_correlation(certificates: Sequence[float], improvements: Sequence[float]) -> float | None:
    """Spearman's rank correlation between stage certificates and realised improvements (None if < 3
    stages, or either side is constant)."""
    if len(certificates) != len(improvements):
        raise ValueError("one realised improvement per certificate")
    if len(certificates) < 3 or len(set(certificates)) < 2 or len(set(improvements)) < 2:
        return None
    rho = spearmanr(certificates, improvements).statistic
    return None if math.isnan(rho) else float(rho)
