"""The team `teamtr eval` scores: `load_eval_team(source, task)` from `warm` (the cached warm-started model
of the task's family, built on first use; a real benchmark uses the chain demo model), a model directory
(`config.json`: every role speaks with that model) or a run directory (training/run_dir.py `RunDir`: its
roles, bases and the newest adapter version of each role, or those after a stage). A run of a user's own
graph (team.graph) is evaluated by evals/graph_eval.py instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine and the run directory (torch) are imported when a team is loaded
    from teamtr.engines.embedded import EmbeddedEngine
    from teamtr.graphs.roles import Role


@dataclass
class EvalTeam:
    """A team ready to answer: its engine (every adapter loaded), its roles, and where they came from."""

    engine: EmbeddedEngine
    roles: list[Role]
    source: str
    bases: dict[str, str] = field(default_factory=dict)  # base name -> model directory
    adapters: dict[str, Path] = field(default_factory=dict)  # adapter -> the saved version loaded
    team_options: dict[str, Any] = field(default_factory=dict)  # a run's router / max_turns (RunDir)


def load_eval_team(
    source: str, task: str, n_roles: int = 3, threads: int | None = 1, stage: int | None = None
) -> EvalTeam:
    """`warm`, a model directory or a run directory -> the team to evaluate (one-line errors otherwise); a
    run's newest adapters, or those after `stage` of its stages."""
    if stage is not None and (source == "warm" or not (Path(source) / "config.yaml").is_file()):
        raise ValueError(f"--stage {stage} needs a run directory, not {source}")
    if source == "warm":
        from teamtr.tasks.roles import default_roles  # a generic team
        from teamtr.training.warmstart import ensure_warm_model, warm_config_for

        # this family's warm model (a benchmark's: the chain demo model)
        base = str(ensure_warm_model(warm_config_for(task)))
        return untrained_team(base, default_roles(task, n_roles), "warm", threads)
    path = Path(source)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory (want a model or run directory, or 'warm')")
    if (path / "config.yaml").is_file():
        from teamtr.training.run_dir import RunDir

        run = RunDir(path)
        if run.config.team.graph is not None:  # a graph run: evals/graph_eval.py builds its team
            raise ValueError(
                f"{path} trains the graph {run.config.team.graph}: load_eval_team builds Team-shaped teams; "
                "evals/graph_eval.py evaluates graph runs"
            )
        versions = run.stage_versions(stage)
        adapters = {a: d for a, (_, d) in run.saved_adapters(versions).items()}
        engine = run.engine(version=versions, threads=threads)
        return EvalTeam(engine, run.roles, f"run {path}", run.base_paths(), adapters, run.team_options)
    if (path / "config.json").is_file():
        from teamtr.tasks.roles import default_roles

        return untrained_team(str(path), default_roles(task, n_roles), f"model {path}", threads)
    raise FileNotFoundError(
        f"{path}: neither a run directory (config.yaml) nor a model directory (config.json)"
    )


def untrained_team(model: str, roles: list[Role], source: str, threads: int | None) -> EvalTeam:
    """Every role on one model; a role with an adapter gets a fresh one (B = 0: the model itself)."""
    from teamtr.engines.open import EngineSpec, open_engine
    from teamtr.graphs.engine import DEFAULT_BASE

    engine = open_engine(EngineSpec(bases={DEFAULT_BASE: model}, threads=threads)).engine
    for r in roles:
        if r.adapter:
            engine.add_adapter(r.adapter)
    return EvalTeam(engine, roles, source, {"base": model})
