"""The trainer tests' configs and runs (tests/training/test_trainer.py and the tests that reuse them): a
small config of the test task and team (tests/support/trainer_task.py, registered on import), a stage team
on a fresh engine, a whole run, and a runner script that trains a config in its own process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from teamtr.graphs.run_layout import read_metrics
from teamtr.training.config import TrainConfig
from tests.support import trainer_task
from tests.support.trainer_task import ROLES_FACTORY, TASK


def small_config(model: str, run_dir: Path, **overrides) -> TrainConfig:
    base = {
        "run_dir": str(run_dir),
        "stages": 1,
        "task": {"name": TASK},
        "team": {"model": model, "lora_rank": 4, "roles": ROLES_FACTORY},
        "rollout": {"prompts_per_update": 3, "group_size": 4},
        "optim": {"lr": 5e-3, "epochs": 2, "minibatch_messages": 6},
        "trust_region": {"probe_episodes": 16, "heldout_episodes": 8},  # test-sized checks
        "eval": {"stage_episodes": 4, "final_episodes": 4},
    }
    return TrainConfig.from_dict(base).with_overrides(overrides)


def stage_team(cfg: TrainConfig, model: str):
    """The LLM team of `cfg` on a fresh engine (seeded LoRA initialisation), for tests of single updates."""
    from teamtr.engines.embedded import EmbeddedEngine, LoraSettings
    from teamtr.tasks import get_task
    from teamtr.training.llm_team import LLMStageTeam, RunState
    from teamtr.training.metrics import MetricsLog
    from teamtr.training.progress import TrainingProgress

    roles = trainer_task.roles()
    torch.manual_seed(0)
    engine = EmbeddedEngine(model, adapters={r.adapter: None for r in roles}, lora=LoraSettings(r=4), threads=1)
    run_dir = Path(cfg.run_dir)
    metrics = MetricsLog(run_dir, tensorboard=False)
    return LLMStageTeam(cfg, engine, roles, get_task(TASK), metrics, RunState(), run_dir, TrainingProgress())


def train(cfg: TrainConfig) -> list[dict]:
    from teamtr.training.trainer import Trainer

    Trainer(cfg).train()
    return read_metrics(cfg.run_dir, kind="update")


RUNNER = """
import sys
import torch
torch.set_num_threads(1)
{fixtures}
from teamtr.training.config import TrainConfig
from teamtr.training.trainer import Trainer

Trainer(TrainConfig.from_yaml(sys.argv[1])).train()
"""


def run_to_completion(script: Path, config: Path) -> None:
    subprocess.run([sys.executable, str(script), str(config)], check=True, capture_output=True, timeout=600)


def final_adapters(run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for role_dir in sorted((run_dir / "adapters").iterdir()):
        last = max(role_dir.iterdir(), key=lambda p: int(p.name[1:]))
        out[f"{role_dir.name}/{last.name}"] = load_file(last / "adapter_model.safetensors")
    return out

