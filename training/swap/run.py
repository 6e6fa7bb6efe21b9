"""`swap_role`: replace one role's model in a run and write the run directory `teamtr train` continues.

1. PROBES   contexts at role R's turns, from episodes of the current team (training/swap/probes.py)
2. STAGE-0  the newcomer (a full model with a fresh LoRA adapter, the kind the trainer trains afterwards)
            is aligned to the incumbent on the probes (training/swap/stage0.py), or enters as it is
            (a direct swap, `align=False`)
3. WRITE    a run directory from which `teamtr train NEW_RUN/config.yaml` continues: role R now names the
            newcomer's base model (config team.bases / team.role_bases), its adapter restarts at a new
            version, every other role keeps its adapter, optimizer state and beta; certificates, evals
            and metrics carry over, and the swapped team's held-out return is the "before" of the next
            stage.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.graphs.engine import DEFAULT_BASE
from teamtr.graphs.roles import Role, with_temperature
from teamtr.graphs.run_layout import adapter_dir
from teamtr.graphs.team import derive_seed
from teamtr.training.certificate import certificate_constant
from teamtr.training.checkpoint import (
    CHECKPOINTS,
    STAGE_START,
    Checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
    save_peft_adapter,
)
from teamtr.training.config import TrainConfig
from teamtr.training.metrics import METRICS_FILE, MetricsLog
from teamtr.training.run_dir import RunDir
from teamtr.training.swap.config import SwapConfig, SwapProgress
from teamtr.training.swap.probes import build_probes, write_probes
from teamtr.training.swap.stage0 import Aligner
from teamtr.training.trainer import held_out_return
from teamtr.training.vocab_kl import Side


@dataclass
class SwapResult:
    """What a swap did: the new run directory, the Stage-0 KL trace, the team's return before and after."""

    out_dir: Path
    role: str
    base_name: str
    divergence: str
    probes: int
    kl_history: list[float]  # monitored KL(newcomer || incumbent) before each round
    converged: bool  # monitored KL <= delta0
    new_version: int
    eval_before: float  # held-out team return of the incumbent team (the run's stage eval tasks)
    eval_after: float  # ... of the team with the newcomer in role R (after Stage-0 if align)
    rounds: int = 0
    sampled_tokens: int = 0  # newcomer tokens sampled during Stage-0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kl_final(self) -> float:
        return self.kl_history[-1]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["out_dir"] = str(self.out_dir)
        d["kl_final"] = self.kl_final
        return d


def load_run(run_dir: Path) -> tuple[RunDir, Checkpoint]:
    """The run and its latest checkpoint, which must sit at a stage boundary."""
    run = RunDir(run_dir)
    ckpt = load_latest_checkpoint(run_dir)
    if ckpt is None:
        raise ValueError(f"{run_dir} has no checkpoint yet: train at least one stage before a swap")
    if ckpt.state["updates_done"] or ckpt.state["batches"]:
        raise ValueError(
            f"{run_dir} stopped in the middle of stage {ckpt.state['next_stage'] + 1}: resume it with "
            "`teamtr train` to the end of a stage, then swap"
        )
    return run, ckpt


def team_engine(run: RunDir, ckpt: Checkpoint, extra_bases: dict[str, str] | None = None) -> EmbeddedEngine:
    """The team exactly as the checkpoint left it (every role's adapter weights and version), plus
    `extra_bases` (the newcomer) loaded beside it."""
    engine = run.engine("fresh", extra_bases=extra_bases)
    for r in run.roles:
        engine.restore_adapter(
            r.adapter, {k: v.clone() for k, v in ckpt.adapters[r.adapter].items()}, r.base_model
        )
        while engine.adapter_version(r.adapter, r.base_model) < ckpt.state["versions"][r.adapter]:
            engine.commit_adapter_update(r.adapter, r.base_model)
    return engine


