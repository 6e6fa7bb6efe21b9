"""The paper's baselines and the instruments around an update (issue 25 items 2 and 3): per-loss defaults
survive `with_overrides`, naive.yaml is teamtr.yaml but for the schedule, the sequential baselines are
configs of their own, DAPO's dynamic sampling refills its batch, an update with no signal is no new
version, early stopping works with one minibatch, and every loss and schedule trains end to end (a tiny
random team, seconds per case)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from teamtr.graphs.trajectory import Trajectory
from teamtr.training.config import TrainConfig
from teamtr.training.dynamic_sampling import groups_with_spread, refilled_episodes
from tests.support.trainer import small_config, stage_team, train

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_with_overrides_derives_the_per_loss_defaults_like_from_dict():
    for base in (TrainConfig(), TrainConfig.from_dict({"loss": {"kind": "grpo"}})):
        got = base.with_overrides({"loss.kind": "dapo"}).loss
        want = TrainConfig.from_dict({"loss": {"kind": "dapo"}}).loss
        assert (got.clip_eps_high, got.dynamic_sampling) == (want.clip_eps_high, want.dynamic_sampling) == (0.28, True)
        back = base.with_overrides({"loss.kind": "dapo"}).with_overrides({"loss.kind": "grpo"}).loss
        assert (back.clip_eps_high, back.dynamic_sampling) == (0.2, False)
    # a value the user set is kept through any number of overrides
    mine = TrainConfig.from_dict({"loss": {"kind": "dapo", "clip_eps_high": 0.3, "dynamic_sampling": False}})
    kept = mine.with_overrides({"seed": 3}).with_overrides({"loss.kind": "grpo"}).loss
    assert (kept.clip_eps_high, kept.dynamic_sampling) == (0.3, False)


def test_ppo_without_a_value_function_is_named_for_what_it_is():
    with pytest.raises(ValueError, match="ppo_batch_baseline"):
        TrainConfig.from_dict({"loss": {"kind": "ppo"}})
    assert TrainConfig.from_dict({"loss": {"kind": "ppo_batch_baseline"}}).loss.message_ratio is False


def test_naive_example_is_the_teamtr_example_but_for_the_schedule():
    teamtr, naive = (yaml.safe_load((EXAMPLES / f"{n}.yaml").read_text()) for n in ("teamtr", "naive"))
    for d in (teamtr, naive):
        d.pop("run_dir")
    assert teamtr.pop("schedule")["kind"] == "teamtr" and naive.pop("schedule")["kind"] == "naive"
    assert teamtr == naive
    a = TrainConfig.from_yaml(EXAMPLES / "teamtr.yaml").to_dict()
    b = TrainConfig.from_yaml(EXAMPLES / "naive.yaml").to_dict()
    assert {k for k in a if a[k] != b[k]} == {"run_dir", "schedule"}


@pytest.mark.parametrize("kind", ["ppo_batch_baseline", "grpo", "dapo"])
def test_sequential_baselines_train_on_cached_rollouts(kind):
    seq = TrainConfig.from_yaml(EXAMPLES / f"sequential_{kind}.yaml")
    per_update = TrainConfig.from_yaml(EXAMPLES / f"{kind}.yaml")
    assert seq.schedule.kind == "naive" and per_update.schedule.kind == "teamtr"
    assert seq.loss == per_update.loss and seq.optim == per_update.optim


def _group(gid: str, rewards: list[float]) -> list[Trajectory]:
    return [Trajectory(task_id=gid, turns=[], reward=r, group_id=gid) for r in rewards]


def test_dynamic_sampling_refills_zero_spread_groups():
    first = _group("a", [1, 1]) + _group("b", [0, 1]) + _group("c", [0, 0])
    rounds = {1: _group("d", [0, 0]) + _group("e", [1, 0]), 2: _group("f", [0, 1]) + _group("g", [1, 0])}
    kept, used = refilled_episodes(first, 3, lambda r: rounds[r])
    assert [t.group_id for t in kept] == ["b", "b", "e", "e", "f", "f"] and used == 2
    assert all(len(g) == 2 for g in groups_with_spread(kept))
    # nothing to find: stop after the refill rounds with what was found; none at all: the batch as it was
    kept, used = refilled_episodes(first, 3, lambda r: _group(f"z{r}", [1, 1]), rounds=2)
    assert [t.group_id for t in kept] == ["b", "b"] and used == 2
    flat = _group("a", [1, 1])
    assert refilled_episodes(flat, 1, lambda r: [], rounds=1)[0] == flat


CASES = [  # (loss, schedule): every loss sequentially on cached rollouts, every schedule with TeamTR's loss
    ("message_ratio", "teamtr"),
    ("message_ratio", "naive"),
    ("message_ratio", "joint"),
    ("message_ratio", "importance_weighting"),
    ("ppo_batch_baseline", "naive"),
    ("grpo", "naive"),
    ("dapo", "naive"),
    ("dapo", "teamtr"),
]


@pytest.mark.parametrize(("loss", "schedule"), CASES)
def test_every_loss_and_schedule_trains_end_to_end(tiny_model, tmp_path, loss, schedule):  # noqa: F811
    cfg = small_config(
        tiny_model,
        tmp_path / "run",
        **{"loss.kind": loss, "schedule.kind": schedule, "trust_region.heldout_episodes": 4},
    )
    updates = train(cfg)
    assert len(updates) == 3  # one per role
    for u in updates:
        assert math.isfinite(u["d_hat"]) and u["delta_eff"] is not None
        bumped = u["version_after"] - u["versions_before"][u["adapter"]]
        assert bumped == int(u["accepted"]) and isinstance(u["no_signal"], bool)
        if u["messages"]:  # (dapo: every group dropped leaves no message, and nothing was promised)
            assert u["stale_penalty"] == pytest.approx(u["surrogate_promised"] - u["surrogate_heldout"])


def test_an_update_with_all_advantages_zero_is_no_new_version(tiny_model, tmp_path):  # noqa: F811
    from teamtr.graphs.team import derive_seed
    from teamtr.training.stage import UpdateContext
    from teamtr.training.teamtr_step import teamtr_step

    cfg = small_config(tiny_model, tmp_path / "run")
    team = stage_team(cfg, tiny_model)
    batch = team.rollout(0, 0)
    for traj in batch.trajectories:
        traj.reward = 1.0  # every group without spread: every advantage 0
    role = next(iter(team.roles))
    policy = team.policies[team.roles[role].adapter]
    before = (policy.version(), {k: v.clone() for k, v in policy.weights().items()})
    ctx = UpdateContext(0, 1, role, batch, batch, fresh=True, reweight=False)
    step = teamtr_step(ctx.batch, role, policy, 1.0, cfg, minibatch_seed=lambda a: derive_seed(0, a))
    assert step.no_signal and not step.accepted
    assert step.version == policy.version() == before[0]  # no new version ...
    assert all(torch.equal(v, before[1][k]) for k, v in policy.weights().items())  # ... and the weights as they were
    assert step.region.attempts[0].epochs_run == 0  # nothing was optimised


def test_early_stopping_fires_with_one_minibatch(tiny_model, tmp_path):  # noqa: F811
    from teamtr.graphs.team import derive_seed
    from teamtr.training.teamtr_step import teamtr_step

    # every message in one minibatch, a step far larger than delta: epoch 1 ends outside the region
    cfg = small_config(
        tiny_model,
        tmp_path / "run",
        **{"optim.minibatch_messages": 1000, "optim.epochs": 4, "optim.lr": 0.3, "trust_region.delta": 1e-6,
           "trust_region.max_backtracks": 0, "trust_region.check": "sampled"},
    )  # fmt: skip
    team = stage_team(cfg, tiny_model)
    batch = team.rollout(0, 0)
    role = next(iter(team.roles))
    policy = team.policies[team.roles[role].adapter]
    step = teamtr_step(batch, role, policy, 0.0, cfg, minibatch_seed=lambda a: derive_seed(0, a))
    (attempt,) = step.region.attempts
    assert attempt.early_stopped and attempt.epochs_run == 1 and attempt.d_hat > cfg.trust_region.delta
