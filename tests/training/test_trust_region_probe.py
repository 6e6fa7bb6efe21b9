"""The enforced trust region (trust_region.check = probe, training/probe_check.py `optimise_inside_region`)
and the evidence rules around it: the line search never keeps an iterate beyond delta on its probe (checked
here by a brute-force vocabulary KL computed independently), a non-finite step is refused bit for bit, rloo
advantages by hand, too little signal skips the update, eval.keep_best undoes a stage that validated
worse than the best earlier one, and trust_region.penalty_kl = exact puts the region's own KL in eq. 10.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from teamtr.engines.embedded_scoring import enable_body_checkpointing
from teamtr.engines.random_adapters import randomise_adapters
from teamtr.graphs.run_layout import read_metrics, versions_after_stage
from teamtr.training.advantages import advantages_for, group_normalised_advantages
from teamtr.training.penalised_objective import penalised_gradient
from teamtr.training.rollouts import messages_of_role
from teamtr.training.stage import UpdateContext
from teamtr.training.stage_safety import BestStage
from teamtr.training.trust_region import ExactRegion
from teamtr.training.vocab_kl import Side
from tests.support.trainer import (  # importing it registers the trainer tests' task
    small_config,
    stage_team,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from teamtr.training.warmstart import tiny_random_model

    return str(tiny_random_model(tmp_path_factory.mktemp("tiny") / "model"))


def brute_force_kl(engine, adapter, prompts, completions, p_weights, q_weights, direction):
    """Per-message sum over positions of the exact KL between the adapter at p_weights and at q_weights,
    one prefix at a time through the engine's own scoring of every vocabulary token (no shared code with
    training/vocab_kl.py)."""
    model = engine.model()
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        total = 0.0
        for u in range(len(completion)):
            ids = torch.tensor([list(prompt) + list(completion[:u])])
            dists = []
            for w in (p_weights, q_weights):
                engine.restore_adapter(adapter, w)
                model.set_adapter(adapter)
                with torch.no_grad():
                    dists.append(torch.log_softmax(model(input_ids=ids).logits[0, -1].double(), -1))
            p, q = dists
            forward, reverse = float((p.exp() * (p - q)).sum()), float((q.exp() * (q - p)).sum())
            total += {"forward": forward, "reverse": reverse, "max": max(forward, reverse)}[direction]
        out.append(total)
    engine.restore_adapter(adapter, q_weights)
    return out


@pytest.mark.parametrize(("direction", "search"), [("max", "bracket"), ("forward", "bracket"), ("max", "halving")])
def test_the_line_search_never_keeps_an_iterate_beyond_delta_on_its_probe(tiny_model, tmp_path, direction, search):
    delta = 0.02
    cfg = small_config(
        tiny_model, tmp_path / "run",
        # RAdam's first steps are momentum SGD, so some fraction of a step at lr 0.3 fits the region (AdamW's
        # sign step at this lr leaves it even at 2^-6 of its length: the update would keep no step)
        **{"optim.lr": 0.3, "optim.epochs": 4, "optim.optimizer": "radam", "trust_region.delta": delta,
           "trust_region.direction": direction, "trust_region.probe_episodes": 6,
           "trust_region.line_search": search},
    )  # fmt: skip
    team = stage_team(cfg, tiny_model)
    engine, policy = team.engine, team.policies["adder1"]
    batch = team.rollout(0, 0)
    ctx = UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False)
    probe = team.probe_contexts(ctx)  # the same seeded episodes the update will draw
    start = policy.weights()
    record = team.update(ctx).record
    # lr 0.3 leaves the region at once: the step was line-searched back onto it, and kept
    assert record["accepted"] and record["stop"] == "boundary", record
    assert record["probe_messages"] == len(probe[0]) > 0
    now = policy.weights()
    probe_kl = brute_force_kl(engine, "adder1", *probe, start, now, direction)
    batch_kl = brute_force_kl(engine, "adder1", batch_prompts(batch), batch_completions(batch), start, now, direction)
    assert record["kl_probe"] == pytest.approx(float(np.mean(probe_kl)), rel=1e-3, abs=1e-7)
    assert record["kl_batch_exact"] == pytest.approx(float(np.mean(batch_kl)), rel=1e-3, abs=1e-7)
    assert float(np.mean(probe_kl)) <= record["kl_probe_ucb"] <= delta
    assert float(np.mean(batch_kl)) <= delta
    assert 0 < record["d_hat"] <= delta
    if search == "bracket":  # the farthest point found inside: near the boundary, not a quarter of it
        assert record["d_hat"] >= 0.75 * 0.9 * delta, record["d_hat"]


def test_extrapolation_scales_a_short_update_towards_delta_and_stays_inside(tiny_model, tmp_path):
    """trust_region.extrapolate: an update whose epochs end well inside (RAdam's first steps at a small lr)
    is scaled along its displacement towards line_search_target * delta; the point kept is inside on the
    probe (brute-force KL) and farther than the unscaled end."""
    delta = 0.02
    records, kls = {}, {}
    for extrapolate in (False, True):
        cfg = small_config(
            tiny_model, tmp_path / f"run-{extrapolate}",
            **{"optim.lr": 1e-2, "optim.epochs": 2, "optim.optimizer": "radam", "trust_region.delta": delta,
               "trust_region.probe_episodes": 6, "trust_region.extrapolate": extrapolate},
        )  # fmt: skip
        team = stage_team(cfg, tiny_model)
        engine, policy = team.engine, team.policies["adder1"]
        batch = team.rollout(0, 0)
        ctx = UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False)
        probe = team.probe_contexts(ctx)
        start = policy.weights()
        records[extrapolate] = team.update(ctx).record
        kls[extrapolate] = float(np.mean(brute_force_kl(engine, "adder1", *probe, start, policy.weights(), "max")))
    short, scaled = records[False], records[True]
    assert short["accepted"] and short["stop"] == "epochs" and short["d_hat"] < 0.3 * delta, short
    assert scaled["accepted"] and scaled["stop"] == "extrapolated", scaled
    assert scaled["kl_probe"] == pytest.approx(kls[True], rel=1e-3, abs=1e-7)
    assert kls[True] <= scaled["kl_probe_ucb"] <= delta
    # here 0.08 delta scaled to 0.81 delta (aimed at 0.9: the KL is close to quadratic along the line)
    assert kls[True] > 2 * kls[False] and scaled["d_hat"] >= 0.5 * delta


def test_extrapolation_rounds_carry_a_capped_step_further_and_stay_inside(tiny_model, tmp_path):
    """A step so short that one scaling by `extrapolate_max` (2 here) leaves it far inside is scaled again
    from the point reached, measured each time: with 4 rounds it ends farther than with 1, and inside on
    the probe by a brute-force KL."""
    records, kls = {}, {}
    for rounds in (1, 4):
        cfg = small_config(
            tiny_model, tmp_path / f"run-{rounds}",
            **{"optim.lr": 1e-3, "optim.epochs": 1, "optim.optimizer": "radam", "trust_region.delta": 0.02,
               "trust_region.probe_episodes": 6, "trust_region.extrapolate_max": 2.0,
               "trust_region.extrapolate_rounds": rounds},
        )  # fmt: skip
        team = stage_team(cfg, tiny_model)
        batch = team.rollout(0, 0)
        ctx = UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False)
        probe = team.probe_contexts(ctx)
        start = team.policies["adder1"].weights()
        records[rounds] = team.update(ctx).record
        now = team.policies["adder1"].weights()
        kls[rounds] = float(np.mean(brute_force_kl(team.engine, "adder1", *probe, start, now, "max")))
    one, four = records[1], records[4]
    assert one["stop"] == four["stop"] == "extrapolated"
    assert one["extrapolate_scale"] == pytest.approx(2.0, rel=1e-4)  # capped once, no further round
    assert four["extrapolate_scale"] > 2.0 * 1.5 and kls[4] > kls[1]  # further along the same line
    assert kls[4] <= four["kl_probe_ucb"] <= 0.02 and four["d_hat"] <= 0.02


def batch_prompts(batch):
    return [t.prompt_ids for traj in batch.trajectories for t in traj.turns_of("adder1") if t.completion_ids]


def batch_completions(batch):
    return [t.completion_ids for traj in batch.trajectories for t in traj.turns_of("adder1") if t.completion_ids]


def test_a_non_finite_step_is_refused_and_leaves_the_adapter_bit_identical(tiny_model, tmp_path):
    cfg = small_config(tiny_model, tmp_path / "run", **{"optim.lr": math.inf, "trust_region.probe_episodes": 3})
    team = stage_team(cfg, tiny_model)
    policy = team.policies["adder1"]
    batch = team.rollout(0, 0)
    before = policy.weights()
    record = team.update(UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False)).record
    assert not record["accepted"] and record["stop"] == "non_finite" and record["d_hat"] == 0.0
    for k, v in policy.weights().items():
        assert torch.equal(v, before[k]), k
    assert not any(torch.isnan(s).any() for st in policy.optimizer.state.values() for s in st.values()
                   if torch.is_tensor(s))  # fmt: skip


def test_rloo_advantages_by_hand_and_the_signal_count():
    rewards = [1, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    groups = ["a"] * 4 + ["b"] * 4 + ["c"] * 2
    adv = group_normalised_advantages(rewards, groups, baseline="rloo")
    # R_g - mean of the other three: a = [1 - 0, 0 - 1/3, 0 - 1/3, 0 - 1/3]; b has no spread; c = [0, 0]
    assert np.allclose(adv.values, [1, -1 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0, 0, 0])
    assert adv.signal_groups == 1 and adv.zeta_norm == 0.0
    # a lone failure among 16 weighs 1 under rloo, the clip's 3 under group normalisation
    lone = [0] + [1] * 15
    assert group_normalised_advantages(lone, ["g"] * 16, baseline="rloo").values[0] == pytest.approx(-1.0)
    assert group_normalised_advantages(lone, ["g"] * 16, baseline="group_normalised").values[0] == -3.0


def test_too_few_groups_with_signal_skip_the_update(tiny_model, tmp_path):
    cfg = small_config(tiny_model, tmp_path / "run", **{"loss.min_signal_groups": 99})
    team = stage_team(cfg, tiny_model)
    batch = team.rollout(0, 0)
    before = team.policies["adder1"].weights()
    probe_tokens = team.state.probe_tokens
    record = team.update(UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False)).record
    assert record["no_signal"] and not record["accepted"] and record["signal_groups"] < 99
    # nothing to hold inside a region: no probe episode was sampled for it
    assert record["probe_messages"] == 0 and team.state.probe_tokens == probe_tokens
    assert all(torch.equal(v, before[k]) for k, v in team.policies["adder1"].weights().items())


def test_keep_best_undoes_a_stage_below_the_best_beyond_noise(tiny_model, tmp_path):
    from teamtr.training.trainer import Trainer

    cfg = small_config(tiny_model, tmp_path / "run")
    team = stage_team(cfg, tiny_model)
    trainer = Trainer(cfg)
    start = {a: p.weights() for a, p in team.policies.items()}
    trainer.best.offer(0, {"accuracy": 0.6, "episodes": 200}, start)
    for p in team.policies.values():  # a stage that moved every role
        p.load_weights({k: v + 0.1 for k, v in p.weights().items()})
        p.commit()
    team.metrics.log("stage", 0, stage=1)  # the stage record versions_after_stage counts
    # within noise of the best: kept, and it becomes the best when higher
    assert trainer._keep_best(team, 0, {"accuracy": 0.55, "episodes": 200}) is None
    assert trainer.best.stage == 0
    # beyond noise below the best (0.6 vs 0.4 over 200 episodes: 4.2 standard errors): undone
    assert trainer._keep_best(team, 0, {"accuracy": 0.4, "episodes": 200}) == 0
    for adapter, policy in team.policies.items():
        assert all(torch.equal(v, start[adapter][k]) for k, v in policy.weights().items())
        assert policy.version() == 2  # v1 the stage's update, v2 the revert
    reverts = read_metrics(tmp_path / "run", kind="revert")
    assert {r["adapter"] for r in reverts} == set(team.policies) and all(r["reverted_to"] == 0 for r in reverts)
    assert set(versions_after_stage(tmp_path / "run", 1).values()) == {2}
    # a better stage becomes the best
    best = BestStage()
    best.offer(0, {"accuracy": 0.5, "episodes": 100}, {})
    best.offer(3, {"accuracy": 0.7, "episodes": 100}, {})
    assert best.stage == 3 and not best.should_revert({"accuracy": 0.69, "episodes": 100})


class _LinePolicy:
    """One weight moved along a line, for the line search alone (training/probe_check.py `line_search`)."""

    def __init__(self, w: float) -> None:
        self.w = {"w": torch.tensor(w, dtype=torch.float64)}

    def weights(self):
        return {k: v.clone() for k, v in self.w.items()}

    def load_weights(self, weights):
        self.w = {k: v.clone() for k, v in weights.items()}

    def agree(self, value: float) -> float:
        return value


class _LineRegion:
    def __init__(self, policy: _LinePolicy, kl, delta: float) -> None:
        self.policy, self.kl, self.delta = policy, kl, delta

    def check(self):
        from teamtr.training.trust_region import RegionCheck

        v = self.kl(float(self.policy.w["w"]))
        return RegionCheck(v, v, v, self.delta)


@pytest.mark.parametrize("search", ["bracket", "halving"])
def test_the_bracket_finds_an_inside_point_wherever_halving_does(search):
    from teamtr.training.config import TrustRegionConfig
    from teamtr.training.probe_check import line_search
    from teamtr.training.trust_region import RegionCheck

    delta = 0.05
    tr = TrustRegionConfig(delta=delta, line_search=search)
    # a KL that levels off just above delta along the line (a steep first step): inside only below a = 1/50,
    # where interpolating sqrt(KL) alone would shrink the bracket by 10% a try and never get there
    def kl(a):
        return 0.055 * (1 - math.exp(-119.9 * a))

    assert kl(1 / 64) < delta < kl(1 / 32) and kl(1.0) > delta
    policy = _LinePolicy(1.0)  # the step ended at a = 1 (theta_prev at 0)
    region = _LineRegion(policy, kl, delta)
    kept = line_search(policy, region, {"w": torch.tensor(0.0, dtype=torch.float64)},
                       RegionCheck(0, 0, 0, delta), region.check(), tr)  # fmt: skip
    assert kept is not None and kept.inside and kept.value == kl(float(policy.w["w"]))
    if search == "bracket":  # and at least as near the boundary as halving's 1/64
        assert kept.value >= kl(1 / 64)


def test_the_exact_penalty_is_the_region_s_kl_and_its_gradient_pulls_the_adapter_back(tiny_model, tmp_path):
    """trust_region.penalty_kl = exact: eq. 10's d_hat is the KL the region constrains (max direction, exact
    vocabulary sums on the batch's contexts) with its gradient; zero (no graph) before pi_cur's states are
    kept; a small step down its gradient brings the adapter back towards pi_cur."""
    cfg = small_config(tiny_model, tmp_path / "run", **{"trust_region.penalty_kl": "exact"})
    team = stage_team(cfg, tiny_model)
    engine, policy = team.engine, team.policies["adder1"]
    batch = team.rollout(0, 0)
    contexts = (batch_prompts(batch), batch_completions(batch))
    region = ExactRegion(Side(engine, policy.base, "adder1"), 1.0, contexts, ([], []), cfg.trust_region)
    every = torch.arange(len(contexts[0]))
    assert not region.penalty(every).requires_grad  # no check yet: pi_now = pi_cur
    assert region.check().batch == 0.0  # keeps pi_cur's states
    randomise_adapters(engine, ["adder1"], std=0.05, seed=3)
    d_hat = region.penalty(every)
    measured = float(region.per_message("batch").mean())
    assert measured > 1e-4 and float(d_hat.detach()) == pytest.approx(measured, rel=1e-5)
    # a subset: the mean of those messages' own KLs
    some = every[::2]
    assert float(region.penalty(some).detach()) == pytest.approx(float(region.per_message("batch")[some].mean()), rel=1e-5)
    # in eq. 10's gradient (penalised_objective.penalised_gradient): one pass, or one pass per message (a token
    # budget of 1), the same gradient
    msgs = messages_of_role(batch, "adder1", advantages_for(batch.rewards, batch.groups, cfg.loss))
    assert (msgs.prompts, msgs.completions) == contexts
    old_logp = policy.logp(msgs, grad=False)
    by_budget = {}
    for budget in (policy.token_budget, 1):
        policy.token_budget = budget
        penalised_gradient(policy, msgs, old_logp, cfg, 2.0, region, every)
        by_budget[budget] = {k: p.grad.clone() for k, p in policy.params.items() if p.grad is not None}
    # ... and with the body's layers checkpointed (optim.gradient_checkpointing)
    enable_body_checkpointing(engine.model(policy.base))
    policy.gradient_checkpointing, policy.token_budget = True, 10**6
    penalised_gradient(policy, msgs, old_logp, cfg, 2.0, region, every)
    checkpointed = {k: p.grad.clone() for k, p in policy.params.items() if p.grad is not None}
    one_pass, per_message = by_budget.values()
    assert one_pass.keys() == per_message.keys() == checkpointed.keys() and one_pass
    for k in one_pass:
        torch.testing.assert_close(per_message[k], one_pass[k], rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(checkpointed[k], one_pass[k], rtol=1e-4, atol=1e-7)
    policy.optimizer.zero_grad(set_to_none=True)
    d_hat.backward()
    grads = [p.grad for p in policy.params.values() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
    with torch.no_grad():
        for p in policy.params.values():
            if p.grad is not None:
                p -= 0.5 * measured / sum(float((g**2).sum()) for g in grads) * p.grad
    assert float(region.per_message("batch").mean()) < measured


def test_an_update_with_the_exact_penalty_stays_inside_and_moves_otherwise(tiny_model, tmp_path):
    """The whole step with penalty_kl = exact: accepted inside delta on its probe, at weights that differ
    from the sampled penalty's (the penalty is in the gradient). Refused without the probe check."""
    weights, records = {}, {}
    for penalty in ("sampled", "exact"):
        cfg = small_config(
            tiny_model, tmp_path / penalty,
            **{"optim.lr": 0.05, "optim.optimizer": "radam", "trust_region.delta": 0.02,
               "trust_region.probe_episodes": 6, "trust_region.penalty_kl": penalty},
        )  # fmt: skip
        team = stage_team(cfg, tiny_model)
        batch = team.rollout(0, 0)
        records[penalty] = team.update(UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False)).record
        weights[penalty] = team.policies["adder1"].weights()
    for record in records.values():
        assert record["accepted"] and 0 < record["kl_probe_ucb"] <= 0.02, record
    assert any(not torch.equal(weights["sampled"][k], weights["exact"][k]) for k in weights["exact"])
    for other in ({"trust_region.check": "sampled"}, {"trust_region.enabled": False}):
        with pytest.raises(ValueError, match="penalty_kl 'exact'"):
            small_config(tiny_model, tmp_path / "x", **{"trust_region.penalty_kl": "exact", **other})
    with pytest.raises(ValueError, match="penalty_kl exact"):
        small_config(tiny_model, tmp_path / "x", **{"trust_region.penalty_kl": "exact", "schedule.kind": "joint"})
