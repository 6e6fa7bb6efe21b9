"""`teamtr train` on a task family other than chain: with `team.roles` unset the trainer builds the
task's own team (the generic solvers the warm start and `teamtr eval` use), each with its own adapter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from teamtr.evals.teams import load_eval_team
from teamtr.graphs.run_layout import read_metrics
from teamtr.graphs.spec import team_roles
from teamtr.tasks.roles import default_roles
from teamtr.training.config import TrainConfig
from teamtr.training.trainer import Trainer

torch.set_num_threads(1)


def config(model: Path, run_dir: Path, task: str) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run_dir": str(run_dir),
            "stages": 1,
            "task": {"name": task},
            "team": {"model": str(model), "lora_rank": 4},  # roles: unset = the task's own team
            "rollout": {"prompts_per_update": 2, "group_size": 2},
            "optim": {"epochs": 1, "minibatch_messages": 4},
            "eval": {"stage_episodes": 2, "final_episodes": 2},
        }
    )


def test_a_family_trains_its_own_solver_team_and_eval_reads_it_back(tiny_model_dir, tmp_path):
    cfg = config(tiny_model_dir, tmp_path / "run", "countdown")
    assert cfg.team.roles is None
    Trainer(cfg).train()
    solvers = ["solver1", "solver2", "solver3"]
    assert sorted({u["role"] for u in read_metrics(cfg.run_dir, kind="update")}) == solvers
    # the roles speak with the family's system prompt, as the warm start and `teamtr eval` have them
    assert [r.system_prompt for r in team_roles(cfg.team, cfg.task, default_roles)] == [r.system_prompt for r in default_roles("countdown")]
    team = load_eval_team(str(cfg.run_dir), "countdown")
    assert [r.name for r in team.roles] == solvers
    assert all(team.adapters[s] is not None and team.adapters[s].parent.name == s for s in solvers)


def test_chain_keeps_its_adders_and_split_asks_for_roles():
    def roles(task: str, **options) -> list:
        cfg = TrainConfig.from_dict({"task": {"name": task, "options": options}})
        return team_roles(cfg.team, cfg.task, default_roles)

    assert [r.name for r in roles("chain")] == ["adder1", "adder2", "adder3"]
    assert [r.name for r in roles("chain", steps=2)] == ["adder1", "adder2"]
    with pytest.raises(ValueError, match="split"):
        roles("split")
