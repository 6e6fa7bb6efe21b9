"""Root command `teamtr swap RUN_DIR --role R --model PATH`: replace one role's model with Stage-0 alignment."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# training.swap (torch) is imported by the command when it runs: `teamtr --help` answers at once

app = typer.Typer()
console = Console()


class RichSwapProgress:
    """training/swap/config.py SwapProgress's hooks as a bar for the probe set, a bar for the Stage-0 rounds with the monitored KL against delta_0."""

    def __init__(self, progress: Progress) -> None:
        self.p = progress
        self.probe_bar = progress.add_task("probes", total=None)
        self.round_bar = progress.add_task("stage-0", total=None)

    def probes(self, done: int, total: int) -> None:
        self.p.update(self.probe_bar, total=total, completed=done, description=f"probes {done}/{total}")

    def round(self, k: int, rounds: int, kl: float, delta0: float) -> None:
        self.p.update(
            self.round_bar,
            total=rounds or 1,
            completed=min(k, rounds or 1),
            description=f"stage-0 KL(new||inc) {kl:.4f} / delta0 {delta0:g}",
        )

    def message(self, text: str) -> None:
        self.p.console.print(text)


@app.command()
def swap(
    run_dir: Path = typer.Argument(..., help="a TeamTR run directory (stopped at a stage boundary)"),
    role: str = typer.Option(..., help="the role whose model is replaced"),
    model: Path = typer.Option(..., help="the newcomer: a model directory with its own tokenizer"),
    out: Path | None = typer.Option(None, help="new run directory (default RUN_DIR-swap-ROLE)"),
    probes: int = typer.Option(500, help="contexts at the role's turns, from the current team's episodes"),
    delta0: float = typer.Option(
        0.01, help="stop Stage-0 when the monitored KL(newcomer||incumbent) <= this"
    ),
    align: bool = typer.Option(True, help="--no-align: a direct swap without Stage-0"),
    target: str = typer.Option(
        "incumbent", help="incumbent, or mixture (geometric mixture with the newcomer)"
    ),
    mixture_lambda: float = typer.Option(4.0, help="lambda of the mixture target"),
    divergence: str = typer.Option("auto", help="auto, token (same tokenizer) or text"),
    lr: float = typer.Option(3e-3, help="AdamW learning rate of the newcomer's LoRA adapter"),
    final_lr_ratio: float = typer.Option(0.1, help="the learning rate decays linearly to lr * this"),
    max_rounds: int = typer.Option(30, help="Stage-0 rounds at most (sample, monitor, train)"),
    epochs: int = typer.Option(4, help="passes of minibatches over each round's samples"),
    unify_epochs: int = typer.Option(
        0, help="protocol unification first: passes of cross-entropy on the incumbent's messages (0 = off)"
    ),
    extra_stages: int = typer.Option(3, help="TeamTR stages the new run has left to train"),
    seed: int = typer.Option(0, help="seed of Stage-0 sampling and the newcomer's LoRA init"),
    json_out: bool = typer.Option(False, "--json", help="print the result as JSON only"),
) -> None:
    """Replace role R's model by a newcomer, aligned to the incumbent first (Stage-0); then `teamtr train
    NEW_RUN_DIR/config.yaml` continues TeamTR with the trust-region and certificate bookkeeping."""
    from teamtr.training.run_dir import RunDir
    from teamtr.training.swap import SwapConfig, swap_role

    RunDir(run_dir)  # a clear error before any progress bar if it is not a readable run
    if target not in ("incumbent", "mixture"):
        raise typer.BadParameter("--target must be incumbent or mixture")
    if divergence not in ("auto", "token", "text"):
        raise typer.BadParameter("--divergence must be auto, token or text")
    try:
        cfg = SwapConfig(
            role=role,
            model=str(model),
            out=str(out) if out else None,
            probes=probes,
            delta0=delta0,
            align=align,
            target=target,  # type: ignore[arg-type]
            mixture_lambda=mixture_lambda,
            divergence=divergence,  # type: ignore[arg-type]
            lr=lr,
            final_lr_ratio=final_lr_ratio,
            max_rounds=max_rounds,
            epochs=epochs,
            unify_epochs=unify_epochs,
            extra_stages=extra_stages,
            seed=seed,
        )
        if json_out:
            result = swap_role(run_dir, cfg)
        else:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                result = swap_role(run_dir, cfg, RichSwapProgress(progress))
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        raise typer.BadParameter(str(e)) from e
    if json_out:
        print(json.dumps(result.to_dict()))
        return
    verdict = "[green]within delta0[/]" if result.converged else "[yellow]NOT within delta0[/]"
    console.print(
        f"role {result.role} -> base {result.base_name} ({result.divergence} divergence): monitored KL "
        f"{result.kl_history[0]:.4f} -> {result.kl_final:.4f} {verdict} in {result.rounds} rounds; held-out "
        f"return {result.eval_before:.3f} (incumbent) -> {result.eval_after:.3f} (newcomer)"
    )
    console.print(
        f"new run directory: {result.out_dir}; continue with: teamtr train {result.out_dir}/config.yaml"
    )
