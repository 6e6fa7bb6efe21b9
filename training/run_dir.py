"""A training run directory, read one way by every command (train, serve, eval, swap, demo, report, adapters).

    RUN_DIR/config.yaml                    the run's TrainConfig (training/config.py)
    RUN_DIR/adapters/<adapter>/v<N>/       peft LoRA adapter of a role, one per accepted update (v0: start)
    RUN_DIR/metrics.jsonl, tensorboard/    training/metrics.py
    RUN_DIR/checkpoints/                   the resume checkpoint (training/checkpoint.py)

Adapter directories are named after the role's adapter (`Role.adapter`): the name the engine, the
checkpoint and the serving registry (serving/registry.py `version_dirs`) all key adapters by, so a team
whose role and adapter names differ is saved and served under the same name.

    run = RunDir("runs/demo/run")          # FileNotFoundError / RunDirError if it is not a readable run
    run.roles, run.task(), run.model_path(), run.latest_adapters()
    engine = run.engine()                  # every role's newest adapter loaded on its own base model
    team = run.team(run.roles, engine, temperature=0.0, name="eval")   # taking turns by team.router
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from teamtr.graphs.engine import DEFAULT_BASE
from teamtr.graphs.roles import Role, with_temperature
from teamtr.graphs.task import TaskFamily
from teamtr.graphs.team import Team, TeamError, load_router
from teamtr.serving.embedded import EmbeddedEngine, LoraSettings
from teamtr.serving.registry import version_dirs
from teamtr.serving.vllm_server import VLLMServerError
from teamtr.training.checkpoint import adapter_dir
from teamtr.training.config import TeamConfig, TrainConfig
from teamtr.training.metrics import read_metrics
from teamtr.training.user_graph import RoleGraphTeam, UserGraphError, check_order, data_family, load_object
from teamtr.training.vllm_rollouts import RolloutEngineError, VLLMRollouts, open_vllm_rollouts

CONFIG_FILE = "config.yaml"


class RunDirError(ValueError):
    """A user mistake about a run or its config (bad or old config, no adapters, unknown role): the CLI
    prints its message as one line, as it does FileNotFoundError (a path that is not a run)."""


def read_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """TrainConfig from a YAML file; a missing, malformed or other-version file is one line of error
    naming the file and the first offending field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        return TrainConfig.from_yaml(path, overrides)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        hint = (
            " (a config written by another version of teamtr?)" if first["type"] == "extra_forbidden" else ""
        )
        raise RunDirError(f"{path}: {field}: {first['msg']}{more}{hint}") from None
    except (ValueError, yaml.YAMLError) as e:  # not a mapping, a bad schedule block, a YAML syntax error
        raise RunDirError(f"{path}: {' '.join(str(e).split())}") from None


# ---- roles ------------------------------------------------------------------------------------------


def roles_from_factory(factory: str, options: dict[str, Any] | None = None) -> list[Role]:
    """`module:function` (called with `options`) -> the list of Role it returns."""
    try:  # as the config's other `module:function` keys: the working directory is searched too
        fn = load_object(factory, "roles")
    except UserGraphError as e:
        raise RunDirError(str(e).replace("'module:attribute'", "'module:function'")) from None
    roles = fn(**(options or {}))
    if not roles or not all(isinstance(r, Role) for r in roles):
        raise RunDirError(f"roles {factory!r} did not return a non-empty list of Role")
    return list(roles)


def with_bases(roles: list[Role], role_bases: dict[str, str]) -> list[Role]:
    """Roles with the base model a config names for them (team.role_bases), the others unchanged."""
    unknown = sorted(set(role_bases) - {r.name for r in roles})
    if unknown:
        raise RunDirError(f"team.role_bases names unknown roles {unknown}")
    return [dataclasses.replace(r, base_model=role_bases.get(r.name, r.base_model)) for r in roles]


