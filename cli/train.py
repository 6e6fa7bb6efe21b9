"""Root commands `teamtr train CONFIG`, `teamtr report RUN_DIR...` and `teamtr demo`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from teamtr.training.run_dir import RunDir, read_config
from teamtr.training.trainer import Callbacks

app = typer.Typer()
console = Console()


def update_line(r: dict[str, Any]) -> str:
    """One concise line per update: role, reward, d_hat/delta, accepted or not, certificate term."""
    verdict = "[green]accepted[/]" if r["accepted"] else "[red]rejected[/]"
    back = f" ({r['backtracks']} backtracks)" if r["backtracks"] else ""
    gap = f" stale-gap {r['stale_gap']:.3f}" if r.get("stale_gap") is not None else ""
    ess = f" ESS/B {r['ess']:.2f}" if r.get("ess") is not None else ""
    return (
        f"stage {r['stage']} update {r['index']} [bold]{r['role']}[/] reward {r['reward']:.3f} "
        f"d_hat {r['d_hat']:.4f}/{r['delta']:g} {verdict}{back} L_hat {r['certificate']['surrogate']:+.4f} "
        f"cert {r['certificate']['value']:+.3f}{gap}{ess}"
    )


class RichCallbacks(Callbacks):
    """Progress bars for stage, role, rollouts and epochs; one printed line per update."""

    def __init__(self, progress: Progress, roles_per_stage: int) -> None:
        self.p = progress
        self.roles_per_stage = roles_per_stage
        self.stage_bar = progress.add_task("stages", total=None)
        self.role_bar = progress.add_task("roles", total=roles_per_stage)
        self.rollout_bar = progress.add_task("rollouts", total=None)
        self.epoch_bar = progress.add_task("epochs", total=None)

    def stage_start(self, stage: int, stages: int, order: list[str]) -> None:
        self.p.update(
            self.stage_bar, total=stages, completed=stage, description=f"stage {stage + 1}/{stages}"
        )
        self.p.update(self.role_bar, total=len(order), completed=0, description="roles")

    def rollout(self, stage: int, team_index: int, episodes: int) -> None:
        self.p.update(
            self.rollout_bar, advance=1, description=f"rollouts ({episodes} episodes of pi^{team_index})"
        )

    def epoch(self, role: str, epoch: int, epochs: int, d_hat: float) -> None:
        self.p.update(
            self.epoch_bar, total=epochs, completed=epoch, description=f"epochs {role} d_hat {d_hat:.4f}"
        )

    def update(self, record: dict[str, Any]) -> None:
        self.p.update(self.role_bar, advance=1, description=f"roles (last: {record['role']})")
        self.p.console.print(update_line(record))

    def evaluation(self, label: str, result: dict[str, Any]) -> None:
        self.p.console.print(
            f"held-out return {label}: {result['accuracy']:.3f} ({result['episodes']} episodes)"
        )


def progress_bars() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def _overrides(pairs: list[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise typer.BadParameter(f"--set expects key=value, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


@app.command()
def train(
    config: Path = typer.Argument(..., help="YAML config (see examples/)"),
    run_dir: str | None = typer.Option(None, help="override run_dir"),
    set_: list[str] = typer.Option([], "--set", help="override a field, e.g. --set optim.lr=1e-3"),
) -> None:
    """Fine-tune every role of a team with TeamTR (or a baseline schedule); resumes an interrupted run."""
    from teamtr.training.trainer import Trainer

    overrides = _overrides(set_)
    if run_dir:
        overrides["run_dir"] = run_dir
    cfg = read_config(config, overrides)  # one line of error naming the file and field if it is bad
    with progress_bars() as progress:
        summary = Trainer(cfg, RichCallbacks(progress, roles_per_stage=0)).train()
    console.print_json(json.dumps(summary))
    console.print(f"run directory: {cfg.run_dir} (metrics.jsonl, tensorboard/, adapters/<adapter>/v<N>/)")


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="one or more run directories (plots overlay them)"),
    out: Path | None = typer.Option(None, help="where the PNGs go (default RUN_DIR/report)"),
) -> None:
    """PNG plots: return per stage, d_hat per update vs delta, certificate vs improvement, stale gap."""
    from teamtr.training.report import write_report

    runs = [RunDir(d) for d in run_dirs]  # a clear error for a path that is not a run
    paths = write_report([r.path for r in runs], out)
    for p in paths:
        console.print(str(p))


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), help="output directory"),
    compare: bool = typer.Option(False, help="warm start vs TeamTR vs naive over several seeds"),
    seeds: int = typer.Option(3, help="seeds for --compare"),
    config: Path | None = typer.Option(None, help="a config to start from instead of the demo's"),
) -> None:
    """Warm-started small team -> evaluation -> TeamTR -> evaluation -> report (summary.json)."""
    from teamtr.training.demo import run_compare, run_demo

    if compare:
        run_compare(out, seeds=seeds, base_config=config, console=console)
    else:
        run_demo(out, base_config=config, console=console)
