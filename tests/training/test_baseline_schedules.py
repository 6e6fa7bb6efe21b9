"""The baselines are what they are called (issue 37 item 1), on the trainer tests' tiny team:

- `joint` is the paper's joint update (training/joint_step.py): one objective over every role's messages, a
  step that stays inside each role's region, and adapters that differ from the naive schedule's (before,
  `joint` called the per-role update on the stage-start batch, which is naive sequential bit for bit);
- `team.shared_adapter`: one adapter speaks every role and is updated once per stage on all their messages.
"""

# ruff: noqa: F811 (the tiny_model fixture, imported, is every test's argument)
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from teamtr.graphs.run_layout import read_metrics
from tests.support.trainer import small_config, stage_team, train

torch.set_num_threads(1)

ROLES = ["adder1", "adder2", "adder3"]
# the odd-start task: about half of a random model's final messages are rewarded, so every batch has signal
JOINT = {"task.name": "test-odd-start", "schedule.kind": "joint", "trust_region.probe_episodes": 4,
         "trust_region.heldout_episodes": 4, "eval.stage_episodes": 0}  # fmt: skip


# a first AdamW step far outside delta, searched back by halving (see the line-search test)
# AdamW at lr 0.2 without extrapolation: a first step of lr * sign(g) that leaves the region at once
STEEP = {"optim.lr": 0.2, "optim.optimizer": "adamw", "trust_region.extrapolate": False,
         "trust_region.delta": 0.05, "trust_region.line_search": "halving"}  # fmt: skip


