"""The examples/ graphs trained at test size (tests/graphs/test_user_graphs.py and the tests that train
an example the same way)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from teamtr.graphs.run_layout import read_metrics
from teamtr.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the configs name `examples.<module>:<function>`, as from the repo root
    sys.path.insert(0, str(ROOT))


def example_config(name: str, model: str, run_dir: Path, **overrides) -> TrainConfig:
    data = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    for key in ("data", "eval_data"):
        if key in data["task"]:
            data["task"][key] = str(ROOT / data["task"][key])
    small = {
        "run_dir": str(run_dir),
        "stages": 1,
        "team.model": model,
        "team.lora_rank": 4,
        "rollout": {"prompts_per_update": 2, "group_size": 3},
        "optim": {"lr": 5e-3, "epochs": 1, "minibatch_messages": 8},
        "trust_region.heldout_episodes": 0,
        "trust_region.probe_episodes": 2,
        "eval": {"stage_episodes": 2, "final_episodes": 2},
        **overrides,
    }
    return TrainConfig.from_dict(data).with_overrides(small)


def train(cfg: TrainConfig) -> list[dict]:
    from teamtr.training.trainer import Trainer

    Trainer(cfg).train()
    return read_metrics(cfg.run_dir)

