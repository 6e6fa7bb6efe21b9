"""The blind-relay study (issue 25 item 5): TeamTR vs naive vs sequential GRPO where the coupling is hidden.

    .venv/bin/python benchmarks/relay_study.py                  # the whole design (resumable)
    .venv/bin/python benchmarks/relay_study.py --pilot          # n = 4, l = 0, one seed, both deltas
    .venv/bin/python benchmarks/relay_study.py --recount-turns --out DIR   # turn rates of finished cells again

Design (benchmarks/results/relay_study/preregistration.md): task `relay` (tasks/relay.py) with
n in {2, 4, 6} roles at legibility l = 0, and l = 1 at n = 4 (the negative control); per-message delta in
{0.05, 0.3} for every arm; `stages` stages of B = 8 prompts x G = 16 episodes; seeds paired (same warm
start, training prompts and evaluation tasks); arms

  teamtr           TeamTR, suffix resampling after every update
  naive            the same run with the stage-start batch reused by every update (TeamTR minus resampling)
  sequential_grpo  GRPO's loss (per-token ratio, group-normalised) on the stage-start batch, same delta
  teamtr_reversed  (secondary, --arms) TeamTR with the roles updated in reversed order
  joint            (secondary, --arms) the paper's joint update: one objective over the team's trajectory
                   ratios on the stage-start batch, every adapter moved by each step (training/joint_step.py)
  shared_adapter   (secondary, --arms) one LoRA adapter speaks every role, one update per stage on all
                   roles' messages of the stage-start batch (team.shared_adapter): the single-policy peer

Each (n, l) first gets a `warm` cell: its warm start (built once, cached) evaluated at T = 1 on
`eval_episodes` tasks (the primary endpoint's distribution), greedily, and its reward spread over groups
of G. Every cell is one line of `cells.jsonl`, skipped on a rerun; a cell interrupted mid-run resumes
from its run directory's checkpoint. Per update the cell keeps delta_eff (the out-of-sample KL on
`heldout_episodes` fresh episodes of pi^(i-1)) and the stale penalty (promised L_hat - held-out L_ho).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from team_size_study import append_cell, read_cells, record_config  # noqa: E402

ARMS = ("teamtr", "naive", "sequential_grpo")
# not in the default: TeamTR updating the roles in reversed order; naive sequential until it has generated
# as many training tokens as the same seed's TeamTR cell (more stages); the joint update and the shared
# adapter (issue 37 item 1: baselines for its study)
SECONDARY_ARMS = ("teamtr_reversed", "naive_tokens", "joint", "shared_adapter")
ROUTER = "teamtr.tasks.relay:relay_order"
# the preregistration's budget (pilot part 5): the n = 6 and control cells and every delta 0.05 cell at 3
# seeds, the control at delta 0.05 dropped
REDUCED_SEEDS = {"n6/l0/d0.3": 3, "n4/l1/d0.3": 3, "n4/l0/d0.05": 3, "n6/l0/d0.05": 3, "n2/l0/d0.05": 3,
                 "n4/l1/d0.05": 0}  # fmt: skip


@dataclass
class RelayStudyConfig:
    out: Path = Path("benchmarks/results/relay_study")
    sizes: list[int] = field(default_factory=lambda: [4, 6, 2])  # run in this order
    deltas: list[float] = field(default_factory=lambda: [0.3, 0.05])  # the first is run first everywhere
    control_size: int = 4  # l = 1 (negative control) is run at this n only
    seeds: int = 5
    # fewer seeds where the preregistration reduced the design to fit its budget ("n6/l0/d0.3": 3; 0 drops it)
    cell_seeds: dict[str, int] = field(default_factory=lambda: dict(REDUCED_SEEDS))
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    stages: int = 4
    prompts: int = 8  # B
    group: int = 16  # G
    lr: float = 1.5e-2  # calibrated so the steps reach the trust region (preregistration, pilot part 5)
    epochs: int = 4
    eval_episodes: int = 1000  # T = 1 episodes of the primary endpoint (binomial 95% half-width <= 3.1)
    greedy_episodes: int = 400  # the secondary endpoint
    stage_episodes: int = 100  # T = 1 return before and after every stage (the learning curves)
    heldout_episodes: int = 64  # fresh episodes of pi^(i-1) per update: delta_eff and L_ho
    spread_prompts: int = 64  # warm cell: groups of G at T = 1 for the reward spread
    model: str | None = None  # one base model for every cell (tests); None: each (n, l)'s warm start
    slip: float = 0.7  # role 1's demonstrated slip rate (a task knob: its own warm start)
    warm_steps: int = 1200  # the warm build's optimizer steps (one evaluation, at the end)
    # the lab's radii for the warm cell's own prediction (None: `deltas`); the preregistration sets them
    # to the delta_eff the LLM steps reach
    lab_deltas: list[float] | None = field(default_factory=lambda: [0.05, 0.15, 0.3])
    lab_seeds: int = 10  # warm starts with logit noise for the prediction's band
    # config overrides for every training cell ("trust_region.check": "sampled", ...): ablations of the
    # trainer (benchmarks/results/trainer_check/)
    overrides: dict[str, Any] = field(default_factory=dict)


def cell_key(n: int, legibility: float, delta: float | None, seed: int | None, arm: str) -> str:
    if arm == "warm":
        return f"n{n}/l{legibility:g}/warm"
    return f"n{n}/l{legibility:g}/d{delta:g}/seed{seed}/{arm}"


def settings(cfg: RelayStudyConfig) -> list[tuple[int, float]]:
    """(n, l) pairs: every n at l = 0, the control size at l = 1 too."""
    return [(n, 0.0) for n in cfg.sizes] + ([(cfg.control_size, 1.0)] if cfg.control_size in cfg.sizes else [])


def planned_cells(cfg: RelayStudyConfig) -> list[tuple[int, float, float | None, int | None, str]]:
    """Every cell, deltas in the order given (the first is run first everywhere), then (n, l) in the order of
    `sizes`; an (n, l)'s warm cell comes before its first training cell."""
    cells: list[tuple[int, float, float | None, int | None, str]] = []
    for delta in cfg.deltas:
        for n, legibility in settings(cfg):
            if (n, legibility, None, None, "warm") not in cells:
                cells.append((n, legibility, None, None, "warm"))
            for seed, arm in itertools.product(range(seeds_of(cfg, legibility, delta, n)), cfg.arms):
                cells.append((n, legibility, delta, seed, arm))
    return cells


