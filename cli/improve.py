"""`teamtr improve`: fine-tune the served team in place (improve/, docs/improve.md).

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
from teamtr.client.admin_client import DEFAULT_URL

app = typer.Typer()
console = Console(stderr=True)


@app.command()
def improve(
    run_dir: Path = typer.Argument(..., help="the served run directory (roles, config, base model)"),
    url: str = typer.Option(DEFAULT_URL, envvar="TEAMTR_URL", help="the running server"),
    admin_key: str = typer.Option(None, envvar="TEAMTR_ADMIN_KEY", help="the server's admin key"),
    team: str = typer.Option(None, help="the served team (default: the run directory's name)"),
    work_dir: Path = typer.Option(None, help="state, improve runs, promotion log (default RUN_DIR/improve)"),
    # a str, not a Path: a postgresql:// URL (the replicas' shared store) must keep its double slash
    traces: str = typer.Option(
        None, help="read served episodes from this traces.db or postgresql:// store instead of the API"
    ),
    last: int = typer.Option(None, help="learn from the newest N served episodes"),
    since_s: float = typer.Option(None, help="... or from those of the last S seconds"),
    held_out: float = typer.Option(0.5, help="share of the newest distinct prompts held out for the gate"),
    reward: str = typer.Option(
        "verifier",
        help="training reward: verifier | verifier:TASK | module:function(prompt, response) | judge:FILE "
        "(an LLM judge) | feedback (served exploratory episodes' /v1/feedback alone)",
    ),
    train_on_feedback: bool = typer.Option(False, help="also train on the feedback of exploratory episodes"),
    feedback_cap: float = typer.Option(1.0, help="truncation of the feedback episodes' importance weights"),
    judge_model: str = typer.Option(None, help="judge:FILE: the judge model (default: the run's base model)"),
    judge_url: str = typer.Option(None, help="judge:FILE: a vLLM server serving the judge model"),
    gate_judge: str = typer.Option(
        "auto", help="scores the gate: auto (a verifier not trained on) | verifier[:TASK] | module:function"
    ),
    canary_judge: str = typer.Option(
        "auto", help="scores the canary: auto (feedback if any, else the gate's) | feedback | ..."
    ),
    allow_training_reward_judge: bool = typer.Option(
        False, help="let the training reward judge gate / canary when nothing independent can"
    ),
    stages: int = typer.Option(2, help="TeamTR stages of the improve run"),
    set_: list[str] = typer.Option([], "--set", help="improve run setting, e.g. --set optim.lr=1e-3"),
    confidence: float = typer.Option(0.95, help="gate: one-sided confidence that the candidate is better"),
    non_inferiority: float = typer.Option(
        None, help="gate: pass a candidate not worse than this margin (instead of shown better)"
    ),
    kl_limit: float = typer.Option(
        None, help="gate: per-role KL to the incumbent (default delta x stages^2: the trust region's reach)"
    ),
    canary_share: float = typer.Option(0.5, help="share of new episodes the candidate serves"),
    canary_episodes: int = typer.Option(1000, help="canary: the cap, in pairs; not shown better by then: roll back"),
    canary_min_episodes: int = typer.Option(0, help="canary: episodes before its first look"),
    canary_confidence: float = typer.Option(0.95, help="canary: two-sided confidence of its sequential test"),
    canary_non_inferiority: float = typer.Option(
        None, help="canary: promote a candidate not worse than this margin (instead of shown better)"
    ),
    canary_timeout: float = typer.Option(3600.0, help="seconds without a decision: roll back"),
    threads: int = typer.Option(1, help="torch threads"),
    abandon: bool = typer.Option(False, help="drop the unfinished attempt's candidate; the incumbent serves"),
    watch: bool = typer.Option(False, help="run rounds continuously as traffic and feedback arrive"),
    watch_episodes: int = typer.Option(200, help="--watch: new served episodes that start a round ..."),
    watch_feedback: int = typer.Option(50, help="... or new episodes with feedback"),
    watch_poll: float = typer.Option(30.0, help="--watch: seconds between looks at the traffic"),
    watch_backoff: float = typer.Option(600.0, help="--watch: wait after a setback (doubles per setback)"),
    watch_max_backoff: float = typer.Option(6 * 3600.0, help="--watch: the longest wait after setbacks"),
    watch_rounds: int = typer.Option(None, help="--watch: stop after this many rounds"),
) -> None:
    """Fine-tune the served team on its traffic: train, gate, canary, then promote atomically or roll back."""
    from teamtr.improve.canary import CanaryConfig
    from teamtr.improve.gate import GateConfig
    from teamtr.improve.loop import LOG_FILE, ImproveConfig, ImproveLoop
    from teamtr.improve.timeline import write_timeline
    from teamtr.improve.watch import Watch, WatchConfig

    cfg = ImproveConfig(
        run_dir=str(run_dir),
        work_dir=str(work_dir or run_dir / "improve"),
        team=team or run_dir.resolve().name,
        url=url,
        admin_key=admin_key,
        traces=traces or None,
        last=last,
        since_s=since_s,
        held_out_fraction=held_out,
        reward=reward,
        train_on_feedback=train_on_feedback,
        feedback_cap=feedback_cap,
        judge_model=judge_model,
        judge_url=judge_url,
        gate_judge=gate_judge,
        canary_judge=canary_judge,
        allow_training_reward_judge=allow_training_reward_judge,
        train={"stages": stages, "torch_threads": threads, **_overrides(set_)},
        gate=GateConfig(confidence=confidence, non_inferiority=non_inferiority, kl_limit=kl_limit),
        canary=CanaryConfig(
            share=canary_share,
            max_episodes=canary_episodes,
            min_episodes=canary_min_episodes,
            confidence=canary_confidence,
            non_inferiority=canary_non_inferiority,
            timeout_s=canary_timeout,
        ),
        threads=threads,
    )
    loop = ImproveLoop(cfg, say=console.print)
    if watch and not abandon:
        wcfg = WatchConfig(
            new_episodes=watch_episodes,
            new_feedback=watch_feedback,
            poll_s=watch_poll,
            backoff_s=watch_backoff,
            max_backoff_s=watch_max_backoff,
            rounds=watch_rounds,
        )
        typer.echo(" ".join(Watch(loop, wcfg).run()))
        return
    state = loop.run(abandon=abandon)
    if (loop.work / LOG_FILE).is_file():
        write_timeline(loop.work / LOG_FILE, loop.work / "timeline.png")
    outcome = state.get("outcome") or state.get("decision") or "nothing done"
    typer.echo(f"{outcome}")