def team_roles(cfg: TrainConfig) -> list[Role]:
    """The roles a config trains, on the bases it names: `team.roles` (`module:function`), or None for
    the task's own team (evals/runners.py `default_roles`: the chain adders, or generic solvers)."""
    from teamtr.evals.runners import default_roles

    if cfg.team.roles is None:
        # split's roles read private tables, which the trainer's rollouts do not pass
        if cfg.task.name == "split" and cfg.team.graph is None:
            raise RunDirError("task split: the trainer has no private per-role views; give team.roles")
        roles = default_roles(cfg.task.name, options=cfg.task.options, trainable=True)
    else:
        roles = roles_from_factory(cfg.team.roles)
    missing = [r.name for r in roles if r.adapter is None]
    if missing:
        raise RunDirError(f"roles {missing} have no LoRA adapter: nothing to train")
    adapters = [r.adapter for r in roles]
    if len(set(adapters)) != len(adapters):
        raise RunDirError(f"roles share adapters {adapters}: each trained role needs its own")
    try:  # a user graph's update order sigma (team.order); a Team's roles keep their turn order
        roles = check_order(cfg.team.order, roles)
    except UserGraphError as e:
        raise RunDirError(str(e)) from None
    return with_bases(roles, cfg.team.role_bases)


def team_options(team: TeamConfig) -> dict[str, Any]:
    """`Team` keyword arguments of the config's turn-taking (team.router, team.max_turns); {} when it names
    neither: round-robin. Every team of a run is built with them (`build_team`), so rollouts, evaluations,
    swap and serving take turns alike."""
    options: dict[str, Any] = {}
    if team.router is not None:
        try:
            options["router"] = load_router(team.router)
        except TeamError as e:
            raise RunDirError(f"team.router: {e}") from None
    if team.max_turns is not None:
        options["max_turns"] = team.max_turns
    return options


def build_team(
    team_cfg: TeamConfig,
    roles: list[Role],
    engine: Any,
    *,
    temperature: float | None = None,
    name: str = "team",
    options: dict[str, Any] | None = None,
) -> Team | RoleGraphTeam:
    """The run's team on `engine`: `roles` (at `temperature` unless None), taking turns as the config says
    (`options`: team_options(team_cfg), computed once by a caller that builds many), or the user's own
    graph over them when the config names one (team.graph: training/user_graph.py `graph_team`). A router
    that does not fit the roles (no declared destinations, an unknown role), or a graph factory that does
    not return a graph, is one RunDirError line."""
    if temperature is not None:
        roles = with_temperature(roles, temperature)
    if team_cfg.graph is not None:
        try:
            return RoleGraphTeam.from_engine(team_cfg, roles, engine, name=name)
        except UserGraphError as e:
            raise RunDirError(str(e)) from None
    options = team_options(team_cfg) if options is None else options
    try:
        return Team.from_engine(roles, engine, name=name, **options)
    except TeamError as e:
        if "router" not in options:
            raise
        raise RunDirError(f"team.router {team_cfg.router!r}: {e}") from None


def lora_settings(cfg: TrainConfig) -> LoraSettings:
    lora = LoraSettings(r=cfg.team.lora_rank, alpha=cfg.team.lora_alpha)
    if cfg.team.lora_targets:
        lora.target_modules = tuple(cfg.team.lora_targets)
    return lora


def model_path(cfg: TrainConfig, progress: bool = False) -> str:
    """The default base model: `team.model`, else the task's cached warm-started model built with
    `team.warm_start`'s overrides (built once)."""
    if cfg.team.model:
        return cfg.team.model
    from teamtr.training.warmstart import ensure_warm_model, warm_config_for

    return str(ensure_warm_model(warm_config_for(cfg.task.name, **cfg.team.warm_start), progress=progress))


# ---- the run directory ------------------------------------------------------------------------------


def versions_after_stage(run_dir: str | Path, stage_count: int) -> dict[str, int]:
    """adapter -> its version once `stage_count` stages were done (0: v0, the warm start), from the run's
    update records (training/metrics.py): a stage's rejected update leaves the version where it was."""
    finished = len(read_metrics(Path(run_dir), kind="stage"))
    if not 0 <= stage_count <= finished:
        raise RunDirError(
            f"{run_dir}: stage {stage_count} is not one of this run's 0..{finished} (0: the start)"
        )
    versions: dict[str, int] = {}
    for u in read_metrics(Path(run_dir), kind="update"):
        versions.setdefault(u["adapter"], 0)
        if u["stage"] < stage_count:
            versions[u["adapter"]] = u["version_after"]
    return versions