def setting_key(n: int, legibility: float, delta: float) -> str:
    return f"n{n}/l{legibility:g}/d{delta:g}"


def seeds_of(cfg: RelayStudyConfig, legibility: float, delta: float, n: int) -> int:
    """Seeds of one (n, l, delta): `seeds`, or the preregistration's reduced count in `cell_seeds`."""
    return cfg.cell_seeds.get(setting_key(n, legibility, delta), cfg.seeds)


def warm_model(n: int, legibility: float, cfg: RelayStudyConfig) -> str:
    if cfg.model:
        return cfg.model
    from teamtr.training.warmstart import ensure_warm_model, warm_config_for

    options = task_options(n, legibility, cfg)
    warm = warm_config_for("relay", steps=n, task_options=options, max_steps=cfg.warm_steps, eval_every=cfg.warm_steps)
    return str(ensure_warm_model(warm, progress=False))


def task_options(n: int, legibility: float, cfg: RelayStudyConfig) -> dict[str, Any]:
    return {"steps": n, "legibility": legibility, "slip": cfg.slip}


def train_config(
    n: int, legibility: float, delta: float, seed: int, arm: str, model: str, cfg: RelayStudyConfig,
    budget: int | None = None,
):
    """One cell's run; naive_tokens: `budget` (TeamTR's generated tokens) ends it at the first stage
    boundary past it."""
    from teamtr.training.config import TrainConfig

    if arm not in ARMS + SECONDARY_ARMS:
        raise ValueError(f"unknown arm {arm!r}; arms: {ARMS + SECONDARY_ARMS}")
    teamtr = arm.startswith("teamtr")
    return TrainConfig.from_dict(
        {
            "seed": seed,
            "stages": cfg.stages * (2 * n if arm == "naive_tokens" else 1),
            "max_rollout_tokens": budget if arm == "naive_tokens" else None,
            "run_dir": str(cfg.out / "runs" / cell_key(n, legibility, delta, seed, arm)),
            "task": {"name": "relay", "options": task_options(n, legibility, cfg)},
            "team": {"model": model, "router": ROUTER, "shared_adapter": arm == "shared_adapter"},
            "schedule": {
                "kind": "teamtr" if teamtr else "joint" if arm == "joint" else "naive",
                "resample": "suffix",
                "order": "reversed" if arm == "teamtr_reversed" else "fixed",
            },
            "rollout": {"prompts_per_update": cfg.prompts, "group_size": cfg.group, "temperature": 1.0},
            "loss": {"kind": "grpo" if arm == "sequential_grpo" else "message_ratio"},
            "optim": {"lr": cfg.lr, "epochs": cfg.epochs, "minibatch_messages": 64},
            "trust_region": {"delta": delta, "heldout_episodes": cfg.heldout_episodes},
            "eval": {"stage_episodes": cfg.stage_episodes, "final_episodes": cfg.eval_episodes, "temperature": 1.0},
        }
    ).with_overrides(cfg.overrides)


