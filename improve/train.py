"""TeamTR on served prompts, starting from the adapter versions the server serves now.

The improve run is an ordinary run directory (training/run_dir.py) whose config is the served run's,
with the improve settings over it; its engine starts from the incumbent's weights (each role's served
version, loaded into a trainable adapter and numbered from the newest version the server knows, so an
accepted update's folder `adapters/<adapter>/v<N>` is the version N the server serves and the spans
record), and its task is the served prompts (data.py `ServedTasks`). It rolls out on the run's
`rollout.engine` (vLLM included, as `teamtr train` does), never silently on another. A role counts as
changed only when its newest saved weights differ from the incumbent's. The trainer's checkpoints make a
killed improve run continue where it stopped (training/trainer.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.models import local_or_reference
from teamtr.graphs.run_layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS, read_metrics, version_dirs
from teamtr.graphs.task import TaskFamily
from teamtr.graphs.trajectory import Trajectory
from teamtr.improve.feedback_team import FeedbackStageTeam
from teamtr.training.config import TrainConfig
from teamtr.training.llm_team import LLMStageTeam
from teamtr.training.progress import TrainingProgress
from teamtr.training.run_dir import RunDir
from teamtr.training.trainer import Trainer
from teamtr.training.vllm_rollouts import VLLMRollouts

Incumbent = dict[str, tuple[int, str]]  # adapter -> (served version, its directory)


def improve_config(served: RunDir, run_dir: Path, settings: dict[str, Any]) -> TrainConfig:
    """The served run's config with the improve run's directory and settings (dotted keys) over it.
    Per-stage evaluation is off: the gate evaluates on held-out served prompts instead."""
    base = served.config.to_dict()
    base["team"]["model"] = local_or_reference(served.model_path())
    base["team"]["bases"] = {k: str(Path(v).resolve()) for k, v in served.config.team.bases.items()}
    overrides = {"run_dir": str(run_dir), "eval.stage_episodes": 0, **settings}
    return TrainConfig.from_dict(base).with_overrides(overrides)


def load_served_weights(engine: EmbeddedEngine, adapter: str, base: str, version: int, path: str) -> None:
    """Put a served version's weights into the engine's trainable adapter, numbered as served. Its LoRA
    rank and alpha must be the run's (the same weights under another scale are another policy)."""
    served_cfg = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    lora = engine.lora
    if (served_cfg.get("r"), served_cfg.get("lora_alpha")) != (lora.r, lora.alpha):
        raise ValueError(
            f"{path}: LoRA rank/alpha {served_cfg.get('r')}/{served_cfg.get('lora_alpha')} differ from the "
            f"run's team.lora_rank/lora_alpha {lora.r}/{lora.alpha}"
        )
    saved = load_file(str(Path(path) / ADAPTER_WEIGHTS))
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


def incumbent_engine(
    served: RunDir, incumbent: Incumbent, threads: int, number_from: dict[str, int] | None = None
) -> EmbeddedEngine:
    """The incumbent's weights, each adapter numbered `number_from[adapter]` (default: as served)."""
    torch.manual_seed(0)  # fresh adapters are overwritten below; seeded anyway
    engine = served.engine("fresh", threads=threads)
    for role in served.roles:
        if role.adapter in incumbent:
            version, path = incumbent[role.adapter]
            version = max(version, (number_from or {}).get(role.adapter, version))
            load_served_weights(engine, role.adapter, role.base_model, version, path)
    return engine


def same_weights(a: str | Path, b: str | Path) -> bool:
    """Two saved adapter versions hold exactly the same tensors (an update that did not move the policy)."""
    x, y = load_file(str(Path(a) / ADAPTER_WEIGHTS)), load_file(str(Path(b) / ADAPTER_WEIGHTS))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@dataclass
class FeedbackTraining:
    """Served feedback episodes to train on (improve/feedback.py): alone, or mixed with the
    fresh rollouts when a reward exists."""

    episodes: list[Trajectory]
    mix: bool
    cap: float = 1.0  # the truncation of the importance weights


class ServedTrainer(Trainer):
    """`Trainer` on a given task family (the served prompts) and a given engine (the incumbent's), and
    with `feedback`, on the served feedback episodes too (improve/feedback_team.py)."""

    def __init__(
        self,
        cfg: TrainConfig,
        task: TaskFamily,
        engine: EmbeddedEngine,
        feedback: FeedbackTraining | None = None,
    ) -> None:
        super().__init__(cfg, TrainingProgress(), engine=engine)
        self.task_family, self.feedback = task, feedback

    def stage_team(self, *args: Any, **kwargs: Any) -> LLMStageTeam:
        if self.feedback is None:
            return super().stage_team(*args, **kwargs)
        f = self.feedback
        return FeedbackStageTeam(*args, feedback=f.episodes, cap=f.cap, mix=f.mix, **kwargs)

    def train(self) -> dict[str, Any]:
        torch.set_num_threads(self.cfg.torch_threads)
        run = RunDir.create(self.cfg)
        assert self._engine is not None
        rollouts = run.rollout_engine(self._engine, run.roles)  # the run's engine, or a clear error
        try:
            return self._run(run, run.roles, self.task_family, self._engine, rollouts)
        finally:
            if isinstance(rollouts, VLLMRollouts):
                rollouts.close()


def train_candidate(
    served: RunDir,
    incumbent: Incumbent,
    cfg: TrainConfig,
    task: TaskFamily,
    number_from: dict[str, int] | None = None,
    feedback: FeedbackTraining | None = None,
) -> tuple[dict[str, tuple[int, Path]], dict[str, Any]]:
    """Train (or resume training); returns (adapter -> (version, directory) of every role whose newest
    version is beyond where its numbering started and whose weights differ from the incumbent's, the
    run's summary with its stage certificates)."""
    engine = incumbent_engine(served, incumbent, cfg.torch_threads, number_from)
    summary = ServedTrainer(cfg, task, engine, feedback).train()
    changed = {}
    for adapter, (version, path) in incumbent.items():
        found = version_dirs(cfg.run_dir, adapter)
        start = max(version, (number_from or {}).get(adapter, version))
        if found and found[-1][0] > start and not same_weights(found[-1][1], path):
            changed[adapter] = found[-1]
    stages = read_metrics(cfg.run_dir, kind="stage")
    summary["stage_certificates"] = [s.get("certificate") for s in stages]
    return changed, summary
