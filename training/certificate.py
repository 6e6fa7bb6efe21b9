"""The certificate (docs/training.md, "Certificate and diagnostics"; derived in docs/theory.md section 8),
per update and per stage. The stage's headline `certificate` is the held-out form that applies
(speak_once when every updated role spoke at most once per episode, else general; training/stage.py),
the proxy only when there are no held-out episodes.

Every term and every stage value is built here: `update_term` (one update, from its batch),
`with_heldout` (its held-out forms, from the held-out KL check's episodes), `stage_headline`.

The proxy on the update's own batch (kept as `value`; per stage `proxy`):
    c          = sqrt(2) * gamma * A_max / (1 - gamma)^2
    term_i     = L_hat_i - c * sqrt(d_hat_i) - zeta_hat_i / (1 - gamma)      (Thm 3.4, docs/theory.md)
    C_stage    = sum_i term_i                   (Thm 3.6; `stage_headline`, logged by training/stage.py `run_stage`)
    zeta_hat_i = zeta_clip + zeta_ratio + zeta_norm

The held-out forms, in reward units of the finite-horizon (gamma = 1) episodic task, on K held-out
episodes of pi^(i-1) (the held-out KL check's, never trained on), R_k their rewards, b_k the
leave-one-out mean reward, w_ku the ratio pi_new / pi_cur of role j's u-th message in episode k:
    L_ho       = mean_k sum_u (w_ku - 1)(R_k - b_k)       unbiased for L_i (Thm 3.4's surrogate), with its SE
    general    = L_ho - c_general sqrt(kl_ho)             c_general = sqrt(2) A_max (T - 1) N_j
    speak_once = L_ho                                     valid when j speaks at most once per episode:
                                                          then L_i = J(pi^i) - J(pi^(i-1)) exactly
kl_ho is the out-of-sample per-message KL(pi_cur || pi_new); A_max the reward range; T the most turns of an
episode, N_j the most turns of role j in one. No zeta: the rewards are neither clipped nor normalised and
the ratio is not clipped. `form` is speak_once when j spoke at most once in every episode seen.
With gamma near 1 the proxy is vacuous; it is logged as a diagnostic, and its rank correlation with the
realised improvement (held-out team return after - before each stage) is reported over a run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Literal

import numpy as np

CertificateForm = Literal["general", "speak_once"]


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
    # the held-out forms (None: no held-out episodes, or the role did not speak in them)
    heldout_surrogate: float | None = None  # L_ho
    heldout_se: float | None = None  # its standard error over the held-out episodes
    heldout_episodes: int = 0
    kl_heldout: float | None = None  # out-of-sample KL(pi_cur || pi_new) per message
    reward_range: float = 1.0  # A_max of the held-out forms: max - min of the verifier's reward
    horizon: int = 0  # T: the most turns in an episode seen
    role_turns: int = 0  # N_j: the most turns of the updated role in one episode seen
    form: CertificateForm = "general"

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

    @property
    def c_general(self) -> float:
        """sqrt(2) A_max W N_j with gamma = 1: W = T - 1 later turns, N_j turns of the role."""
        return math.sqrt(2.0) * self.reward_range * max(self.horizon - 1, 0) * self.role_turns

    @property
    def general(self) -> float | None:
        if self.heldout_surrogate is None or self.kl_heldout is None:
            return None
        return self.heldout_surrogate - self.c_general * math.sqrt(max(self.kl_heldout, 0.0))

    @property
    def speak_once(self) -> float | None:
        return self.heldout_surrogate

    @property
    def heldout(self) -> float | None:
        """The form that applies to this update (speak_once if the role spoke at most once per episode)."""
        return self.speak_once if self.form == "speak_once" else self.general

    def to_dict(self) -> dict[str, float | str | None]:
        d = asdict(self)
        d.update(
            zeta=self.zeta,
            kl_penalty=self.kl_penalty,
            value=self.value,
            c_general=self.c_general,
            general=self.general,
            speak_once=self.speak_once,
            heldout=self.heldout,
        )
        return d


def certificate_form(role_turns: int) -> CertificateForm:
    """speak_once iff the updated role spoke at most once in every episode seen."""
    return "speak_once" if role_turns <= 1 else "general"


def update_term(
    *,
    surrogate: float,
    d_hat: float,
    zeta_clip: float,
    zeta_ratio: float,
    zeta_norm: float,
    a_max: float,
    gamma: float,
    horizon: int,
    role_turns: int,
) -> CertificateTerm:
    """term_i = L_hat_i - c sqrt(d_hat_i) - (zeta_clip + zeta_ratio + zeta_norm) / (1 - gamma) of one
    update on its own batch, with the held-out forms' constants T (`horizon`) and N_j (`role_turns`)."""
    return CertificateTerm(
        surrogate=surrogate,
        d_hat=d_hat,
        zeta_clip=zeta_clip,
        zeta_ratio=zeta_ratio,
        zeta_norm=zeta_norm,
        c=certificate_constant(gamma, a_max),
        gamma=gamma,
        horizon=horizon,
        role_turns=role_turns,
        form=certificate_form(role_turns),
    )