class RunDir:
    """An existing run directory: its config, roles, task, base models, adapter versions and engine."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():  # a path mistake: FileNotFoundError, as for any missing file
            raise FileNotFoundError(
                f"{self.path} is not a directory (want a run directory written by teamtr train)"
            )
        if not (self.path / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{self.path} is not a run directory (no {CONFIG_FILE})")
        self.config = read_config(self.path / CONFIG_FILE)
        from teamtr.evals.tasks import task_names

        if self.config.task.name not in task_names() and self.config.team.roles:
            _ = self.roles  # importing the roles' module may register the run's own task family
        if self.config.task.name not in task_names() and self.config.task.data is None:
            raise RunDirError(
                f"{self.path / CONFIG_FILE}: task.name: unknown task {self.config.task.name!r}; "
                f"known: {', '.join(task_names())}"
            )
        try:  # a router that cannot be imported fails when the run is opened, not at its first episode
            self.team_options = team_options(self.config.team)
        except RunDirError as e:
            raise RunDirError(f"{self.path / CONFIG_FILE}: {e}") from None

    @classmethod
    def create(cls, cfg: TrainConfig) -> RunDir:
        """The run directory of `cfg` (cfg.run_dir): made and given cfg's config.yaml, or, when it holds a
        run already, checked to hold this same config (a resume)."""
        path = Path(cfg.run_dir)
        path.mkdir(parents=True, exist_ok=True)
        saved = path / CONFIG_FILE
        if not saved.exists():
            cfg.to_yaml(saved)
        elif read_config(saved).to_dict() != cfg.to_dict():
            raise RunDirError(
                f"{path} holds a run with a different config ({saved}); resume it with that config or "
                "choose another run_dir"
            )
        return cls(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ---- what the config names --------------------------------------------------------------------
    @cached_property
    def roles(self) -> list[Role]:
        return team_roles(self.config)

    def role(self, name: str) -> Role:
        """A role by its name (or by its adapter's name)."""
        for r in self.roles:
            if name in (r.name, r.adapter):
                return r
        raise RunDirError(
            f"{self.path}: unknown role {name!r}; the team's roles are {[r.name for r in self.roles]}"
        )

    def team(
        self, roles: list[Role], engine: Any, *, temperature: float | None = None, name: str = "team"
    ) -> Team | RoleGraphTeam:
        """A team of `roles` on `engine` taking turns by the run's router, or the run's graph
        (`build_team`)."""
        return build_team(
            self.config.team, roles, engine, temperature=temperature, name=name, options=self.team_options
        )

    def task(self) -> TaskFamily:
        from teamtr.evals.tasks import get_task

        if self.config.task.data is not None:  # a user graph's own tasks (training/user_graph.py)
            try:
                return data_family(self.config.task.data, self.config.task.name)
            except UserGraphError as e:
                raise RunDirError(f"{self.path / CONFIG_FILE}: {e}") from None
        return get_task(self.config.task.name, **self.config.task.options)

    def lora(self) -> LoraSettings:
        return lora_settings(self.config)

    def model_path(self, progress: bool = False) -> str:
        return model_path(self.config, progress)

    def base_paths(self, roles: list[Role] | None = None) -> dict[str, str]:
        """Base name -> model directory of every base the roles sit on (the default base only when a role
        uses it: a fully swapped team needs none)."""
        roles = self.roles if roles is None else roles
        used = {r.base_model for r in roles}
        unknown = sorted(used - {DEFAULT_BASE, *self.config.team.bases})
        if unknown:
            raise RunDirError(
                f"{self.path / CONFIG_FILE}: roles sit on bases {unknown} that team.bases does not name"
            )
        default = {DEFAULT_BASE: self.model_path()} if DEFAULT_BASE in used else {}
        return {**default, **{b: p for b, p in self.config.team.bases.items() if b in used}}

    # ---- adapters ----------------------------------------------------------------------------------
    def adapter_dir(self, adapter: str, version: int) -> Path:
        return adapter_dir(self.path, adapter, version)

    def adapter_versions(self, adapter: str) -> list[tuple[int, Path]]:
        """(version, directory) of every saved version of `adapter`, oldest first."""
        return version_dirs(self.path, adapter)

    def stage_versions(self, stage: int | None) -> dict[str, int] | None:
        """The `version` argument of `latest_adapters` / `engine` for the adapters after `stage` stages
        (versions_after_stage); None (the newest) when no stage is given."""
        return None if stage is None else versions_after_stage(self.path, stage)

    def latest_adapters(
        self, version: int | dict[str, int] | None = None, roles: list[Role] | None = None
    ) -> dict[str, tuple[int, Path]]:
        """adapter -> (version, directory) for every role: the newest saved version, or `version` (one
        number for all, or adapter -> number)."""
        roles = self.roles if roles is None else roles
        out: dict[str, tuple[int, Path]] = {}
        missing = []
        for r in roles:
            if r.adapter is None or r.adapter in out:
                continue
            found = dict(self.adapter_versions(r.adapter))
            want = version.get(r.adapter) if isinstance(version, dict) else version
            if not found:
                missing.append(r.adapter)
            elif want is None:
                newest = max(found)
                out[r.adapter] = (newest, found[newest])
            elif want in found:
                out[r.adapter] = (want, found[want])
            else:
                raise RunDirError(
                    f"{self.path}: adapter {r.adapter!r} has no version {want} (has {sorted(found)})"
                )
        if missing:
            raise RunDirError(
                f"{self.path} has no saved adapters for {missing} (adapters/<adapter>/v<N>/): train it first"
            )
        return out

    # ---- the engine --------------------------------------------------------------------------------
    def engine(
        self,
        adapters: Literal["latest", "fresh"] = "latest",
        *,
        version: int | dict[str, int] | None = None,
        roles: list[Role] | None = None,
        extra_bases: dict[str, str] | None = None,
        threads: int | None = None,
    ) -> EmbeddedEngine:
        """An embedded engine with each role's adapter on its own base: the saved `latest` (or `version`)
        adapters, or `fresh` LoRA adapters made with the run's LoRA settings (seed torch first for a
        reproducible initialisation). `extra_bases` are loaded beside the run's (a swap's newcomer)."""
        roles = self.roles if roles is None else roles
        saved = self.latest_adapters(version, roles) if adapters == "latest" else {}
        engine = EmbeddedEngine(
            {**self.base_paths(roles), **(extra_bases or {})},
            lora=self.lora(),
            threads=self.config.torch_threads if threads is None else threads,
            device=self.config.team.device,
            dtype=self.config.team.dtype,
        )
        for r in roles:
            if r.adapter is None or r.adapter in engine.adapters(r.base_model):
                continue
            if adapters == "fresh":
                engine.add_adapter(r.adapter, base=r.base_model)
            else:
                version, path = saved[r.adapter]
                engine.load_adapter_sync(r.adapter, path, base=r.base_model)
                while engine.adapter_version(r.adapter, r.base_model) < version:  # episodes record vN
                    engine.commit_adapter_update(r.adapter, r.base_model)
        return engine

    def rollout_engine(
        self, trainer_engine: EmbeddedEngine, roles: list[Role] | None = None
    ) -> EmbeddedEngine | VLLMRollouts:
        """The engine the training team samples its rollouts through (`rollout.engine`): the trainer's
        own (`embedded`), or vLLM (`vllm`: the server at `rollout.vllm_url`, else one launched per base in
        the trainer's dtype; `close()` stops it), whose adapters the trainer pushes (training/llm_team.py)."""
        rollout = self.config.rollout
        if rollout.engine == "embedded":
            return trainer_engine
        roles = self.roles if roles is None else roles
        try:
            return open_vllm_rollouts(
                self.base_paths(roles),
                url=rollout.vllm_url,
                dtype=str(trainer_engine.dtype).removeprefix("torch."),
                lora_rank=self.config.team.lora_rank,
                adapters=len({r.adapter for r in roles if r.adapter is not None}),
                args=rollout.vllm_args,
                env=rollout.vllm_env,
                urls=rollout.vllm_urls,
                replicas=rollout.vllm_replicas,
                parallel=(rollout.vllm_tensor_parallel_size, rollout.vllm_pipeline_parallel_size),
                devices=rollout.vllm_replica_devices,
            )
        except (RolloutEngineError, VLLMServerError) as e:  # a bad URL, a server that would not start
            raise RunDirError(f"{self.path / CONFIG_FILE}: rollout.engine vllm: {e}") from None
