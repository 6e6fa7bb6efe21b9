"""`teamtr train`: the run loop around Algorithm 1 (docs/training.md).

    evaluate the held-out team return                                  held_out_return
    for stage k:                                                        Trainer.train
      one stage of Algorithm 1 (order sigma, rollouts, n updates,      training/stage.py run_stage,
        the stage certificate C_stage)                                   training/teamtr_step.py teamtr_step
      evaluate again: realised improvement = after - before
      below the best earlier stage beyond noise: undo it               training/stage_safety.py
      checkpoint (also after every update, from inside the stage)      Trainer._checkpoint
    Spearman(C_stage, realised improvement) over the run              certificate.rank_correlation

C_stage is the held-out form of the certificate that applies (speak_once, else general), the proxy
sum_i term_i only when there are no held-out episodes: training/certificate.py.

The team the stage loop drives is training/llm_team.py `LLMStageTeam`. Everything random is seeded from
(seed, stage, update): a run killed at any point and resumed from its last checkpoint ends with the same
adapters, bit for bit, as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teamtr.graphs.capture import describe_error
from teamtr.graphs.engine import Engine, TrainableEngine
from teamtr.graphs.roles import Role
from teamtr.graphs.run_layout import METRICS_FILE, read_metrics
from teamtr.graphs.spec import build_team
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.graphs.team import Team, derive_seed
from teamtr.training.certificate import rank_correlation, stage_certificate_forms
from teamtr.training.checkpoint import (
    BEST_STAGE,
    STAGE_START,
    Checkpoint,
    load_latest_checkpoint,
    rng_state,
    save_checkpoint,
    save_peft_adapter,
    set_rng_state,
)
from teamtr.training.config import TrainConfig
from teamtr.training.diagnostics import logprob_gap_summary, out_of_sample_summary
from teamtr.training.distributed import DataParallel
from teamtr.training.llm_team import LLMStageTeam, RunState
from teamtr.training.metrics import MetricsLog
from teamtr.training.progress import TrainingProgress, trained_updates
from teamtr.training.rollouts import RolloutBatch
from teamtr.training.run_dir import RunDir, RunDirError, model_path, record_failure
from teamtr.training.stage import run_stage
from teamtr.training.stage_safety import BestStage
from teamtr.training.vllm_rollouts import VLLMRollouts


def held_out_return(team: Team, task: TaskFamily, tasks: list[TaskInstance], seed: int) -> dict[str, Any]:
    """Held-out team return: mean verifier reward over one episode per task."""
    trajectories = team.run(tasks, group_size=1, verifier=task, seed=seed)
    rewards = [t.reward for t in trajectories]
    return {
        "accuracy": float(np.mean(rewards)) if rewards else 0.0,
        "episodes": len(rewards),
        "tokens": sum(t.num_tokens for t in trajectories),
    }


def trained_units(units: dict[str, list[Role]], train: list[str] | None) -> list[str]:
    """The update units a stage runs, in role order: every unit (one per adapter), or those of the roles
    `team.train` names; the rest keep their adapters' version 0."""
    return [u for u, members in units.items() if train is None or any(m.name in train for m in members)]