def swap_role(run_dir: str | Path, cfg: SwapConfig, progress: SwapProgress | None = None) -> SwapResult:
    """Steps 1-3 above on the run at `run_dir` (stopped at a stage boundary); `run_dir` stays as it was."""
    progress = progress or SwapProgress()
    run_dir = Path(run_dir)
    run, ckpt = load_run(run_dir)
    train_cfg = run.config
    torch.set_num_threads(train_cfg.torch_threads)
    newcomer_path = Path(cfg.model).resolve()
    if not (newcomer_path / "config.json").is_file():
        raise FileNotFoundError(f"{cfg.model} is not a model directory (no config.json)")
    out = Path(cfg.out) if cfg.out else run_dir.with_name(f"{run_dir.name}-swap-{cfg.role}")
    if out.resolve() == run_dir.resolve():
        raise ValueError("--out must differ from RUN_DIR (the original run stays as it was)")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")

    roles = run.roles
    names = [r.name for r in roles]
    if cfg.role not in names:
        raise ValueError(f"unknown role {cfg.role!r}; the team's roles are {names}")
    role = next(r for r in roles if r.name == cfg.role)
    task = run.task()

    base_name = cfg.base_name or _fresh_base_name(cfg.role, train_cfg)
    if base_name in (DEFAULT_BASE, *train_cfg.team.bases):
        raise ValueError(f"base model name {base_name!r} is taken")
    engine = team_engine(run, ckpt, {base_name: str(newcomer_path)})
    torch.manual_seed(derive_seed(cfg.seed, "newcomer-lora"))
    engine.add_adapter(role.adapter, base=base_name)  # fresh LoRA (B = 0): starts as the newcomer itself
    new_roles = [dataclasses.replace(r, base_model=base_name) if r.name == cfg.role else r for r in roles]

    # held-out return of the incumbent team (the run's stage-eval tasks and seed)
    eval_tasks = task.generate(max(train_cfg.eval.stage_episodes, 1), seed=train_cfg.task.eval_seed)
    eval_seed = derive_seed(train_cfg.seed, "eval")

    def team_return(rs: list[Role]) -> dict[str, Any]:
        return held_out_return(
            run.team(rs, engine, temperature=train_cfg.eval.temperature),
            task,
            eval_tasks,
            eval_seed,
        )

    before = team_return(roles)
    progress.message(f"incumbent team: held-out return {before['accuracy']:.3f}")

    # 1. PROBES from the current team's episodes, 2. STAGE-0
    rollout_roles = with_temperature(roles, train_cfg.rollout.temperature)
    probes = build_probes(
        run.team(rollout_roles, engine, name="probes"),
        role,
        task,
        cfg.probes,
        train_cfg.seed,
        progress,
    )
    sampling = dataclasses.replace(role.sampling, temperature=train_cfg.rollout.temperature)
    aligner = Aligner(
        Side(engine, base_name, role.adapter),
        Side(engine, role.base_model, role.adapter),
        probes,
        sampling,
        cfg,
    )
    if cfg.align:
        history, converged, rounds = aligner.run(progress)
    else:  # direct swap: measure, do not move
        history = [aligner.monitor(aligner.sample(0))]
        converged, rounds = history[0] <= cfg.delta0, 0
        progress.round(0, 0, history[0], cfg.delta0)
    after = team_return(new_roles)
    progress.message(f"team with the newcomer: held-out return {after['accuracy']:.3f}")

    # 3. WRITE the new run directory
    new_version = int(ckpt.state["versions"][role.adapter]) + 1
    used_bases = {r.base_model for r in new_roles}
    new_dict = train_cfg.to_dict()  # (not with_overrides: its merge would keep bases no role uses)
    new_dict["run_dir"] = str(out)
    new_dict["stages"] = int(ckpt.state["next_stage"]) + cfg.extra_stages
    new_dict["team"]["bases"] = {
        **{b: path for b, path in train_cfg.team.bases.items() if b in used_bases},
        base_name: str(newcomer_path),
    }
    new_dict["team"]["role_bases"] = {**train_cfg.team.role_bases, cfg.role: base_name}
    new_cfg = TrainConfig.from_dict(new_dict)
    _copy_run(run_dir, out)
    new_cfg.to_yaml(out / "config.yaml")
    save_peft_adapter(engine.model(base_name), role.adapter, adapter_dir(out, role.adapter, new_version))
    write_probes(out, probes)

    state = dict(ckpt.state)
    run_state = dict(state["run"])
    metrics = MetricsLog(out)
    metrics.truncate_to_bytes(state["metrics_bytes"])
    run_state["betas"] = {**run_state["betas"], cfg.role: train_cfg.trust_region.beta_init}
    # the next stage's "before" is the swapped team: its return replaces the last entry (one entry per
    # stage boundary, as the trainer pairs them with certificates); the incumbent's stays in the swap record
    run_state["evals"] = [*run_state["evals"][:-1], after]
    c = certificate_constant(train_cfg.certificate.gamma, train_cfg.loss.adv_clip)
    result = SwapResult(
        out_dir=out,
        role=cfg.role,
        base_name=base_name,
        divergence=aligner.mode,
        probes=len(probes),
        kl_history=history,
        converged=converged,
        new_version=new_version,
        eval_before=before["accuracy"],
        eval_after=after["accuracy"],
        rounds=rounds,
        sampled_tokens=aligner.sampled_tokens,
        extra={
            "align": cfg.align,
            "target": cfg.target,
            "delta0": cfg.delta0,
            "newcomer": str(newcomer_path),
            "from_run": str(run_dir.resolve()),
            # the swap's term in the certificate's form: c * sqrt(KL) for the newcomer's move
            "certificate_penalty": c * math.sqrt(max(history[-1], 0.0)),
            # protocol unification: the newcomer's NLL of the incumbent's messages, before and after
            "unify_nll": aligner.unify_nll,
        },
    )
    step = int(run_state["step"])
    metrics.log("swap", step, stage=int(state["next_stage"]), **result.to_dict())  # after that many stages
    metrics.log("eval", step, stage=int(state["next_stage"]), label="after swap", **after)
    metrics.close()
    state["run"] = run_state
    state["versions"] = {**state["versions"], role.adapter: new_version}
    state["metrics_bytes"] = (out / METRICS_FILE).stat().st_size
    adapters = {a: w for a, w in ckpt.adapters.items() if not a.startswith(STAGE_START) and a != role.adapter}
    adapters[role.adapter] = engine.snapshot_adapter(role.adapter, base_name)
    optimizers = {a: o for a, o in ckpt.optimizers.items() if a != role.adapter}  # the newcomer's: fresh
    shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
    save_checkpoint(
        out, step, Checkpoint(state=state, adapters=adapters, optimizers=optimizers, rng=ckpt.rng, batches={})
    )
    return result


def _fresh_base_name(role: str, cfg: TrainConfig) -> str:
    k = 1
    while f"{role}-swap{k}" in cfg.team.bases:
        k += 1
    return f"{role}-swap{k}"


def _copy_run(src: Path, dst: Path) -> None:
    """The old run's files (adapters of every version, metrics, TensorBoard) become the new run's history."""
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name in (CHECKPOINTS, "swap"):
            continue
        target = dst / item.name
        if item.is_dir():
            shutil.copytree(item, target, dirs_exist_ok=True)
        else:
            shutil.copy2(item, target)


def direct_and_aligned(
    run_dir: str | Path, cfg: SwapConfig, out_root: Path, progress: SwapProgress | None = None
) -> dict[str, SwapResult]:
    """Both paths of the swap-shock benchmark from one run: a direct swap and Stage-0."""
    results = {}
    for name, align in (("direct", False), ("stage0", True)):
        results[name] = swap_role(
            run_dir, dataclasses.replace(cfg, align=align, out=str(out_root / name)), progress
        )
    return results