def final_adapters(run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for role_dir in sorted((run_dir / "adapters").iterdir()):
        last = max(role_dir.iterdir(), key=lambda p: int(p.name[1:]))
        out[role_dir.name] = load_file(last / "adapter_model.safetensors")
    return out


def test_joint_trains_other_adapters_than_naive(tiny_model, tmp_path):
    runs = {}
    for kind in ("naive", "joint"):
        cfg = small_config(tiny_model, tmp_path / kind, **{**JOINT, "schedule.kind": kind})
        updates = train(cfg)
        assert all(u["accepted"] for u in updates), kind
        runs[kind] = final_adapters(tmp_path / kind)
    assert runs["naive"].keys() == runs["joint"].keys() == set(ROLES)
    # same seed, same stage-start batch (the same episodes: sampled before any update), other adapters
    differ = [r for r in ROLES if any(not torch.equal(runs["naive"][r][k], runs["joint"][r][k]) for k in runs["naive"][r])]
    assert differ == ROLES


def test_joint_one_update_for_the_team_inside_every_role_region(tiny_model, tmp_path):
    cfg = small_config(tiny_model, tmp_path / "run", stages=2, **JOINT)
    updates = train(cfg)
    assert [(u["stage"], u["index"], u["role"]) for u in updates] == [(s, i + 1, r) for s in (1, 2) for i, r in enumerate(ROLES)]
    for stage in (1, 2):
        mine = [u for u in updates if u["stage"] == stage]
        # one joint update: the same batch of pi^0, the same team figures, the same optimiser steps, every
        # role's version bumped together (versions_before is the stage start's for every role)
        assert {u["batch_key"] for u in mine} == {f"s{stage - 1}-k0"}
        assert all(u["joint"] == mine[0]["joint"] and u["versions_before"] == mine[0]["versions_before"] for u in mine)
        team = mine[0]["joint"]
        assert team["accepted"] and team["optimiser_steps"] >= 1 and team["episodes"] == 12
        assert all(u["optimiser_steps"] == team["optimiser_steps"] and u["stop"] == team["stop"] for u in mine)
        for u in mine:  # each role inside its own region on the batch and on its probe (exact KL)
            assert u["accepted"] and u["version_after"] == u["versions_before"][u["adapter"]] + 1
            assert 0 < u["d_hat"] <= cfg.trust_region.delta
            assert u["kl_batch_exact"] <= cfg.trust_region.delta and u["kl_probe_ucb"] <= cfg.trust_region.delta
            assert u["probe_messages"] > 0 and u["kl_out_of_sample"] is not None
    stages = read_metrics(cfg.run_dir, "stage")
    assert [s["updates"] for s in stages] == [3, 3] and [s["rollouts"] for s in stages] == [1, 1]


def test_a_joint_step_that_leaves_is_searched_back_along_the_joint_direction(tiny_model, tmp_path):
    from teamtr.training.joint_step import JointPolicy, joint_step

    # halving: the search's 2^-h points (on this step the KL along the line saturates, 0.16 at the full step
    # and 0.07 at 1/16 of it, so the bracket's sqrt(KL) interpolation finds no point inside in 6 tries)
    cfg = small_config(tiny_model, tmp_path / "run", **{**JOINT, **STEEP})
    team = stage_team(cfg, tiny_model)
    batch = team.rollout(0, 0)
    policies = {r: team.policies[r] for r in ROLES}
    start = JointPolicy(policies).weights()
    result = joint_step(batch, ROLES, policies, dict.fromkeys(ROLES, 1.0), cfg, minibatch_seed=0)
    # AdamW's first step at lr 0.2 leaves the region: the update ends on the line search's point inside
    assert result.accepted and result.stop == "boundary"
    moved = JointPolicy(policies).weights()
    for r in ROLES:
        assert 0 < result.steps[r].d_hat <= cfg.trust_region.delta
    # the kept point is theta_0 + a (theta_step - theta_0) for ONE a shared by every adapter: AdamW's first
    # step is lr * sign(g) (up to eps), so every moved tensor's largest displacement is the same a * lr
    assert result.optimiser_steps == 1
    fractions = {
        k: float((moved[k] - start[k]).abs().max()) / cfg.optim.lr
        for k in start
        if (moved[k] - start[k]).abs().max() > 0
    }
    assert {role for role, _ in fractions} == set(ROLES)
    a = max(fractions.values())
    assert 0 < a < 1 and all(f == pytest.approx(a, rel=1e-3) for f in fractions.values()), fractions
    assert a == pytest.approx(2.0 ** round(math.log2(a)), rel=1e-3)  # the first inside of 1/2, 1/4, ...


def test_a_joint_update_without_a_step_inside_restores_every_adapter(tiny_model, tmp_path):
    from teamtr.training.joint_step import joint_step

    loose = small_config(tiny_model, tmp_path / "run", **{**JOINT, **STEEP})
    cfg = loose.with_overrides({"optim.lr": 0.5, "trust_region.delta": 1e-9})
    team = stage_team(cfg, tiny_model)
    batch = team.rollout(0, 0)
    policies = {r: team.policies[r] for r in ROLES}
    # a kept step first, so that the optimisers have state to restore
    assert joint_step(batch, ROLES, policies, dict.fromkeys(ROLES, 1.0), loose, minibatch_seed=0).accepted
    before = {r: {k: v.clone() for k, v in p.weights().items()} for r, p in policies.items()}
    moments = {r: [v.clone() for s in p.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
               for r, p in policies.items()}  # fmt: skip
    versions = {r: p.version() for r, p in policies.items()}
    result = joint_step(batch, ROLES, policies, dict.fromkeys(ROLES, 1.0), cfg, minibatch_seed=1)
    assert not result.accepted and result.stop == "boundary" and result.optimiser_steps == 0
    for r, p in policies.items():
        assert not result.steps[r].accepted and result.steps[r].d_hat == 0.0 and p.version() == versions[r]
        assert all(torch.equal(v, before[r][k]) for k, v in p.weights().items()), r
        now = [v for s in p.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        assert len(now) == len(moments[r]) > 0 and all(torch.equal(a, b) for a, b in zip(now, moments[r], strict=True))


def test_joint_refuses_what_it_is_not_defined_with(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="probe check"):
        small_config(tiny_model, tmp_path / "a", **{**JOINT, "trust_region.check": "sampled"})
    with pytest.raises(ValueError, match="trajectory ratio"):
        small_config(tiny_model, tmp_path / "b", **{**JOINT, "loss.kind": "grpo"})


def test_shared_adapter_one_policy_for_every_role(tiny_model, tmp_path):
    cfg = small_config(
        tiny_model, tmp_path / "run", stages=2,
        **{"task.name": "test-odd-start", "team.shared_adapter": True, "trust_region.probe_episodes": 4,
           "trust_region.heldout_episodes": 4, "eval.stage_episodes": 0},
    )  # fmt: skip
    updates = train(cfg)
    # one update per stage, of the one adapter, on every role's messages of the stage-start batch
    assert [(u["stage"], u["role"], u["adapter"]) for u in updates] == [(1, "shared", "shared"), (2, "shared", "shared")]
    assert [u["batch_key"] for u in updates] == ["s0-k0", "s1-k0"]
    assert all(u["messages"] == 3 * 12 for u in updates)  # 3 roles x 12 episodes, one turn each
    assert all(u["accepted"] and u["d_hat"] <= cfg.trust_region.delta for u in updates)
    # the adapter speaks three times per episode: the certificate's general form, not speak-once
    assert all(u["certificate"]["form"] == "general" and u["certificate"]["role_turns"] == 3 for u in updates)
    assert [d.name for d in (tmp_path / "run" / "adapters").iterdir()] == ["shared"]
    # every role's turns in stage 2's batch were sampled by the shared adapter at its new version
    assert updates[1]["batch_turn_versions"] == {"shared": [updates[0]["version_after"]]}


# the trainer's runner, SIGKILLing itself right after writing update record KILL_AT (when set)
RUNNER_KILL = """
import os, signal
from teamtr.training.llm_team import LLMStageTeam
log_update = LLMStageTeam.log_update

def log_then_die(self, *args, **kwargs):
    logged = log_update(self, *args, **kwargs)
    if self.state.step == int(os.environ.get("KILL_AT", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
    return logged

LLMStageTeam.log_update = log_then_die
"""


def test_kill_9_inside_a_joint_update_then_resume_gives_bit_identical_adapters(tiny_model, tmp_path):
    from tests.support.trainer import RUNNER, final_adapters, run_to_completion
    from tests.support.trainer_task import RUNNER_IMPORT

    script = tmp_path / "runner.py"
    script.write_text(RUNNER.format(fixtures=RUNNER_IMPORT + RUNNER_KILL))
    for name in ("reference", "interrupted"):
        small_config(tiny_model, tmp_path / name, stages=2, **JOINT).to_yaml(tmp_path / f"{name}.yaml")
    run_to_completion(script, tmp_path / "reference.yaml")
    # killed between the second and the third record of stage 2's joint update (its checkpoint follows the
    # third), then resumed by the same command: stage 2 is done again from stage 1's checkpoint
    killed = subprocess.run([sys.executable, str(script), str(tmp_path / "interrupted.yaml")],
                            env={**os.environ, "KILL_AT": "5"}, capture_output=True, timeout=600)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    assert read_metrics(tmp_path / "interrupted", "update")[-1]["step"] == 5
    run_to_completion(script, tmp_path / "interrupted.yaml")

    ref, resumed = final_adapters(tmp_path / "reference"), final_adapters(tmp_path / "interrupted")
    assert ref.keys() == resumed.keys() and len(ref) == 3
    for name in ref:
        for k in ref[name]:
            assert torch.equal(ref[name][k], resumed[name][k]), f"{name} {k}"
    records = [read_metrics(tmp_path / run, "update") for run in ("reference", "interrupted")]
    assert [(r["step"], r["role"], r["d_hat"]) for r in records[0]] == [(r["step"], r["role"], r["d_hat"]) for r in records[1]]
    assert len(records[0]) == 6


def test_relay_study_runs_the_joint_and_shared_adapter_arms(tiny_model, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import relay_study

    assert relay_study.ARMS == ("teamtr", "naive", "sequential_grpo")  # the default arms are unchanged
    argv = ["--out", str(tmp_path), "--model", tiny_model, "--sizes", "2", "--control-size", "0",
            "--deltas", "0.3", "--seeds", "1", "--stages", "1", "--prompts", "2", "--group", "2",
            "--epochs", "1", "--eval-episodes", "4", "--greedy-episodes", "2", "--heldout-episodes", "2",
            "--spread-prompts", "2", "--stage-episodes", "2", "--lab-seeds", "2", "--lab-deltas", "0.3",
            "--arms", "joint", "shared_adapter"]  # fmt: skip
    # every --set reaches every cell (a repeated argparse option once kept only the last)
    sets = ["--set", "optim.optimizer=adamw", "--set", "trust_region.probe_episodes=3"]
    assert relay_study.parse_args([*argv, *sets]).overrides == {
        "optim.optimizer": "adamw", "trust_region.probe_episodes": 3
    }  # fmt: skip
    cfg = relay_study.parse_args(argv)
    joint = relay_study.train_config(2, 0.0, 0.3, 0, "joint", tiny_model, cfg)
    shared = relay_study.train_config(2, 0.0, 0.3, 0, "shared_adapter", tiny_model, cfg)
    assert joint.schedule.kind == "joint" and not joint.team.shared_adapter
    assert shared.team.shared_adapter and shared.schedule.kind == "naive"
    cells = relay_study.run_study(cfg, log=lambda _m: None)
    assert sorted(cells) == ["n2/l0/d0.3/seed0/joint", "n2/l0/d0.3/seed0/shared_adapter", "n2/l0/warm"]
    # relay n = 2: the first role once, then two rounds of the other; joint logs one update per role,
    # the shared adapter one for the team
    assert cells["n2/l0/d0.3/seed0/joint"]["updates"] == 2
    assert cells["n2/l0/d0.3/seed0/shared_adapter"]["updates"] == 1


def test_the_team_gradient_is_the_gradient_of_the_joint_objective(tiny_model, tmp_path):
    """team_gradient backpropagates role by role through d objective / d log pi_j: each adapter gets the
    gradient of the joint objective with respect to it, at a point where the roles' ratios are not 1.
    (One backward pass through every role's forward pass would not do: activating an adapter for the next
    role's pass leaves the earlier roles' weights without a gradient; measured: 2 of 3 roles got none.)"""
    from teamtr.training.advantages import advantages_for
    from teamtr.training.joint_step import JointPolicy, joint_step, team_gradient, team_surrogate
    from teamtr.training.losses import kl_estimates, monitored_kl
    from teamtr.training.rollouts import messages_of_role

    cfg = small_config(tiny_model, tmp_path / "run", **{**JOINT, "optim.max_grad_norm": 1e9})
    team = stage_team(cfg, tiny_model)
    batch = team.rollout(0, 0)
    policies = {r: team.policies[r] for r in ROLES}
    adv = advantages_for(batch.rewards, batch.groups, cfg.loss)
    msgs = {r: messages_of_role(batch, r, adv) for r in ROLES}
    old = {r: policies[r].logp(msgs[r], grad=False) for r in ROLES}
    assert joint_step(batch, ROLES, policies, dict.fromkeys(ROLES, 1.0), cfg, minibatch_seed=0).accepted  # move
    episodes = torch.arange(len(batch.trajectories))
    advantage = torch.as_tensor(adv.values, dtype=torch.float32)
    betas = {"adder1": 0.5, "adder2": 1.0, "adder3": 2.0}
    joint = JointPolicy(policies)
    team_gradient(joint, msgs, old, episodes, advantage, betas, cfg)
    ours = {r: {k: w.grad.clone() for k, w in p.params.items()} for r, p in policies.items()}
    assert all(float(g.abs().max()) > 0 for r in ROLES for g in ours[r].values())

    tr = cfg.trust_region
    for r in ROLES:  # the reference: the objective differentiated with respect to role r's adapter alone
        joint.zero_grad()
        logp = {j: policies[j].logp(msgs[j], grad=False) for j in ROLES if j != r}
        logp[r] = policies[r].logp(msgs[r], grad=True)  # last: activating another adapter drops its gradient
        sur = team_surrogate(logp, old, msgs, episodes, advantage, cfg)
        penalty = sum(b * monitored_kl(kl_estimates(logp[j], old[j], msgs[j].mask), tr.estimator) for j, b in betas.items())
        (-(sur.objective - penalty)).backward()
        for k, g in ours[r].items():
            assert torch.allclose(g, policies[r].params[k].grad, rtol=1e-4, atol=1e-7), (r, k)
