"""Per-role credit from a role's own prefix (loss.credit = prefix, training/advantages.py
`prefix_advantages`, training/llm_rollouts.py `prefix_baselines`): the advantage by hand, the baselines
drawn from continuations of each episode's prefix before the role's first turn, an update trained on them,
and the configurations it cannot serve refused with a reason.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from teamtr.training.advantages import prefix_advantages
from teamtr.training.config import LossConfig
from teamtr.training.stage import UpdateContext
from tests.support.trainer import (  # importing it registers the trainer tests' task
    small_config,
    stage_team,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from teamtr.training.warmstart import tiny_random_model

    return str(tiny_random_model(tmp_path_factory.mktemp("tiny") / "model"))


def test_prefix_advantages_by_hand():
    adv = prefix_advantages([1.0, 0.0, 1.0, 0.0], [0.25, math.nan, 1.0, 0.75], ["a", "a", "b", "b"], adv_clip=0.5)
    # R - b, 0 where the role did not speak (NaN baseline), clipped at +-0.5
    assert adv.unclipped.tolist() == [0.75, 0.0, 0.0, -0.75]
    assert adv.values.tolist() == [0.5, 0.0, 0.0, -0.5]
    assert adv.zeta_clip == pytest.approx(0.25 * 2 / 4) and adv.zeta_norm == 0.0
    assert adv.signal_groups == 2  # each group has a nonzero advantage
    assert prefix_advantages([1.0, 1.0], [1.0, 1.0], ["a", "a"]).signal_groups == 0


def test_prefix_credit_refuses_what_has_no_prefix_baseline():
    with pytest.raises(ValidationError, match="credit 'prefix' replaces the group baseline"):
        LossConfig(kind="dapo", credit="prefix")
    with pytest.raises(ValidationError, match="credit 'prefix'"):
        LossConfig(kind="ppo_batch_baseline", credit="prefix")


def test_prefix_baselines_continue_each_episode_from_the_role_prefix_and_train(tiny_model, tmp_path):
    samples = 3
    cfg = small_config(tiny_model, tmp_path / "run", **{"loss.credit": "prefix", "loss.credit_samples": samples})
    team = stage_team(cfg, tiny_model)
    batch = team.rollout(0, 0)
    episodes = len(batch.trajectories)
    for role in ("adder1", "adder3"):
        tokens = team.state.train_tokens
        baselines = team.sampler.prefix_baselines(0, 1, batch, role, samples)
        assert baselines.shape == (episodes,) and not np.isnan(baselines).any()  # every role speaks here
        # a mean of `samples` binary returns, and the continuations' tokens counted as training evidence
        assert all(round(b * samples) == pytest.approx(b * samples) for b in baselines)
        assert team.state.train_tokens > tokens
        # the same draw again (seeded by stage, update, role): resumable
        assert np.array_equal(baselines, team.sampler.prefix_baselines(0, 1, batch, role, samples))
    # adder3 speaks last: its continuations re-sample only its own turn, so they cost fewer tokens than
    # adder1's, which re-run the whole episode from the prompt
    tokens = team.state.train_tokens
    team.sampler.prefix_baselines(0, 2, batch, "adder1", samples)
    whole = team.state.train_tokens - tokens
    tokens = team.state.train_tokens
    team.sampler.prefix_baselines(0, 2, batch, "adder3", samples)
    assert team.state.train_tokens - tokens < whole

    # the update draws its baselines (its continuations are training tokens) and trains on them
    tokens = team.state.train_tokens
    record = team.update(UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False)).record
    assert record["train_tokens"] > tokens and not record["no_signal"] and record["accepted"]