class Trainer:
    """`Trainer(cfg).train()`: a whole run in cfg.run_dir, resumed from its checkpoint if there is one."""

    def __init__(
        self,
        cfg: TrainConfig,
        progress: TrainingProgress | None = None,
        engine: TrainableEngine | None = None,
    ):
        self.cfg = cfg
        self.progress = progress or TrainingProgress()
        self.run_dir = Path(cfg.run_dir)
        self._engine = engine
        self.dp: DataParallel | None = None
        self.best = BestStage()  # eval.keep_best: the best validated team so far (weights in checkpoints)

    def model_path(self) -> str:
        return model_path(self.cfg)  # team.model, else the task's own warm-started model

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        torch.set_num_threads(cfg.torch_threads)
        # torchrun: K ranks, rank 0 samples and writes, every rank takes its share of each update
        self.dp = dp = DataParallel.from_env()
        main = dp is None or dp.is_main
        if not main:  # rank 0 makes the run directory first; the others check it holds this config
            dp.barrier()  # type: ignore[union-attr]
        run = RunDir.create(cfg)  # a new run directory, or the same config as the run it resumes
        if dp is not None and main:
            dp.barrier()
        roles = run.roles
        task = run.task()
        if main:
            run.base_paths(roles)  # recorded in the run (base_models.json): serving needs no warm build
        torch.manual_seed(cfg.seed)  # LoRA A-matrix initialisation
        engine = self._engine or run.engine("fresh", threads=cfg.torch_threads)
        # rollout.engine: the trainer's, or vLLM (rank 0 only: the others never sample)
        rollout_engine = run.rollout_engine(engine, roles) if main else engine
        try:
            return self._run(run, roles, task, engine, rollout_engine)
        except Exception as e:
            if main:
                record_failure(self.run_dir, e)  # a failed run says why in its metrics.jsonl
            raise
        finally:
            if isinstance(rollout_engine, VLLMRollouts):
                rollout_engine.close()  # a server launched for the run ends with it

    def _run(
        self,
        run: RunDir,
        roles: list[Role],
        task: TaskFamily,
        engine: TrainableEngine,
        rollout_engine: Engine,
    ) -> dict[str, Any]:
        cfg = self.cfg
        dp = self.dp
        main = dp is None or dp.is_main
        ckpt = load_latest_checkpoint(self.run_dir)
        state = RunState()
        # the other ranks' records (the same numbers) go to a scratch directory: rank 0 writes the run's
        metrics = MetricsLog(self.run_dir) if main else MetricsLog(tempfile.mkdtemp(), tensorboard=False)
        if ckpt is not None:
            if main:
                metrics.truncate_to_bytes(ckpt.state["metrics_bytes"])  # drop what followed the checkpoint
            state = RunState(**ckpt.state["run"])
        team = self.stage_team(
            cfg,
            engine,
            roles,
            task,
            metrics,
            state,
            self.run_dir,
            self.progress,
            rollout_engine=rollout_engine,
            data_parallel=dp,
        )
        start_stage = 0
        if ckpt is not None:
            start_stage = self._restore(team, ckpt)
        elif main:
            for r in roles:  # v0: the adapters the run starts from
                save_peft_adapter(engine.model(r.base_model), r.adapter, run.adapter_dir(r.adapter, 0))

        evaluate = self._stage_evaluation(roles, engine, run.eval_task())  # task.eval_data, else the task
        if not state.evals:
            state.evals.append(evaluate("at the start"))
            metrics.log("eval", state.step, stage=0, **state.evals[-1])  # stage 0: the start
            self.best.offer(0, state.evals[0], {a: p.weights() for a, p in team.policies.items()})
            state.best_stage, state.best_result = self.best.stage, self.best.result  # checkpointed with it
        for stage in range(start_stage, cfg.stages):
            if cfg.max_rollout_tokens is not None and state.train_tokens >= cfg.max_rollout_tokens:
                break
            self._stage(team, trained_units(team.units, cfg.team.train), stage, evaluate)
        summary = self._on_main(lambda: run_summary(state, read_metrics(self.run_dir, kind="update")))
        metrics.log("run", state.step, **summary)
        metrics.close()
        self.engine, self.roles, self.task = engine, roles, task
        return summary

    def stage_team(self, *args: Any, **kwargs: Any) -> LLMStageTeam:
        """The team the stages drive (a subclass may train on other episodes: improve/)."""
        return LLMStageTeam(*args, **kwargs)

    def _stage(
        self, team: LLMStageTeam, role_names: list[str], stage: int, evaluate: Callable[[str], dict[str, Any]]
    ) -> None:
        """One stage of Algorithm 1, the held-out return after it, its record, a checkpoint."""
        cfg, state = self.cfg, team.state
        order_rng = random.Random(derive_seed(cfg.seed, "order", stage))
        self.progress.stage_start(stage, cfg.stages, role_names)
        team.on_update_done = lambda: self._checkpoint(team, stage)
        record = run_stage(team, role_names, cfg.schedule, stage, order_rng)
        state.stage_certificates.append(record.certificate)
        result = evaluate(f"after stage {stage + 1}")
        reverted_to = self._keep_best(team, stage, result)
        state.evals.append(result if reverted_to is None else {**result, "reverted_to": reverted_to})
        team.metrics.log(
            "stage",
            state.step,
            stage=stage + 1,  # stages are numbered from 1 wherever they are shown (training/stage.py)
            order=record.order,
            rollouts=record.rollouts,
            certificate=record.certificate,
            certificate_forms=stage_certificate_forms([u.certificate for u in record.updates]),
            realised_improvement=_difference(result["accuracy"], start_return(state.evals, stage)),
            eval_before=start_return(state.evals, stage),
            eval_after=result["accuracy"],
            reverted_to=reverted_to,  # eval.keep_best undid this stage: the team is stage reverted_to's
            train_tokens=state.train_tokens,
            train_prefill_tokens=state.train_prefill_tokens,
            train_pass_tokens=state.train_pass_tokens,
            diagnostic_tokens=state.diagnostic_tokens,
            accepted=sum(u.accepted for u in record.updates),
            updates=len(record.updates),
        )
        team.stage_batches.clear()
        team.replay_updates.clear()
        team.done_updates.clear()
        self._checkpoint(team, stage + 1)

    def _keep_best(self, team: LLMStageTeam, stage: int, result: dict[str, Any]) -> int | None:
        """eval.keep_best: undo stage `stage` when its held-out return is below the best earlier stage's
        beyond noise (every role gets the best stage's weights back as a new version, saved and pushed like
        an update); else remember it if it is the new best. Returns the stage reverted to, or None."""
        state = team.state
        if not self.cfg.eval.keep_best or not self.best.should_revert(result):
            self.best.offer(stage + 1, result, {a: p.weights() for a, p in team.policies.items()})
            state.best_stage, state.best_result = self.best.stage, self.best.result
            return None
        for adapter, weights in self.best.weights.items():
            policy = team.policies[adapter]
            policy.load_weights({k: v.clone() for k, v in weights.items()})
            version = policy.commit()
            team.publish(policy)
            team.metrics.log(
                "revert", state.step, stage=stage + 1, adapter=adapter, version_after=version,
                reverted_to=self.best.stage,
            )  # fmt: skip
        self.progress.reverted(stage + 1, self.best.stage, result, self.best.result)
        return self.best.stage

    def _stage_evaluation(
        self, roles: list[Role], engine: TrainableEngine, task: TaskFamily
    ) -> Callable[[str], dict[str, Any]]:
        """label -> held-out return on the same eval.stage_episodes tasks every time (greedy by default)."""
        cfg = self.cfg
        # errors name the user's graph (team.graph), not an internal name
        eval_team = build_team(
            cfg.team, roles, engine, temperature=cfg.eval.temperature, name=cfg.team.graph or "eval"
        )
        tasks = (
            task.generate(cfg.eval.stage_episodes, seed=cfg.task.eval_seed) if cfg.eval.stage_episodes else []
        )

        def evaluate(label: str) -> dict[str, Any]:
            if not tasks:
                return {"accuracy": None, "episodes": 0, "tokens": 0}  # per-stage evaluation switched off
            try:
                result = self._on_main(
                    lambda: held_out_return(eval_team, task, tasks, seed=derive_seed(cfg.seed, "eval"))
                )
            except Exception as e:  # say which evaluation, and where in the graph (the notes)
                raise RunDirError(f"held-out evaluation {label!r} failed: {describe_error(e)}") from e
            self.progress.evaluation(label, result)
            return result

        return evaluate

    def _on_main(self, fn: Callable[[], Any]) -> Any:
        """fn() here; data parallel: on rank 0, its result broadcast (training/distributed.py)."""
        return fn() if self.dp is None else self.dp.on_main(fn)

    # ---- resume ---------------------------------------------------------------------------------------
    def _checkpoint(self, team: LLMStageTeam, next_stage: int) -> None:
        """After every completed update (mid-stage) and every completed stage (next_stage = stage + 1);
        data parallel: by rank 0 only (every rank holds the same weights)."""
        if self.dp is not None and not self.dp.is_main:
            return
        state = {
            "next_stage": next_stage,
            "run": dataclasses.asdict(team.state),
            "updates_done": list(team.done_updates),
            "batches": {
                k: {
                    "stage": b.stage,
                    "team_index": b.team_index,
                    "versions": b.versions,
                    "diagnostic": b.diagnostic,
                }
                for k, b in team.stage_batches.items()
            },
            "versions": team.versions(),
            "metrics_bytes": (self.run_dir / METRICS_FILE).stat().st_size,
        }
        adapters = {a: {k: p.detach() for k, p in pi.params.items()} for a, pi in team.policies.items()}
        adapters.update({f"{STAGE_START[0]}{a}": w for a, w in team.stage_start_weights.items()})
        adapters.update({f"{BEST_STAGE}{a}": w for a, w in self.best.weights.items()})
        save_checkpoint(
            self.run_dir,
            team.state.step,
            Checkpoint(
                state=state,
                adapters=adapters,
                optimizers={a: pi.optimizer.state_dict() for a, pi in team.policies.items()},
                rng=rng_state(),
                batches={k: b.trajectories for k, b in team.stage_batches.items()},
            ),
        )

    def _restore(self, team: LLMStageTeam, ckpt: Checkpoint) -> int:
        state = team.state
        self.best = BestStage(state.best_stage, dict(state.best_result))
        for adapter, weights in ckpt.adapters.items():
            if adapter.startswith(STAGE_START):
                team.stage_start_weights[adapter.split("/", 1)[1]] = weights
                continue
            if adapter.startswith(BEST_STAGE):
                self.best.weights[adapter.removeprefix(BEST_STAGE)] = weights
                continue
            policy = team.policies[adapter]
            policy.load_weights({k: v.clone() for k, v in weights.items()})
            while policy.version() < ckpt.state["versions"][adapter]:
                policy.commit()
        for adapter, opt_state in ckpt.optimizers.items():
            team.policies[adapter].optimizer.load_state_dict(opt_state)
        set_rng_state(ckpt.rng)
        team.stage_batches = {
            k: RolloutBatch(key=k, trajectories=ckpt.batches[k], **meta)
            for k, meta in ckpt.state["batches"].items()
        }
        team.done_updates = list(ckpt.state["updates_done"])
        team.replay_updates = {(u["stage"] - 1, u["index"], u["role"]): u for u in team.done_updates}
        return int(ckpt.state["next_stage"])


