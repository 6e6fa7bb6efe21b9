"""The certificate's held-out forms (training/certificate.py; derived in docs/theory.md section 8).

The held-out surrogate is checked against exact improvements of small categorical teams (sampled with a
fixed seed): for a role that speaks once it is unbiased for J(pi_new) - J(pi_old), so the speak-once form
is a valid certificate; for a role that speaks twice it is not (the general form's KL penalty is needed).
Then a real tiny LLM team (three roles, each speaking once) logs both forms per update and per stage.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from teamtr.graphs.run_layout import read_metrics
from teamtr.training.certificate import (
    CertificateTerm,
    certificate_form,
    heldout_surrogate,
    stage_certificate_forms,
)
from teamtr.training.stage import ScheduleConfig, run_stage

torch.set_num_threads(1)

OLD = np.array([0.5, 0.5])  # pi_cur over messages (a, b)
NEW = np.array([0.8, 0.2])  # pi_new
KL = float((OLD * np.log(OLD / NEW)).sum())  # per message KL(pi_cur || pi_new)


def sample_two_turn(
    reward: np.ndarray, turns: int, episodes: int, seed: int
) -> tuple[list[list[float]], list[float]]:
    """Episodes of pi_cur: the role picks a message on each of its `turns` turns, reward[m0, m1, ...]."""
    rng = np.random.default_rng(seed)
    msgs = rng.choice(2, size=(episodes, turns), p=OLD)
    log_ratios = [[float(np.log(NEW[m] / OLD[m])) for m in row] for row in msgs]
    rewards = [float(reward[tuple(row)]) for row in msgs]
    return log_ratios, rewards


def exact_return(policy: np.ndarray, reward: np.ndarray, turns: int) -> float:
    probs = policy
    for _ in range(turns - 1):
        probs = np.multiply.outer(probs, policy)
    return float((probs * reward).sum())


def test_heldout_surrogate_by_hand() -> None:
    # two episodes: b_1 = R_2 = 0, b_2 = R_1 = 1; (e^ln2 - 1)(1 - 0) + (e^0 - 1)(0 - 1) = 1, mean 0.5
    value, se = heldout_surrogate([[math.log(2.0)], [0.0]], [1.0, 0.0])
    assert value == pytest.approx(0.5)
    assert se == pytest.approx(0.5)  # std(ddof=1) of (1, 0) over sqrt(2)
    assert heldout_surrogate([[]], [1.0]) == (0.0, math.inf)  # the role did not speak; one episode


def test_speak_once_heldout_surrogate_is_unbiased_for_the_improvement() -> None:
    # one turn, reward 1 for message a: J goes 0.5 -> 0.8; L_ho estimates +0.3 and its certificate is positive
    reward = np.array([1.0, 0.0])
    improvement = exact_return(NEW, reward, 1) - exact_return(OLD, reward, 1)
    value, se = heldout_surrogate(*sample_two_turn(reward, 1, 20_000, seed=0))
    assert abs(value - improvement) < 4 * se and se < 0.01
    term = CertificateTerm(
        0.0, 0.0, 0.0, 0.0, 0.0, c=1.0, gamma=0.5, heldout_surrogate=value, heldout_se=se,
        heldout_episodes=20_000, kl_heldout=KL, horizon=1, role_turns=1, form=certificate_form(1),
    )  # fmt: skip
    assert term.form == "speak_once" and term.heldout == term.speak_once == value
    assert term.heldout - 2 * se > 0.25
    assert term.general == pytest.approx(value)  # T = 1: no later turn, c_general = 0


def test_speak_once_form_is_wrong_for_a_role_that_speaks_twice() -> None:
    # two turns of one role, reward 1 iff (a, b): J = p_a (1 - p_a) goes 0.25 -> 0.16, but the per-message
    # surrogate is 0 (the first message's gain cancels the second's loss): dropping the own-turn shift term
    # claims J does not fall. The general form (c_general = sqrt(2) * 1 * 1 * 2) covers it.
    reward = np.array([[0.0, 1.0], [0.0, 0.0]])
    improvement = exact_return(NEW, reward, 2) - exact_return(OLD, reward, 2)
    assert improvement == pytest.approx(-0.09)
    value, se = heldout_surrogate(*sample_two_turn(reward, 2, 20_000, seed=1))
    assert abs(value - 0.0) < 4 * se and value - 4 * se > improvement  # L_ho ~ 0 > -0.09 = J change
    term = CertificateTerm(
        0.0, 0.0, 0.0, 0.0, 0.0, c=1.0, gamma=0.5, heldout_surrogate=value, heldout_se=se,
        heldout_episodes=20_000, kl_heldout=KL, horizon=2, role_turns=2, form=certificate_form(2),
    )  # fmt: skip
    assert term.form == "general" and term.c_general == pytest.approx(2 * math.sqrt(2))
    assert term.general is not None and term.general + 4 * se < improvement  # the general form holds
    assert term.speak_once is not None and term.speak_once - 4 * se > improvement  # speak-once does not


def test_stage_forms_sum_the_updates_and_add_errors_in_quadrature() -> None:
    def term(v: float | None, se: float | None, turns: int) -> CertificateTerm:
        return CertificateTerm(
            0.0, 0.0, 0.0, 0.0, 0.0, c=1.0, gamma=0.5, heldout_surrogate=v, heldout_se=se,
            kl_heldout=0.04, horizon=3, role_turns=turns, form=certificate_form(turns),
        )  # fmt: skip

    forms = stage_certificate_forms([term(0.1, 0.03, 1), term(0.2, 0.04, 1)])
    assert forms["form"] == "speak_once"
    assert forms["speak_once"] == forms["heldout"] == pytest.approx(0.3)
    assert forms["se"] == pytest.approx(0.05)
    c_general = math.sqrt(2) * 2 * 1  # T - 1 = 2 later turns, N_j = 1
    assert forms["general"] == pytest.approx(0.3 - 2 * c_general * 0.2)
    mixed = stage_certificate_forms([term(0.1, 0.03, 1), term(0.2, 0.04, 2)])
    assert mixed["form"] == "general" and mixed["heldout"] == mixed["general"]
    assert stage_certificate_forms([term(None, None, 1)])["speak_once"] is None


class _TermTeam:
    """A StageTeam whose updates return given certificate terms (the stage loop only sums them)."""

    def __init__(self, terms: list[CertificateTerm]) -> None:
        self.terms = iter(terms)

    def rollout(self, stage: int, index: int, trains: bool = True) -> None:
        return None

    def update(self, ctx: object) -> SimpleNamespace:
        return SimpleNamespace(certificate=next(self.terms))

    def update_joint(self, stage: int, roles: list[str], batch: None) -> list[SimpleNamespace]:
        return [SimpleNamespace(certificate=next(self.terms)) for _ in roles]


def test_the_stage_certificate_is_the_heldout_form_that_applies_else_the_proxy() -> None:
    def term(v: float | None, turns: int, surrogate: float) -> CertificateTerm:
        return CertificateTerm(
            surrogate, 0.04, 0.0, 0.0, 0.0, c=1.0, gamma=0.5, heldout_surrogate=v, heldout_se=0.01,
            kl_heldout=0.04, horizon=2, role_turns=turns, form=certificate_form(turns),
        )  # fmt: skip

    def stage(terms: list[CertificateTerm], kind: str = "teamtr"):
        return run_stage(_TermTeam(terms), ["a", "b"], ScheduleConfig(kind=kind), 0, random.Random(0))

    once = stage([term(0.1, 1, 0.5), term(0.2, 1, 0.5)])  # every role spoke once: exact, no KL penalty
    assert once.certificate_form == "speak_once" and once.certificate == pytest.approx(0.3)
    twice = stage([term(0.1, 1, 0.5), term(0.2, 2, 0.5)], kind="joint")  # one role spoke twice: general
    c_general = math.sqrt(2) * 1 * 2  # T - 1 = 1 later turn, N_j = 2
    assert twice.certificate_form == "general"
    assert twice.certificate == pytest.approx(0.1 - math.sqrt(2) * 0.2 + 0.2 - c_general * 0.2)
    blind = stage([term(None, 1, 0.5), term(None, 1, 0.5)])  # no held-out episodes: the proxy
    assert blind.certificate_form == "proxy" and blind.certificate == pytest.approx(2 * (0.5 - 0.2))


def test_a_tiny_llm_team_logs_both_forms_per_update_and_per_stage(tmp_path) -> None:
    # the chain team's three roles each speak once, in a fixed order: the speak-once form applies
    from teamtr.training.trainer import Trainer
    from teamtr.training.warmstart import tiny_random_model
    from tests.support.trainer import small_config  # its import registers the test task and team

    model = str(tiny_random_model(tmp_path / "model"))
    cfg = small_config(model, tmp_path / "run", **{"trust_region.heldout_episodes": 12})
    Trainer(cfg).train()
    updates, (stage,) = read_metrics(cfg.run_dir, "update"), read_metrics(cfg.run_dir, "stage")
    for u in updates:
        c = u["certificate"]
        assert c["form"] == "speak_once" and c["role_turns"] == 1 and c["horizon"] == 3
        # an update without signal sampled no held-out episode: its held-out terms are exactly 0
        assert c["heldout_episodes"] == (0 if u["no_signal"] else 12) and 0 <= c["heldout_se"] < math.inf
        assert c["kl_heldout"] == u["kl_out_of_sample"]
        assert c["heldout"] == c["speak_once"] == c["heldout_surrogate"]
        assert c["general"] == pytest.approx(
            c["heldout_surrogate"] - math.sqrt(2) * 2 * math.sqrt(max(u["kl_out_of_sample"], 0.0))
        )
        if not u["accepted"]:
            assert c["heldout_surrogate"] == 0.0
    forms = stage["certificate_forms"]
    assert forms["form"] == "speak_once"
    assert forms["speak_once"] == pytest.approx(sum(u["certificate"]["speak_once"] for u in updates))
    assert forms["general"] <= forms["speak_once"]
    print({u["role"]: (u["certificate"]["speak_once"], u["certificate"]["heldout_se"]) for u in updates})
