"""`teamtr improve`: fine-tune the served team in place (training/improve/, docs/improve.md).

    teamtr improve RUN_DIR --url http://127.0.0.1:8000 --admin-key KEY --team chain --last 200

trains TeamTR on the prompts of the team's served episodes from the versions it serves now, gates the
candidate on held-out recent prompts, canaries it on a share of live episodes, then promotes every
role at once or rolls back. Rerun after a kill: it continues the unfinished attempt (`--abandon` drops
its candidate instead).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from teamtr.cli.train import _overrides
from teamtr.serving.admin_client import DEFAULT_URL
from teamtr.training.improve.canary import CanaryConfig
from teamtr.training.improve.gate import GateConfig
from teamtr.training.improve.loop import ImproveConfig, ImproveLoop

app = typer.Typer()
console = Console(stderr=True)


@app.command()
def improve(
    run_dir: Path = typer.Argument(..., help="the served run directory (roles, config, base model)"),
    url: str = typer.Option(DEFAULT_URL, envvar="TEAMTR_URL", help="the running server"),
    admin_key: str = typer.Option(None, envvar="TEAMTR_ADMIN_KEY", help="the server's admin key"),
    team: str = typer.Option(None, help="the served team (default: the run directory's name)"),
    work_dir: Path = typer.Option(None, help="state, improve runs, promotion log (default RUN_DIR/improve)"),
    traces: Path = typer.Option(None, help="read served episodes from this traces.db instead of the API"),
    last: int = typer.Option(None, help="learn from the newest N served episodes"),
    since_s: float = typer.Option(None, help="... or from those of the last S seconds"),
    held_out: float = typer.Option(0.25, help="share of the newest distinct prompts held out for the gate"),
    reward: str = typer.Option("verifier", help="verifier | verifier:TASK | module:function(prompt, response)"),
    canary_reward: str = typer.Option("reward", help="reward (the same, on served answers) | feedback"),
    stages: int = typer.Option(2, help="TeamTR stages of the improve run"),
    set_: list[str] = typer.Option([], "--set", help="improve run setting, e.g. --set optim.lr=1e-3"),
    margin: float = typer.Option(0.05, help="gate: the candidate may be this much worse in mean reward ..."),
    confidence: float = typer.Option(0.9, help="... at this confidence (paired bootstrap)"),
    kl_limit: float = typer.Option(None, help="gate: per-role KL to the incumbent (default delta x stages)"),
    canary_share: float = typer.Option(0.5, help="share of new episodes the candidate serves"),
    canary_episodes: int = typer.Option(16, help="canary episodes before deciding"),
    canary_margin: float = typer.Option(0.1, help="canary may trail the incumbent's mean reward by this"),
    canary_timeout: float = typer.Option(600.0, help="seconds without a decision: roll back"),
    threads: int = typer.Option(1, help="torch threads"),
    abandon: bool = typer.Option(False, help="drop the unfinished attempt's candidate; the incumbent serves"),
) -> None:
    """Fine-tune the served team on its traffic: train, gate, canary, then promote atomically or roll back."""
    cfg = ImproveConfig(
        run_dir=str(run_dir),
        work_dir=str(work_dir or run_dir / "improve"),
        team=team or run_dir.resolve().name,
        url=url,
        admin_key=admin_key,
        traces=str(traces) if traces else None,
        last=last,
        since_s=since_s,
        held_out_fraction=held_out,
        reward=reward,
        canary_reward=canary_reward,
        train={"stages": stages, "torch_threads": threads, **_overrides(set_)},
        gate=GateConfig(margin=margin, confidence=confidence, kl_limit=kl_limit),
        canary=CanaryConfig(
            share=canary_share, episodes=canary_episodes, margin=canary_margin, timeout_s=canary_timeout
        ),
        threads=threads,
    )
    state = ImproveLoop(cfg, say=console.print).run(abandon=abandon)
    outcome = state.get("outcome") or state.get("decision") or "nothing done"
    typer.echo(f"{outcome}")
