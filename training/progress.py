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
    def reverted(self, stage: int, best_stage: int, result: dict[str, Any], best: dict[str, Any]) -> None: ...


def update_line(r: dict[str, Any]) -> str:
    """One concise line per update: role, reward, d_hat/delta, accepted or not, certificate term."""
    if r.get("no_signal"):  # every advantage 0 (no reward spread in any group): nothing was tried
        verdict = "[yellow]skipped (no signal)[/]"
    else:
        verdict = "[green]accepted[/]" if r["accepted"] else "[red]rejected[/]"
    back = f" ({r['backtracks']} backtracks)" if r["backtracks"] else ""
    if r.get("stop") == "extrapolated" and r.get("extrapolate_scale"):  # the step's length set by the KL
        back += f" (extrapolated x{r['extrapolate_scale']:.0f})"
    # the evidence an update rests on: groups (prompts) whose episodes did not all score alike
    groups = r.get("signal_groups")
    shown = groups is not None and not r.get("no_signal")  # skipped: the role's own advantages were all 0
    spread = f" on {groups} group{'s' * (groups != 1)} with spread" if shown else ""
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
        f"stage {r['stage']} update {r['index']} [bold]{r['role']}[/] reward {r['reward']:.3f}{spread} "
        f"d_hat {r['d_hat']:.4f}/{r['delta']:g} {verdict}{back} L_hat {r['certificate']['surrogate']:+.4f} "
        f"{cert}{gap}{ess}"
    )


# how many updates from the start of a run must all be without signal before the run warns
NO_SIGNAL_WARN_AFTER = 2


# where both no-learning warnings send a user: settings measured to learn on the default base
RECIPE_HINT = "A recipe that learns on SmolLM2: examples/word_problems.yaml (docs/graphs.md)."


def no_signal_warning(records: list[dict[str, Any]], temperature: float | None = None) -> str | None:
    """The warning a run prints once when its first NO_SIGNAL_WARN_AFTER updates all had no reward
    spread (every episode of each prompt scored the same, so every advantage was 0 and nothing trained),
    naming the likely causes; None otherwise."""
    first = records[:NO_SIGNAL_WARN_AFTER]
    if len(first) < NO_SIGNAL_WARN_AFTER or not all(r.get("no_signal") for r in first):
        return None
    reward = sum(r["reward"] for r in first) / len(first)
    temp = f"rollout.temperature is {temperature:g}: " if temperature is not None else ""
    if reward <= 0:
        level = "every episode scored 0"
    elif reward >= 1:
        level = "every episode scored 1 (the task is too easy to learn from)"
    else:
        level = f"each prompt's episodes all scored alike (mean reward {reward:.3f})"
    return (
        f"warning: the first {len(first)} updates had no reward spread ({level}), so nothing was trained. "
        f"Likely causes: the sampling temperature ({temp}a small base answers wrong every time at 1.0; "
        "try 0.3-0.7), or a task too hard for the base model (check its greedy score: teamtr eval RUN_DIR "
        "--stage 0; use easier tasks), or a reward that never varies (team.reward). Larger groups "
        f"(rollout.group_size) make a spread more likely. {RECIPE_HINT}"
    )


# how many trained updates from the start of a run must all end short of the region before the run warns,
# and what "short" is (of delta): on SmolLM2 such steps (RAdam at lr 2e-3, d_hat 0.011 of 0.3, extrapolated
# to its cap) left the greedy answers as they were (benchmarks/results/word_problems_smollm2/README.md)
SHORT_STEP_WARN_AFTER = 2
SHORT_STEP_FRACTION = 0.1


def short_step_warning(records: list[dict[str, Any]]) -> str | None:
    """The warning a run prints once when its first SHORT_STEP_WARN_AFTER trained updates all ended below
    SHORT_STEP_FRACTION of their trust region (the optimiser's steps, extrapolation included, too short to
    change what the role says), naming the settings that lengthen them; None otherwise."""
    trained = [r for r in records if r["accepted"] and not r.get("no_signal")][:SHORT_STEP_WARN_AFTER]
    if len(trained) < SHORT_STEP_WARN_AFTER or any(
        r["d_hat"] >= SHORT_STEP_FRACTION * r["delta"] for r in trained
    ):
        return None
    reached = ", ".join(f"{r['d_hat']:.4f} of {r['delta']:g}" for r in trained)
    return (
        f"warning: the first {len(trained)} trained updates moved their role by a small part of the trust "
        f"region ({reached}): steps this short rarely change what a role says. Lengthen them: a larger "
        "optim.lr (RAdam's first steps are short; 1e-2 on SmolLM2 with LoRA), steps over the whole batch "
        "(optim.minibatch_messages as large as a role's messages per update), or "
        f"trust_region.extrapolate_rounds 2-3 (the KL then sets the length). {RECIPE_HINT}"
    )


def trained_updates(records: list[dict[str, Any]]) -> dict[str, int]:
    """Updates by outcome: trained (accepted), rejected by the trust region, skipped (no signal)."""
    skipped = sum(bool(r.get("no_signal")) for r in records)
    trained = sum(bool(r["accepted"]) and not r.get("no_signal") for r in records)
    return {
        "updates_trained": trained,
        "updates_rejected": len(records) - trained - skipped,
        "updates_skipped_no_signal": skipped,
    }


class RichCallbacks(TrainingProgress):
    """Progress bars for stage, role, rollouts and epochs; one printed line per update, and a warning
    (once each) when the run's first updates have no reward spread (`no_signal_warning`) or train with
    steps far short of the region (`short_step_warning`)."""

    def __init__(self, progress: Progress, roles_per_stage: int, temperature: float | None = None) -> None:
        self.p = progress
        self.roles_per_stage = roles_per_stage
        self.temperature = temperature
        self.records: list[dict[str, Any]] = []
        self.warned_short = False
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
        self.records.append(record)
        if len(self.records) == NO_SIGNAL_WARN_AFTER:
            warning = no_signal_warning(self.records, self.temperature)
            if warning:
                self.p.console.print(f"[bold yellow]{warning}[/]")
        if not self.warned_short:
            warning = short_step_warning(self.records)
            if warning:
                self.warned_short = True
                self.p.console.print(f"[bold yellow]{warning}[/]")

    def evaluation(self, label: str, result: dict[str, Any]) -> None:
        self.p.console.print(
            f"held-out return {label}: {result['accuracy']:.3f} ({result['episodes']} episodes)"
        )

    def reverted(self, stage: int, best_stage: int, result: dict[str, Any], best: dict[str, Any]) -> None:
        self.p.console.print(
            f"[yellow]stage {stage} undone[/]: held-out {result['accuracy']:.3f} is below stage {best_stage}'s "
            f"{best['accuracy']:.3f} beyond noise; the next stage starts from stage {best_stage}'s weights"
        )


def progress_bars() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(),
    )