def episodes(engine: Any, run: Any, seed: int, temperature: float, n: int, group: int = 1) -> tuple[list, list]:
    """(tasks, trajectories): `group` episodes at `temperature` on each of `n` held-out tasks (the same
    tasks in every cell of an (n, l): task.eval_seed)."""
    from teamtr.graphs.team import derive_seed

    task = run.task()
    tasks = task.generate(n, seed=run.config.task.eval_seed)
    team = run.team(run.roles, engine, temperature=temperature, name="eval")
    return tasks, team.run(tasks, group_size=group, verifier=task, seed=derive_seed(seed, "final-eval", temperature))


def evaluate(engine: Any, run: Any, seed: int, temperature: float, n: int, group: int = 1) -> list[float]:
    """Team reward of each of those episodes."""
    return [float(t.reward) for t in episodes(engine, run, seed, temperature, n, group)[1]]


def turn_rates(tasks: list, trajectories: list) -> dict[str, float]:
    """What the lab twin's warm start needs, measured on the team's own episodes: role 1's slip rate
    (value + 1) and stray rate (neither value nor slip), and over blind turns the correction rate
    (previous - 1) and stray rate (neither copy nor correction); a turn that is not one digit is stray.
    `blind_stray_per_turn` also counts every blind turn after an unreadable one (not one digit: nothing to
    copy or correct, so an earlier role's stray is counted again); `blind_own_stray_per_turn` is the blind
    roles' own: over blind turns after a digit only."""
    value = {t.id: t.meta["value"] for t in tasks}
    views = {t.id: t.meta["role_views"] for t in tasks}
    first = {"slip": 0, "stray": 0, "n": 0}
    blind = {"correction": 0, "stray": 0, "n": 0, "own_stray": 0, "after_digit": 0}
    for traj in trajectories:
        texts = [t.text.strip() for t in traj.turns]
        digits = [int(x) if len(x) == 1 and x.isdigit() else None for x in texts]
        v = value[traj.task_id]
        first["n"] += 1
        first["slip"] += digits[0] == (v + 1) % 10
        first["stray"] += digits[0] not in (v, (v + 1) % 10)
        names = list(dict.fromkeys(t.role for t in traj.turns))
        for k in range(1, len(digits)):
            if views[traj.task_id][names.index(traj.turns[k].role)]:
                continue  # this role sees the value: not blind
            prev = digits[k - 1]
            blind["n"] += 1
            if prev is not None:
                blind["after_digit"] += 1
                blind["own_stray"] += digits[k] not in (prev, (prev - 1) % 10)
            if prev is None or digits[k] is None:
                blind["stray"] += 1
                continue
            blind["correction"] += digits[k] == (prev - 1) % 10
            blind["stray"] += digits[k] not in (prev, (prev - 1) % 10)
    return {
        "slip": first["slip"] / max(first["n"], 1),
        "first_stray": first["stray"] / max(first["n"], 1),
        "correction_per_turn": blind["correction"] / max(blind["n"], 1),
        "blind_stray_per_turn": blind["stray"] / max(blind["n"], 1),
        "blind_own_stray_per_turn": blind["own_stray"] / max(blind["after_digit"], 1),
    }