def run_summary(state: RunState, updates: list[dict[str, Any]]) -> dict[str, Any]:
    """The final "run" record: counters, held-out returns, Spearman(certificate, realised improvement)."""
    improvements = [
        _difference(after["accuracy"], start_return(state.evals, k)) for k, after in enumerate(state.evals[1:])
    ]
    measured = [
        (c, d)
        for c, d in zip(state.stage_certificates, improvements, strict=False)
        if c is not None and d is not None
    ]
    return {
        "stages": len(state.stage_certificates),
        "updates": state.step,
        **trained_updates(updates),  # how many of them trained: accepted, rejected, skipped (no signal)
        "train_tokens": state.train_tokens,
        "diagnostic_tokens": state.diagnostic_tokens,
        "heldout_tokens": state.heldout_tokens,
        "probe_tokens": state.probe_tokens,
        "train_prefill_tokens": state.train_prefill_tokens,
        "train_pass_tokens": state.train_pass_tokens,
        "eval_accuracy": [e["accuracy"] for e in state.evals],
        "certificate_rank_correlation": rank_correlation([c for c, _ in measured], [d for _, d in measured]),
        # the paper's "fraction of updates that left the region": first attempt ended with d_hat > delta
        "left_region_fraction": float(np.mean([u["left_region"] for u in updates])) if updates else 0.0,
        # refused by the trust region; an update with nothing to learn (no_signal) was not tried
        "rejected_fraction": (
            float(np.mean([not u["accepted"] and not u.get("no_signal") for u in updates])) if updates else 0.0
        ),
        # the same on held-out contexts, after the update: exact KL(pi_cur || pi_new) > delta
        **out_of_sample_summary(updates),
        **logprob_gap_summary(updates),  # engine vs trainer log-probs (vLLM rollouts: every role's turns)
    }


def start_return(evals: list[dict[str, Any]], stage: int) -> float | None:
    """The held-out return of the team stage `stage` (0-based) started from: the previous stage's, or,
    when eval.keep_best undid that stage, the return of the stage it went back to."""
    before = evals[stage]
    return before["accuracy"] if "reverted_to" not in before else evals[before["reverted_to"]]["accuracy"]


def _difference(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before
