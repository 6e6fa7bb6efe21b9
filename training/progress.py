"""Progress hooks of a training run: `TrainingProgress` (no-ops) and `RichCallbacks`, the rich progress bars
and the one line per update that `teamtr train` and `teamtr demo` print."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class TrainingProgress:
    """Hooks called by the trainer; all no-ops."""

    def stage_start(self, stage: int, stages: int, order: list[str]) -> None: ...
    def rollout(self, stage: int, team_index: int, episodes: int) -> None: ...
    def epoch(self, role: str, epoch: int, epochs: int, d_hat: float) -> None: ...
    def update(self, record: dict[str, Any]) -> None: ...
    def evaluation(self, label: str, result: dict[str, Any]) -> None: ...


def update_line(r: dict[str, Any]) -> str:
    """One concise line per update: role, reward, d_hat/delta, accepted or not, certificate term."""
    verdict = "[green]accepted[/]" if r["accepted"] else "[red]rejected[/]"
    back = f" ({r['backtracks']} backtracks)" if r["backtracks"] else ""
    gap = f" stale-gap {r['stale_gap']:.3f}" if r.get("stale_gap") is not None else ""
    ess = f" ESS/B {r['ess']:.2f}" if r.get("ess") is not None else ""
    c = r["certificate"]
    # the held-out form that applies when the monitor sampled held-out episodes, else the proxy term
    cert = (
        f"cert {c['heldout']:+.4f} ({c['form']})"
        if c.get("heldout") is not None
        else f"cert {c['value']:+.3f} (proxy)"
    )
    return (
        f"stage {r['stage']} update {r['index']} [bold]{r['role']}[/] reward {r['reward']:.3f} "
        f"d_hat {r['d_hat']:.4f}/{r['delta']:g} {verdict}{back} L_hat {r['certificate']['surrogate']:+.4f} "
        f"{cert}{gap}{ess}"
    )


class RichCallbacks(TrainingProgress):
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
        console=Console(),
    )