def reward_spread(rewards: list[float], group: int) -> dict[str, float]:
    """Over groups of `group` episodes of one task: the fraction with unequal rewards (groups that
    carry an advantage) and the mean within-group standard deviation."""
    r = np.asarray(rewards).reshape(-1, group)
    return {"groups_with_spread": float((r.std(1) > 0).mean()), "within_group_std": float(r.std(1).mean())}


def run_warm(n: int, legibility: float, cfg: RelayStudyConfig) -> dict[str, Any]:
    from teamtr.training.run_dir import RunDir

    model = warm_model(n, legibility, cfg)
    tcfg = train_config(n, legibility, cfg.deltas[0], 0, "teamtr", model, cfg).with_overrides(
        {"run_dir": str(cfg.out / "runs" / cell_key(n, legibility, None, None, "warm"))}
    )
    run = RunDir.create(tcfg)
    engine = run.engine("fresh")  # fresh LoRA adapters (B = 0): the warm model itself
    tasks, t1 = episodes(engine, run, 0, 1.0, cfg.eval_episodes)
    greedy = evaluate(engine, run, 0, 0.0, cfg.greedy_episodes)
    spread = evaluate(engine, run, 0, 1.0, cfg.spread_prompts, group=cfg.group)
    accuracy = float(np.mean([t.reward for t in t1]))
    rates = turn_rates(tasks, t1)
    return {
        "model": model,
        "accuracy_t1": accuracy,
        "turn_rates_t1": rates,
        "lab_prediction": lab_prediction(n, legibility, rates, cfg),
        "accuracy_greedy": float(np.mean(greedy)),
        "in_band": 0.4 <= accuracy <= 0.6,
        **reward_spread(spread, cfg.group),
    }


def lab_warm_rates(n: int, rates: dict[str, float]) -> dict[str, float]:
    """The lab twin's warm start (training/theory relay_warm_logits) from the measured turn rates: role 1's
    slip among its value-or-slip answers, its stray mass, corrections per episode, blind stray per turn;
    each kept inside [0.001, 0.999] (the lab's logits are log-probabilities: a measured 0 or 1 has none)."""
    right_or_slip = 1.0 - rates["first_stray"]
    raw = {
        "relay_slip": rates["slip"] / right_or_slip if right_or_slip > 0 else 0.5,
        "relay_first_stray": rates["first_stray"],
        "relay_correction": rates["correction_per_turn"] * 2 * (n - 1),
        "relay_stray": rates["blind_stray_per_turn"],
    }
    return {k: float(np.clip(v, 1e-3, 1 - 1e-3)) for k, v in raw.items()}


def lab_prediction(n: int, legibility: float, rates: dict[str, float], cfg: RelayStudyConfig) -> list[dict]:
    """The exact lab's prediction for this (n, l) with its warm cell's measured rates, one row per lab radius:
    written with the warm cell, so it is on record before any training cell of the setting runs."""
    from relay_predictions import predict

    warm = lab_warm_rates(n, rates)
    return [
        predict(n, legibility, delta, cfg.stages, cfg.lab_seeds, 0.3, warm)
        for delta in (cfg.lab_deltas or cfg.deltas)
    ]


