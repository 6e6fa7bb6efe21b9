"""The gate a candidate team passes before any live episode sees it.

    accuracy   both teams answer the same held-out recent prompts as served (greedy, or sampled at the
               served temperature with several episodes per prompt), scored by the gate's judge
               (judge.py: by default not the training reward); a one-sided paired test at
               alpha = 1 - `confidence` on the per-prompt differences (candidate - incumbent; stats.py
               `gate_test`: the exact sign test (McNemar) for binary rewards, else the paired t-test)
               must show the candidate better (superiority, the default), or, only when
               `non_inferiority` is given, not worse by more than it. The gate looks once, at a fixed
               number of prompts, so a fixed-n test spends its whole error budget (no peeking
               penalty)
    KL         for every changed role, KL(incumbent || candidate) on the incumbent team's own samples at
               the training temperature (k3 estimator, summed over a message, averaged over messages:
               what the trust region bounds, training/losses.py) is within `kl_limit` (default: how far
               the run's trust region lets a role go, `trust_region_reach`)
    certificate  the improve run's stage certificates are logged with the decision

Both teams run on one engine of their own, the incumbent's versions under `<adapter>~incumbent`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.open import open_engine
from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskInstance
from teamtr.graphs.trajectory import Trajectory
from teamtr.improve.data import ServedTasks
from teamtr.improve.stats import gate_test, test_name
from teamtr.training.run_dir import RunDir

INCUMBENT_SUFFIX = "~incumbent"


@dataclass
class GateConfig:
    confidence: float = 0.95  # one-sided: a not-better candidate passes with probability <= 5%
    non_inferiority: float | None = None  # a margin: pass when not worse by more (explicit only)
    reward_range: tuple[float, float] = (0.0, 1.0)  # the judge's rewards lie here (the bound needs it)
    kl_limit: float | None = None  # per role; None: trust_region_reach(the trainer's delta, its stages)
    kl_episodes: int = 2  # incumbent episodes per held-out prompt to measure the KL on
    seed: int = 0
    # how the team is served: greedy (0, the default of `teamtr serve`) or sampled at T, then with
    # `episodes` per prompt whose mean reward is the prompt's figure
    temperature: float = 0.0
    episodes: int = 1


def trust_region_reach(delta: float, updates: int) -> float:
    """The farthest KL from its start a role gets in `updates` steps that each stay within KL delta.

    Locally KL is half a squared Fisher-Rao distance, so sqrt(KL), not KL, adds up along a path (to
    second order): k steps reach (k sqrt(delta))^2 = k^2 delta when they point the same way. The earlier
    default, delta x k, assumed KL itself adds, and refused candidates whose every update had stayed
    inside its region (the demo's 8 stages at delta 0.05: per-role KL 0.41-1.34 to the incumbent against
    a limit of 0.4; docs/improve.md, "End to end on a real gain")."""
    return delta * updates**2


@dataclass
class GateResult:
    passed: bool
    reasons: list[str]
    incumbent_reward: float
    candidate_reward: float
    difference: float  # mean(candidate - incumbent)
    lower_bound: float  # its lower bound at the confidence (stats.py gate_test)
    test: str  # superiority | non-inferiority (margin)
    judge: str
    kl: dict[str, float]  # role -> measured KL(incumbent || candidate)
    kl_limit: float
    prompts: int
    certificate: dict[str, Any] = field(default_factory=dict)
    method: str = ""  # the test: exact sign test (McNemar) | paired t-test
    p_value: float = 1.0
    wins: int = 0  # held-out prompts the candidate did better on ...
    losses: int = 0  # ... and worse

    def figures(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _roles(roles: list[Role], suffix: str) -> list[Role]:
    return [dataclasses.replace(r, adapter=f"{r.adapter}{suffix}") if r.adapter else r for r in roles]


def gate_engine(
    served: RunDir, incumbent: dict[str, tuple[int, str]], candidate: dict[str, Path], threads: int
):
    """An engine with the incumbent's versions under `<adapter>~incumbent` and the candidate's (its new
    versions, the incumbent's elsewhere) under `<adapter>`, on the run's device and dtype."""
    engine = open_engine(served.engine_spec(served.base_paths(), threads=threads)).engine
    for role in served.roles:
        if role.adapter is None or role.adapter not in incumbent:
            continue
        inc_path = incumbent[role.adapter][1]
        engine.load_adapter_sync(role.adapter + INCUMBENT_SUFFIX, inc_path, base=role.base_model)
        engine.load_adapter_sync(role.adapter, candidate.get(role.adapter, inc_path), base=role.base_model)
    return engine


def _kl(engine: EmbeddedEngine, trajectories: list[Trajectory], role: Role, temperature: float) -> float:
    """KL(incumbent || candidate) of one role: k3 summed over each message, averaged over messages."""
    turns = [t for traj in trajectories for t in traj.turns_of(role.name) if t.completion_ids]
    if not turns:
        return 0.0
    prompts, completions = [t.prompt_ids for t in turns], [t.completion_ids for t in turns]
    with torch.no_grad():
        inc = engine.token_logprobs(
            prompts, completions, role.adapter + INCUMBENT_SUFFIX, role.base_model, temperature
        )
        cand = engine.token_logprobs(prompts, completions, role.adapter, role.base_model, temperature)
    per_message = []
    for a, b in zip(inc, cand, strict=True):
        log_ratio = (b - a).double()  # log pi_cand / pi_inc on tokens sampled from pi_inc
        per_message.append(float((log_ratio.exp() - 1 - log_ratio).sum()))
    return float(np.mean(per_message))


def _per_prompt(trajectories: list[Trajectory], k: int) -> list[float]:
    """Each prompt's mean reward over its k episodes (they come back grouped by task, in task order)."""
    return [
        float(np.mean([t.reward for t in trajectories[i : i + k]])) for i in range(0, len(trajectories), k)
    ]


def run_gate(
    served: RunDir,
    incumbent: dict[str, tuple[int, str]],
    candidate: dict[str, Path],
    held_out: list[str],
    task: ServedTasks,
    cfg: GateConfig,
    *,
    temperature: float,
    kl_limit: float,
    threads: int = 1,
    certificate: dict[str, Any] | None = None,
    judge: str = "",
) -> GateResult:
    engine = gate_engine(served, incumbent, candidate, threads)
    roles = served.roles
    instances: list[TaskInstance] = [task.instance(p) for p in held_out]
    t, k = cfg.temperature, cfg.episodes if cfg.temperature > 0 else 1
    inc_team = served.team(_roles(roles, INCUMBENT_SUFFIX), engine, temperature=t, name="incumbent")
    cand_team = served.team(roles, engine, temperature=t, name="candidate")
    inc = inc_team.run(instances, group_size=k, verifier=task, seed=cfg.seed)
    cand = cand_team.run(instances, group_size=k, verifier=task, seed=cfg.seed)
    cand_prompt, inc_prompt = _per_prompt(cand, k), _per_prompt(inc, k)
    lo, hi = cfg.reward_range
    margin = cfg.non_inferiority or 0.0
    decided = gate_test(cand_prompt, inc_prompt, lo, hi, cfg.confidence, margin)
    mean_diff, lower = decided.mean, decided.lower
    test = test_name(cfg.non_inferiority)
    figures = (
        f"held-out reward difference {mean_diff:+.3f} over {decided.n} prompts ({decided.wins} won, "
        f"{decided.losses} lost), lower {cfg.confidence:.0%} bound {lower:+.3f}, {decided.method} "
        f"p = {decided.p_value:.3g}"
    )
    sampled_team = served.team(_roles(roles, INCUMBENT_SUFFIX), engine, temperature=temperature, name="kl")
    samples = sampled_team.run(instances, group_size=cfg.kl_episodes, seed=cfg.seed + 1)
    kl = {
        r.name: _kl(engine, samples, dataclasses.replace(r, adapter=r.adapter), temperature)
        for r in roles
        if r.adapter in candidate
    }
    reasons = []
    if not decided.passed:
        reasons.append(f"{figures}: not shown above {0.0 - margin:+.3f} at {cfg.confidence:.0%} ({test})")
    for role, value in kl.items():
        if not np.isfinite(value) or value > kl_limit:
            reasons.append(
                f"role {role}: KL to the incumbent {value:.4g} is over its trust region {kl_limit:.4g}"
            )
    return GateResult(
        passed=not reasons,
        reasons=reasons
        or [
            f"{figures}: shown above {0.0 - margin:+.3f} at {cfg.confidence:.0%} ({test}, judge {judge}); "
            "every role within its trust region"
        ],
        incumbent_reward=float(np.mean([t.reward for t in inc])),
        candidate_reward=float(np.mean([t.reward for t in cand])),
        difference=mean_diff,
        lower_bound=lower,
        test=test,
        judge=judge,
        kl=kl,
        kl_limit=kl_limit,
        prompts=len(held_out),
        certificate=certificate or {},
        method=decided.method,
        p_value=decided.p_value,
        wins=decided.wins,
        losses=decided.losses,
    )
