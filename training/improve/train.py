"""TeamTR on served prompts, starting from the adapter versions the server serves now.

The improve run is an ordinary run directory (training/run_dir.py) whose config is the served run's,
with the improve settings over it; its engine starts from the incumbent's weights (each role's served
version, loaded into a trainable adapter and numbered as served, so accepted updates continue the
served numbering), and its task is the served prompts (data.py `ServedTasks`). The trainer's
checkpoints make a killed improve run continue where it stopped (training/trainer.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from teamtr.graphs.task import TaskFamily
from teamtr.serving.embedded import EmbeddedEngine
from teamtr.serving.registry import CONFIG_FILE, WEIGHTS_FILE, version_dirs
from teamtr.training.config import TrainConfig
from teamtr.training.metrics import read_metrics
from teamtr.training.progress import TrainingProgress
from teamtr.training.run_dir import RunDir
from teamtr.training.trainer import Trainer

Incumbent = dict[str, tuple[int, str]]  # adapter -> (served version, its directory)


def improve_config(served: RunDir, run_dir: Path, settings: dict[str, Any]) -> TrainConfig:
    """The served run's config with the improve run's directory and settings (dotted keys) over it.
    Per-stage evaluation is off: the gate evaluates on held-out served prompts instead."""
    base = served.config.to_dict()
    base["team"]["model"] = str(Path(served.model_path()).resolve())
    base["team"]["bases"] = {k: str(Path(v).resolve()) for k, v in served.config.team.bases.items()}
    overrides = {"run_dir": str(run_dir), "eval.stage_episodes": 0, **settings}
    return TrainConfig.from_dict(base).with_overrides(overrides)


def load_served_weights(engine: EmbeddedEngine, adapter: str, base: str, version: int, path: str) -> None:
    """Put a served version's weights into the engine's trainable adapter, numbered as served. Its LoRA
    rank and alpha must be the run's (the same weights under another scale are another policy)."""
    served_cfg = json.loads((Path(path) / CONFIG_FILE).read_text())
    lora = engine.lora
    if (served_cfg.get("r"), served_cfg.get("lora_alpha")) != (lora.r, lora.alpha):
        raise ValueError(
            f"{path}: LoRA rank/alpha {served_cfg.get('r')}/{served_cfg.get('lora_alpha')} differ from the "
            f"run's team.lora_rank/lora_alpha {lora.r}/{lora.alpha}"
        )
    saved = load_file(str(Path(path) / WEIGHTS_FILE))
    params = engine.adapter_parameters(adapter, base)
    weights = {}
    for key, tensor in saved.items():
        for part in ("lora_A", "lora_B"):
            key = key.replace(f".{part}.weight", f".{part}.{adapter}.weight")
        weights[key] = tensor
    if set(weights) != set(params):
        missing = sorted(set(params) - set(weights))[:2]
        raise ValueError(
            f"{path}: does not match the run's LoRA settings for {adapter!r} (missing {missing})"
        )
    engine.restore_adapter(adapter, {k: v.to(params[k].dtype) for k, v in weights.items()}, base)
    for p in params.values():
        p.requires_grad_(True)
    while engine.adapter_version(adapter, base) < version:
        engine.commit_adapter_update(adapter, base)


def incumbent_engine(served: RunDir, incumbent: Incumbent, threads: int) -> EmbeddedEngine:
    torch.manual_seed(0)  # fresh adapters are overwritten below; seeded anyway
    engine = served.engine("fresh", threads=threads)
    for role in served.roles:
        if role.adapter in incumbent:
            version, path = incumbent[role.adapter]
            load_served_weights(engine, role.adapter, role.base_model, version, path)
    return engine


class ServedTrainer(Trainer):
    """`Trainer` on a given task family (the served prompts) and a given engine (the incumbent's)."""

    def __init__(self, cfg: TrainConfig, task: TaskFamily, engine: EmbeddedEngine) -> None:
        super().__init__(cfg, TrainingProgress(), engine=engine)
        self.task_family = task

    def train(self) -> dict[str, Any]:
        torch.set_num_threads(self.cfg.torch_threads)
        run = RunDir.create(self.cfg)
        assert self._engine is not None
        return self._run(run, run.roles, self.task_family, self._engine, self._engine)


def train_candidate(
    served: RunDir, incumbent: Incumbent, cfg: TrainConfig, task: TaskFamily
) -> tuple[dict[str, tuple[int, Path]], dict[str, Any]]:
    """Train (or resume training); returns (adapter -> (version, directory) of every role whose newest
    version is beyond the incumbent's, the run's summary with its stage certificates)."""
    engine = incumbent_engine(served, incumbent, cfg.torch_threads)
    summary = ServedTrainer(cfg, task, engine).train()
    changed = {}
    for adapter, (version, _) in incumbent.items():
        found = version_dirs(cfg.run_dir, adapter)
        if found and found[-1][0] > version:
            changed[adapter] = found[-1]
    stages = read_metrics(cfg.run_dir, kind="stage")
    summary["stage_certificates"] = [s.get("certificate") for s in stages]
    return changed, summary
