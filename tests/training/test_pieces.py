"""The algorithm's pieces against hand-computed values (docs/training.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from teamtr.theory.env import chain_instance, chain_warm_logits
from teamtr.theory.team import TabularTeam, train
from teamtr.training.advantages import group_normalised_advantages
from teamtr.training.certificate import (
    CertificateTerm,
    certificate_constant,
    rank_correlation,
    stage_certificate,
)
from teamtr.training.config import TrainConfig, merge
from teamtr.training.losses import clipped_surrogate, kl_estimates, penalised_loss
from teamtr.training.stage import ScheduleConfig
from teamtr.training.trust_region import AdapterState, AttemptResult, enforce_trust_region, next_beta

torch.set_num_threads(1)


def test_group_normalised_advantages_by_hand():
    # group a: rewards 1, 0 -> mean 0.5, var 0.25 -> A = +-0.5/sqrt(0.25+eps)
    # group b: 1, 1, 1, 0 -> mean 0.75, var 0.1875
    adv = group_normalised_advantages(
        [1, 0, 1, 1, 1, 0], ["a", "a", "b", "b", "b", "b"], adv_clip=1.5, eps=0.0
    )
    s = math.sqrt(0.1875)
    expected_unclipped = [1.0, -1.0, 0.25 / s, 0.25 / s, 0.25 / s, -0.75 / s]
    np.testing.assert_allclose(adv.unclipped, expected_unclipped)
    np.testing.assert_allclose(adv.values, [1.0, -1.0, 0.25 / s, 0.25 / s, 0.25 / s, -1.5])  # -1.732 clipped
    assert adv.zeta_clip == pytest.approx((0.75 / s - 1.5) / 6)
    # leave-one-out gap |A| / (G - 1): group a G=2, group b G=4
    loo = [1.0, 1.0] + [abs(a) / 3 for a in expected_unclipped[2:]]
    assert adv.zeta_norm == pytest.approx(np.mean(loo))
    assert adv.a_max == 1.5


def test_dynamic_sampling_drops_zero_spread_groups():
    adv = group_normalised_advantages([1, 1, 0, 1], ["a", "a", "b", "b"], drop_zero_spread=True)
    assert adv.keep.tolist() == [False, False, True, True]
    np.testing.assert_allclose(adv.values[:2], 0.0)


def test_message_ratio_and_clipping_by_hand():
    old = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    new = torch.tensor([[-0.9, -1.8], [-1.5, -1.0]])  # message log-ratios 0.3 and -0.5
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # second message has one token: log-ratio -0.5
    adv = torch.tensor([1.0, -2.0])
    s = clipped_surrogate(new, old, mask, adv, clip_eps=0.2, clip_eps_high=0.2, message_ratio=True)
    w1, w2 = math.exp(0.3), math.exp(-0.5)
    term1 = min(w1 * 1.0, 1.2 * 1.0)  # clipped at 1 + eps
    term2 = min(w2 * -2.0, 0.8 * -2.0)  # pessimistic: the clipped 0.8 * A is lower
    assert s.objective.item() == pytest.approx((term1 + term2) / 2, rel=1e-6)
    assert s.improvement.item() == pytest.approx((term1 + term2) / 2 - (1.0 - 2.0) / 2, rel=1e-6)
    assert term2 == 0.8 * -2.0
    assert s.zeta_ratio.item() == pytest.approx((abs(term1 - w1) + abs(term2 - w2 * -2.0)) / 2, rel=1e-6)
    assert s.clip_fraction.item() == pytest.approx(1.0)
    # a ratio inside [1 - eps, 1 + eps] is not clipped
    inside = clipped_surrogate(
        old + 0.01, old, mask, adv, clip_eps=0.2, clip_eps_high=0.2, message_ratio=True
    )
    assert inside.clip_fraction.item() == 0.0 and inside.zeta_ratio.item() == 0.0


def test_per_token_ratio_and_dapo_aggregation_by_hand():
    old = torch.zeros((2, 2))
    new = torch.tensor([[0.1, 0.5], [-0.1, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, 1.0])
    toks = [min(math.exp(0.1), 1.28), min(math.exp(0.5), 1.28), min(math.exp(-0.1), 1.28)]
    ppo = clipped_surrogate(new, old, mask, adv, clip_eps=0.2, clip_eps_high=0.28, message_ratio=False)
    assert ppo.objective.item() == pytest.approx(((toks[0] + toks[1]) / 2 + toks[2]) / 2, rel=1e-6)
    dapo = clipped_surrogate(
        new,
        old,
        mask,
        adv,
        clip_eps=0.2,
        clip_eps_high=0.28,
        message_ratio=False,
        token_level_aggregation=True,
    )
    assert dapo.objective.item() == pytest.approx(sum(toks) / 3, rel=1e-6)


def test_kl_estimators_k1_and_k3_by_hand():
    old = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    new = torch.tensor([[-1.2, -1.9], [-0.4, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    kl = kl_estimates(new, old, mask)
    # k1 per token: old - new = 0.2, -0.1 | -0.1
    assert kl.k1_message.item() == pytest.approx(((0.2 - 0.1) + (-0.1)) / 2, abs=1e-7)
    assert kl.k1_token.item() == pytest.approx((0.2 - 0.1 - 0.1) / 3, abs=1e-7)

    def k3(log_r: float) -> float:
        return math.exp(log_r) - 1 - log_r

    assert kl.k3_message.item() == pytest.approx(((k3(-0.2) + k3(0.1)) + k3(0.1)) / 2, rel=1e-5)
    assert kl.k3_token.item() == pytest.approx((k3(-0.2) + k3(0.1) + k3(0.1)) / 3, rel=1e-5)
    # eq. 10 as a loss: -(surrogate - beta * d_hat)
    s = clipped_surrogate(new, old, mask, torch.ones(2), clip_eps=0.2, clip_eps_high=0.2, message_ratio=True)
    loss = penalised_loss(s, kl, beta=3.0)
    assert loss.item() == pytest.approx(-(s.objective.item() - 3.0 * kl.k1_message.item()), rel=1e-6)


def test_k3_is_its_closed_form_and_zero_exactly_when_the_policies_agree():
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 5, generator=gen) * 3
    new = old + torch.randn(4, 5, generator=gen) * 0.3
    mask = torch.ones(4, 5)
    mask[2, 3:] = 0.0  # a shorter message: padding must not count
    log_r = (new - old).double().numpy()
    per_token = (np.exp(log_r) - 1.0 - log_r) * mask.numpy()  # (r - 1) - log r, r = pi_new / pi_cur
    kl = kl_estimates(new, old, mask)
    assert kl.k3_message.item() == pytest.approx(per_token.sum(1).mean(), rel=1e-5)
    assert kl.k3_token.item() == pytest.approx(per_token.sum() / mask.sum().item(), rel=1e-5)
    agree = kl_estimates(old, old, mask)
    assert agree.k3_message.item() == 0.0 and agree.k3_token.item() == 0.0
    one_token_moved = old.clone()
    one_token_moved[1, 2] += 0.05  # pi_new differs from pi_cur on a single sampled token
    assert kl_estimates(one_token_moved, old, mask).k3_message.item() > 0.0
    padding_moved = old.clone()
    padding_moved[2, 4] += 5.0  # a padded position is no token: the policies still agree
    assert kl_estimates(padding_moved, old, mask).k3_message.item() == 0.0


def test_surrogate_is_zero_improvement_at_the_old_policy():
    logp = torch.randn(5, 4)
    s = clipped_surrogate(
        logp, logp, torch.ones(5, 4), torch.randn(5), clip_eps=0.2, clip_eps_high=0.2, message_ratio=True
    )
    assert s.improvement.item() == pytest.approx(0.0, abs=1e-7)
    assert kl_estimates(logp, logp, torch.ones(5, 4)).k1_message.item() == 0.0


def test_certificate_arithmetic_by_hand():
    c = certificate_constant(0.5, 3.0)
    assert c == pytest.approx(math.sqrt(2) * 0.5 * 3.0 / 0.25)
    t1 = CertificateTerm(
        surrogate=0.2, d_hat=0.01, zeta_clip=0.01, zeta_ratio=0.02, zeta_norm=0.03, c=c, gamma=0.5
    )
    t2 = CertificateTerm(surrogate=0.1, d_hat=-0.001, zeta_clip=0, zeta_ratio=0, zeta_norm=0, c=c, gamma=0.5)
    assert t1.value == pytest.approx(0.2 - c * 0.1 - 0.06 / 0.5)
    assert t2.value == pytest.approx(0.1)  # a negative k1 estimate contributes no KL penalty
    assert stage_certificate([t1, t2]) == pytest.approx(t1.value + t2.value)
    assert rank_correlation([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert rank_correlation([1, 2], [1, 2]) is None


def test_the_stage_loop_sums_no_certificate_for_an_exact_team():
    # the exact tabular team logs exact quantities, not certificate terms: its stages carry none
    rng = np.random.default_rng(0)
    instance = chain_instance(3, rng, rounds=2)
    (stage,) = train(
        TabularTeam(instance, chain_warm_logits(instance, rng), 0.01), ScheduleConfig(), stages=1
    )
    assert len(stage.updates) == 3 and all(u.certificate is None for u in stage.updates)
    assert stage.certificate is None


def test_adaptive_beta():
    cfg = TrainConfig().trust_region
    assert next_beta(1.0, 2 * cfg.delta, cfg) == 2.0
    assert next_beta(1.0, cfg.delta / 2, cfg) == 0.5
    assert next_beta(1.0, cfg.delta, cfg) == 1.0
    fixed = cfg.model_copy(update={"penalty": "fixed"})
    assert next_beta(1.0, 10 * cfg.delta, fixed) == 1.0


def _toy_update(param: torch.nn.Parameter, opt: torch.optim.Optimizer, step_sizes: list[float]):
    """An 'update' whose KL grows with the step: d_hat = |param - start|."""
    start = param.detach().clone()

    def attempt(lr: float, beta: float) -> AttemptResult:
        step_sizes.append(lr)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        (-param.sum()).backward()
        opt.step()
        return AttemptResult(
            d_hat=float((param.detach() - start).abs().max()), epochs_run=1, early_stopped=False
        )

    def snapshot():
        state = AdapterState({"p": param}, opt).save()
        return state.restore

    return attempt, snapshot


def test_backtracking_accepts_a_smaller_step_inside_delta():
    param = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([param], lr=1.0)
    lrs: list[float] = []
    attempt, snapshot = _toy_update(param, opt, lrs)
    cfg = TrainConfig().trust_region.model_copy(update={"delta": 0.3, "max_backtracks": 3})
    out = enforce_trust_region(attempt, snapshot, cfg, lr=1.0, beta=1.0)
    assert out.accepted and out.left_region and out.backtracks == 2  # lr 1.0 -> 0.5 -> 0.25
    assert lrs == [1.0, 0.5, 0.25]
    assert out.d_hat <= cfg.delta
    assert torch.allclose(param.detach(), torch.full((3,), 0.25))
    # the accepted attempt's own result comes back (what the step reads pi_new's log-probs from)
    assert (
        out.accepted_attempt is not None and out.accepted_attempt.d_hat == out.d_hat == out.attempts[-1].d_hat
    )


def test_rejected_update_restores_weights_and_optimizer_bit_identically():
    param = torch.nn.Parameter(torch.randn(4))
    opt = torch.optim.AdamW([param], lr=0.1)
    (-param.sum()).backward()
    opt.step()  # optimizer has state now
    before = param.detach().clone()
    state_before = {k: v.clone() for k, v in opt.state[param].items() if torch.is_tensor(v)}
    lrs: list[float] = []
    attempt, snapshot = _toy_update(param, opt, lrs)
    cfg = TrainConfig().trust_region.model_copy(update={"delta": 1e-9, "max_backtracks": 2})
    out = enforce_trust_region(attempt, snapshot, cfg, lr=0.1, beta=1.0)
    assert not out.accepted and len(out.attempts) == 3 and out.accepted_attempt is None
    assert torch.equal(param.detach(), before)
    for k, v in state_before.items():
        assert torch.equal(opt.state[param][k], v)


def test_config_yaml_roundtrip_and_errors(tmp_path):
    cfg = TrainConfig.from_dict({"loss": {"kind": "dapo"}, "schedule": {"kind": "naive"}})
    assert cfg.loss.clip_eps_high == 0.28 and cfg.loss.dynamic_sampling
    path = tmp_path / "c.yaml"
    cfg.to_yaml(path)
    again = TrainConfig.from_yaml(path)
    assert again.to_dict() == cfg.to_dict()
    with pytest.raises(ValueError):
        TrainConfig.from_dict({"optim": {"learning_rate": 1.0}})  # typo: unknown key
    with pytest.raises(ValueError):
        TrainConfig.from_dict({"schedule": {"kind": "sometimes"}})
    assert merge({"a": {"b": 1, "c": 2}}, {"a.b": 5}) == {"a": {"b": 5, "c": 2}}