def run_arm(
    n: int, legibility: float, delta: float, seed: int, arm: str, cfg: RelayStudyConfig, budget: int | None = None
) -> dict[str, Any]:
    from teamtr.graphs.run_layout import read_metrics
    from teamtr.training.run_dir import RunDir
    from teamtr.training.trainer import Trainer

    tcfg = train_config(n, legibility, delta, seed, arm, warm_model(n, legibility, cfg), cfg, budget)
    trainer = Trainer(tcfg)
    summary = trainer.train()
    run = RunDir(tcfg.run_dir)
    tasks, final = episodes(trainer.engine, run, seed, 1.0, cfg.eval_episodes)
    t1 = [float(t.reward) for t in final]
    greedy = evaluate(trainer.engine, run, seed, 0.0, cfg.greedy_episodes)
    updates = read_metrics(Path(tcfg.run_dir), kind="update")
    stages = read_metrics(Path(tcfg.run_dir), kind="stage")

    def per_update(name: str) -> list[float | None]:
        return [u.get(name) for u in updates]

    return {
        "accuracy_t1": float(np.mean(t1)),
        "accuracy_greedy": float(np.mean(greedy)),
        "rewards_t1": t1,
        # the blind roles' stray mass per turn and the other turn rates, on the final T = 1 episodes
        "turn_rates_t1": turn_rates(tasks, final),
        "stages": summary["stages"],
        "updates": summary["updates"],
        "train_tokens": summary["train_tokens"],
        "rejected_fraction": summary["rejected_fraction"],
        "delta_eff": per_update("delta_eff"),
        "d_hat": per_update("d_hat"),
        "stale_penalty": per_update("stale_penalty"),
        "surrogate_promised": per_update("surrogate_promised"),
        "surrogate_heldout": per_update("surrogate_heldout"),
        "no_signal": per_update("no_signal"),
        "train_reward": per_update("reward"),
        # the region check's own figures (trust_region.check: probe) and what the batch never saw
        "role": per_update("role"),
        "accepted": per_update("accepted"),
        "kl_batch_exact": per_update("kl_batch_exact"),
        "kl_probe_ucb": per_update("kl_probe_ucb"),
        "optimiser_steps": per_update("optimiser_steps"),
        "heldout_contexts_unseen": per_update("heldout_contexts_unseen"),
        "reverts": len(read_metrics(Path(tcfg.run_dir), kind="revert")),
        "curve_t1": summary["eval_accuracy"],  # T = 1 return on stage_episodes tasks, before and after each stage
        "train_tokens_monitor": summary["heldout_tokens"],
        # the other two counts (training/token_counts.py), and all three after each stage (the curve's x)
        "train_prefill_tokens": summary["train_prefill_tokens"],
        "train_pass_tokens": summary["train_pass_tokens"],
        "stage_tokens": [
            [s["train_tokens"], s.get("train_prefill_tokens"), s.get("train_pass_tokens")] for s in stages
        ],
    }


def run_cell(cell: tuple[int, float, float | None, int | None, str], cfg: RelayStudyConfig) -> dict[str, Any]:
    n, legibility, delta, seed, arm = cell
    t0 = time.perf_counter()
    if arm == "warm":
        result = run_warm(n, legibility, cfg)
    else:
        assert delta is not None and seed is not None
        budget = None
        if arm == "naive_tokens":  # the same seed's TeamTR cell must have finished (it is planned first)
            budget = read_cells(cfg.out / "cells.jsonl")[cell_key(n, legibility, delta, seed, "teamtr")]["train_tokens"]
        result = run_arm(n, legibility, delta, seed, arm, cfg, budget)
    record = {
        "key": cell_key(*cell),
        "n": n,
        "legibility": legibility,
        "delta": delta,
        "seed": seed,
        "arm": arm,
        **result,
        "seconds": time.perf_counter() - t0,
    }
    append_cell(cfg.out / "cells.jsonl", record)
    return record


def run_study(cfg: RelayStudyConfig, log: Any = print) -> dict[str, dict[str, Any]]:
    """Every planned cell not yet in cells.jsonl, in order (warm cell of an (n, l) before its arms)."""
    import torch

    torch.set_num_threads(1)
    cfg.out.mkdir(parents=True, exist_ok=True)
    record_config(cfg.out, asdict(cfg))
    path = cfg.out / "cells.jsonl"
    plan = planned_cells(cfg)
    done = read_cells(path)
    log(f"{len(plan)} cells, {sum(cell_key(*c) in done for c in plan)} already in {path}")
    for cell in plan:
        if cell_key(*cell) in done:
            continue
        rec = run_cell(cell, cfg)
        log(f"{rec['key']}: T=1 accuracy {rec['accuracy_t1']:.3f} ({rec['seconds']:.0f} s)")
        done[rec["key"]] = rec
    return done