def no_term(gamma: float) -> CertificateTerm:
    """The term of an update that did not happen (a role that never spoke): zero in every part."""
    return CertificateTerm(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, gamma)


def with_heldout(
    term: CertificateTerm,
    heldout: tuple[float, float, int] | None,
    kl_heldout: float | None,
    heldout_role_turns: int,
) -> CertificateTerm:
    """`term` with its held-out forms: (L_ho, its SE, K) on the held-out KL check's K episodes (None:
    none), their per-message KL, and the most turns the role took in one of them (they count towards N_j)."""
    if heldout is None:
        return term
    value, se, episodes = heldout
    role_turns = max(term.role_turns, heldout_role_turns)
    return replace(
        term,
        heldout_surrogate=value,
        heldout_se=se,
        heldout_episodes=episodes,
        kl_heldout=kl_heldout,
        role_turns=role_turns,
        form=certificate_form(role_turns),
    )


def heldout_surrogate(log_ratios: Sequence[Sequence[float]], rewards: Sequence[float]) -> tuple[float, float]:
    """(L_ho, standard error): mean_k sum_u (w_ku - 1)(R_k - b_k) over K held-out episodes of pi_cur, with
    log_ratios[k] the log pi_new / pi_cur of each of the role's messages in episode k (empty if it did not
    speak) and b_k the mean reward of the other episodes (independent of episode k, so unbiased)."""
    r = np.asarray(rewards, dtype=float)
    k = len(r)
    if k == 0 or len(log_ratios) != k:
        raise ValueError("one list of log-ratios per held-out episode, at least one episode")
    baseline = (r.sum() - r) / (k - 1) if k > 1 else np.zeros(1)
    per_episode = np.array(
        [
            sum(math.expm1(lr) for lr in lrs) * (rk - bk)
            for lrs, rk, bk in zip(log_ratios, r, baseline, strict=True)
        ]
    )
    se = float(per_episode.std(ddof=1) / math.sqrt(k)) if k > 1 else math.inf
    return float(per_episode.mean()), se


def stage_certificate_forms(terms: Sequence[CertificateTerm]) -> dict[str, float | str | None]:
    """Per stage: each held-out form summed over the updates (None if any update has none), the standard
    error of the sum (held-out episodes are independent across updates), the form that applies to
    every update of the stage (speak_once only if it applies to each) and its sum (`heldout`), the proxy
    sum_i term_i, and which of them is the stage's headline certificate."""

    def total(values: list[float | None]) -> float | None:
        return None if not values or any(v is None for v in values) else float(sum(values))  # type: ignore[arg-type]

    ses = [t.heldout_se for t in terms]
    form = "speak_once" if terms and all(t.form == "speak_once" for t in terms) else "general"
    heldout = total([t.general if form == "general" else t.speak_once for t in terms])
    return {
        "general": total([t.general for t in terms]),
        "speak_once": total([t.speak_once for t in terms]),
        "se": None if not ses or any(s is None for s in ses) else math.sqrt(sum(s * s for s in ses)),  # type: ignore[operator]
        "form": form,
        "heldout": heldout,
        "proxy": stage_certificate(terms) if terms else None,
        # what the stage record's `certificate` is (training/stage.py): the held-out form, else the proxy
        "headline": form if heldout is not None else "proxy",
    }


def stage_headline(terms: Sequence[CertificateTerm | None]) -> tuple[float | None, str | None]:
    """The stage's headline certificate and its form: the held-out form that applies (speak_once iff every
    update's role spoke at most once per episode, which is exact there, docs/theory.md section 3b; general
    otherwise), or the proxy when an update has no held-out episodes (trust_region.heldout_episodes: 0);
    (None, None) when the team logs no terms (the exact teams, whose bounds are checked exactly)."""
    if not terms or any(t is None for t in terms):
        return None, None
    forms = stage_certificate_forms(terms)  # type: ignore[arg-type]
    if forms["heldout"] is not None:
        return forms["heldout"], str(forms["form"])  # type: ignore[return-value]
    return stage_certificate(terms), "proxy"  # type: ignore[arg-type]


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
    from scipy.stats import spearmanr  # here: scipy.stats takes ~1 s to import, and the CLI reads configs

    rho = spearmanr(certificates, improvements).statistic
    return None if math.isnan(rho) else float(rho)
