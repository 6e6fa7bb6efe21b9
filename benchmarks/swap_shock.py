"""Swap shock: replace one role of a trained small team by another (larger) small model, directly or
after Stage-0 alignment, then continue TeamTR for K stages on both paths.

    .venv/bin/python benchmarks/swap_shock.py [--seeds 3] [--stages-after 2] [--probes 256]

Per seed: a TeamTR run of the demo team (3 adders, the cached warm-started model) for `--stages-before`
stages -> `teamtr swap` of role `--role` to the newcomer (a separately warm-started model, hidden 160 /
5 layers, another seed, whose messages join numbers with `--newcomer-separator`, " + " by default) twice: --no-align (direct) and with Stage-0 -> `--stages-after` more TeamTR
stages from each new run directory. Held-out team accuracy (greedy, the run's stage-eval tasks) is
read at: before the swap, right after it, and after every further stage.

Writes OUT/swap_shock.json, OUT/swap_shock.md (the table) and OUT/swap_shock.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rich.console import Console

console = Console()

# Larger, independently warm-started, and (by default) speaking another message protocol: `19 + 5` where
# the team writes `19+5`. The paper's swap shock comes from such a protocol mismatch.
NEWCOMER = {"hidden": 160, "layers": 5, "heads": 5, "seed": 1}


def base_config(seed: int, run_dir: Path, stages: int, args: argparse.Namespace):
    from teamtr.training.config import TrainConfig

    return TrainConfig.from_dict(
        {
            "seed": seed,
            "stages": stages,
            "run_dir": str(run_dir),
            "task": {"name": "chain", "options": {"max_operand": args.max_operand}},
            "team": {"roles": "teamtr.graphs.chain_team:chain_roles", "model": str(args.incumbent_path)},
            "schedule": {"kind": "teamtr", "order": "fixed", "diagnose_stale_gap": False},
            "rollout": {"prompts_per_update": args.prompts, "group_size": args.group},
            "optim": {"lr": 1e-3, "epochs": 4, "minibatch_messages": 64},
            "trust_region": {"delta": 0.05},
            "eval": {"stage_episodes": args.eval_episodes, "final_episodes": args.eval_episodes},
        }
    )


def one_seed(seed: int, newcomer: Path, args: argparse.Namespace) -> dict:
    from teamtr.training.config import TrainConfig
    from teamtr.training.swap import SwapConfig, swap_role
    from teamtr.training.trainer import Trainer

    root = Path(args.out) / f"seed{seed}"
    t0 = time.perf_counter()
    Trainer(base_config(seed, root / "run", args.stages_before, args)).train()
    out: dict = {"seed": seed}
    for path, align in (("direct", False), ("stage0", True)):
        result = swap_role(
            root / "run",
            SwapConfig(
                role=args.role,
                model=str(newcomer),
                out=str(root / path),
                probes=args.probes,
                delta0=args.delta0,
                align=align,
                max_rounds=args.max_rounds,
                extra_stages=args.stages_after,
                seed=seed,
            ),
        )
        summary = Trainer(TrainConfig.from_yaml(result.out_dir / "config.yaml")).train()
        # eval_accuracy: [the start, after stage 1, ...]; the swap replaced the entry of its boundary
        after_stages = summary["eval_accuracy"][args.stages_before + 1 :]
        out[path] = {
            "before": result.eval_before,
            "after_swap": result.eval_after,
            "after_stages": after_stages,
            "kl_history": result.kl_history,
            "converged": result.converged,
            "rounds": result.rounds,
        }
        console.print(
            f"seed {seed} {path}: before {result.eval_before:.3f} -> swap {result.eval_after:.3f} -> "
            f"{' -> '.join(f'{a:.3f}' for a in after_stages)} (KL {result.kl_history[0]:.3f} -> "
            f"{result.kl_final:.3f}, {result.rounds} rounds)"
        )
    out["seconds"] = time.perf_counter() - t0
    return out


def mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def table(runs: list[dict], stages_after: int) -> str:
    cols = ["before swap", "right after swap"] + [f"after {k} stage(s)" for k in range(1, stages_after + 1)]
    lines = ["| path | " + " | ".join(cols) + " | shock (points) |", "|---" * (len(cols) + 2) + "|"]
    for path, label in (("direct", "direct swap"), ("stage0", "Stage-0 then swap")):
        series = [[r[path]["before"], r[path]["after_swap"], *r[path]["after_stages"]] for r in runs]
        cells = [mean_sd([100 * s[i] for s in series]) for i in range(len(cols))]
        shock = mean_sd([100 * (s[0] - s[1]) for s in series])
        lines.append(
            f"| {label} | "
            + " | ".join(f"{m:.1f} ± {sd:.1f}" for m, sd in cells)
            + f" | {shock[0]:.1f} ± {shock[1]:.1f} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict], stages_after: int, png: Path, delta0: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(range(stages_after + 2))
    labels = ["before", "swap"] + [f"+{k}" for k in range(1, stages_after + 1)]
    fig, (ax, kl_ax) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    for path, label, color in (
        ("direct", "direct swap", "tab:red"),
        ("stage0", "Stage-0 + swap", "tab:blue"),
    ):
        series = [[r[path]["before"], r[path]["after_swap"], *r[path]["after_stages"]] for r in runs]
        for s in series:
            ax.plot(x, [100 * v for v in s], color=color, alpha=0.25, lw=1)
        means = [100 * statistics.fmean(s[i] for s in series) for i in x]
        ax.plot(x, means, "-o", color=color, label=f"{label} (mean of {len(runs)} seeds)")
    ax.set_xticks(x, labels)
    ax.set_xlabel("before the swap, right after it, after k further TeamTR stages")
    ax.set_ylabel("held-out team accuracy (%)")
    ax.set_title("swap shock: one role replaced by another small model")
    ax.legend()
    for r in runs:  # Stage-0: monitored KL(newcomer || incumbent) per round
        kl_ax.plot(r["stage0"]["kl_history"], "-o", ms=3, label=f"seed {r['seed']}")
    kl_ax.axhline(delta0, color="k", ls="--", lw=1, label="delta0")
    kl_ax.set_yscale("log")
    kl_ax.set_xlabel("Stage-0 round")
    kl_ax.set_ylabel("monitored KL(newcomer || incumbent), nats / message")
    kl_ax.set_title("Stage-0 alignment")
    kl_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--stages-before", type=int, default=1)
    p.add_argument("--stages-after", type=int, default=2)
    p.add_argument("--role", default="adder2")
    p.add_argument("--probes", type=int, default=256)
    p.add_argument("--delta0", type=float, default=0.01)
    p.add_argument("--max-rounds", type=int, default=30)
    p.add_argument("--prompts", type=int, default=8, help="prompts per update (B)")
    p.add_argument("--group", type=int, default=8, help="episodes per prompt (G)")
    p.add_argument("--eval-episodes", type=int, default=128)
    p.add_argument("--max-operand", type=int, default=9, help="chain task operands 1..this (warm starts too)")
    p.add_argument(
        "--newcomer-separator",
        default=" + ",
        help="the default newcomer's message protocol ('+' = the team's own: no protocol mismatch)",
    )
    p.add_argument("--incumbent", default=None, help="team model dir (default: a cached warm start)")
    p.add_argument("--newcomer", default=None, help="newcomer model dir (default: a cached warm start)")
    p.add_argument("--out", default="benchmarks/results/swap_shock")
    p.add_argument(
        "--replot", action="store_true", help="only rebuild table and PNG from OUT/swap_shock.json"
    )
    args = p.parse_args()
    if args.replot:
        saved = json.loads((Path(args.out) / "swap_shock.json").read_text())
        (Path(args.out) / "swap_shock.md").write_text(table(saved["runs"], args.stages_after) + "\n")
        plot(saved["runs"], args.stages_after, Path(args.out) / "swap_shock.png", args.delta0)
        console.print(table(saved["runs"], args.stages_after))
        return

    import torch

    from teamtr.training.warmstart import WarmStartConfig, ensure_warm_model, load_report

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    incumbent = (
        Path(args.incumbent)
        if args.incumbent
        else ensure_warm_model(WarmStartConfig(max_operand=args.max_operand), progress=False)
    )
    newcomer = (
        Path(args.newcomer)
        if args.newcomer
        else ensure_warm_model(
            WarmStartConfig(
                max_operand=args.max_operand, message_separator=args.newcomer_separator, **NEWCOMER
            ),
            progress=False,
        )
    )
    args.incumbent_path = incumbent
    models = {}
    for name, path in (("incumbent", incumbent), ("newcomer", newcomer)):
        try:
            models[name] = {"path": str(path), "summary": load_report(path).summary()}
        except Exception:  # not a warm start (any model directory works), or an older report format
            models[name] = {"path": str(path)}
        console.print(f"{name}: {models[name]}")
    runs = [one_seed(seed, newcomer, args) for seed in range(args.seeds)]
    out = Path(args.out)
    md = table(runs, args.stages_after)
    (out / "swap_shock.md").write_text(md + "\n")
    (out / "swap_shock.json").write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "models": models,
                "runs": runs,
                "seconds": time.perf_counter() - t0,
            },
            indent=1,
        )
    )
    plot(runs, args.stages_after, out / "swap_shock.png", args.delta0)
    console.print(md)
    console.print(f"{out}/swap_shock.png, total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