def recount_turns(out: Path, log: Any = print) -> None:
    """The turn rates of finished cells again (what `turn_rates` counts now), from their run directories:
    each cell's final T = 1 episodes regenerated (same seeds; its reward must equal the one on record) and
    its rates written to turn_rates.jsonl beside cells.jsonl (cells.jsonl is left as the study wrote it)."""
    import json

    import torch

    from teamtr.training.run_dir import RunDir
    from teamtr.training.trainer import Trainer

    torch.set_num_threads(1)
    cfg = RelayStudyConfig(**{**json.loads((out / "config.json").read_text()), "out": out})
    path = out / "turn_rates.jsonl"
    done = {json.loads(line)["key"] for line in path.read_text().splitlines()} if path.exists() else set()
    for key, cell in read_cells(out / "cells.jsonl").items():
        if key in done or "blind_own_stray_per_turn" in cell.get("turn_rates_t1", {}):
            continue
        n, legibility, delta, seed = cell["n"], cell["legibility"], cell["delta"], cell["seed"]
        if cell["arm"] == "warm":
            run = RunDir(str(cfg.out / "runs" / cell_key(n, legibility, None, None, "warm")))
            tasks, final = episodes(run.engine("fresh"), run, 0, 1.0, cfg.eval_episodes)
        else:
            tcfg = train_config(n, legibility, delta, seed, cell["arm"], warm_model(n, legibility, cfg), cfg)
            trainer = Trainer(tcfg)
            trainer.train()  # finished: restores the run's final team
            tasks, final = episodes(trainer.engine, RunDir(tcfg.run_dir), seed, 1.0, cfg.eval_episodes)
        accuracy = float(np.mean([t.reward for t in final]))
        if abs(accuracy - cell["accuracy_t1"]) > 1e-9:
            raise RuntimeError(f"{key}: regenerated T = 1 accuracy {accuracy} is not the recorded {cell['accuracy_t1']}")
        with open(path, "a") as f:
            f.write(json.dumps({"key": key, "turn_rates_t1": turn_rates(tasks, final)}) + "\n")
        log(f"{key}: turn rates recounted")


def parse_args(argv: list[str] | None) -> RelayStudyConfig:
    d = RelayStudyConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=d.out)
    p.add_argument("--sizes", nargs="+", type=int, default=d.sizes)
    p.add_argument("--deltas", nargs="+", type=float, default=d.deltas)
    p.add_argument("--arms", nargs="+", default=d.arms, choices=ARMS + SECONDARY_ARMS)
    for name in ("control_size", "seeds", "stages", "prompts", "group", "epochs", "eval_episodes",
                 "greedy_episodes", "stage_episodes", "heldout_episodes", "spread_prompts", "warm_steps"):  # fmt: skip
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name))
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument(
        "--cell-seeds", nargs="*", default=None, metavar="n4/l1/d0.3=3",
        help="seeds of given (n, l, delta) settings (default: the preregistration's reductions; none: --seeds everywhere)",
    )  # fmt: skip
    p.add_argument("--lab-deltas", nargs="+", type=float, default=d.lab_deltas, help="the warm cell's lab radii")
    p.add_argument("--lab-seeds", type=int, default=d.lab_seeds)
    p.add_argument("--slip", type=float, default=d.slip, help="role 1's demonstrated slip rate")
    p.add_argument("--model", default=None, help="one base model for every cell (default: the warm starts)")
    p.add_argument("--pilot", action="store_true", help="n = 4, l = 0, one seed (out: .../pilot)")
    p.add_argument(
        "--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
        help="config overrides of every training cell (YAML values), repeatable: --set trust_region.check=sampled",
    )  # fmt: skip
    a = vars(p.parse_args(argv))
    a["overrides"] = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in a["overrides"])}
    if a["cell_seeds"] is None:
        a.pop("cell_seeds")
    else:
        a["cell_seeds"] = {k: int(v) for k, v in (item.split("=", 1) for item in a["cell_seeds"])}
    if a.pop("pilot"):
        a.update(sizes=[4], control_size=0, seeds=1, cell_seeds={}, out=a["out"] / "pilot")
    return RelayStudyConfig(**a)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "--recount-turns" in args:  # the finished cells' turn rates again (`recount_turns`), nothing trained
        recount_turns(parse_args([a for a in args if a != "--recount-turns"]).out)
        return
    cells = run_study(parse_args(argv))
    print(f"{len(cells)} cells in cells.jsonl")


if __name__ == "__main__":
    sys.exit(main())
