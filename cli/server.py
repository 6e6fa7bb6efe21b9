"""What `teamtr serve` serves and how it is built: `ServeConfig` and `build_server` (docs/serving.md).

It wires training's run directories (training/run_dir.py `RunDir`: roles, bases, base model, the newest
`adapters/<adapter>/v<N>/` of each role) into serving (engine, adapter registry, teams, tracer, app),
which is why it lives in cli/ (the only layer above both); cli/serve.py holds the commands.

`serve RUN_DIR` serves one run (`ServeConfig.from_run_dir`); `serve CONFIG.yaml` takes a `ServeConfig`
(several teams, keys, tracing), e.g.:

    model: runs/demo/model            # base model directory (omit: the first run's, else the demo model)
    teams:
      chain:
        run_dir: runs/demo/run        # roles, bases and newest adapters of this run
      duo:                            # a second team on the same engine, sharing adapters
        roles: teamtr.graphs.chain_team:chain_roles
        options: {steps: 2}
        run_dir: runs/demo/run
    admin_key: change-me
    api_keys: [sk-team-1]
    tracing: {sqlite_path: traces.db, otlp_endpoint: http://127.0.0.1:6006/v1/traces}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from teamtr.graphs.engine import DEFAULT_BASE
from teamtr.graphs.roles import Role, with_temperature
from teamtr.graphs.team import Team
from teamtr.serving.app import ServedTeam, ServeSettings, TeamPolicy, create_app
from teamtr.serving.conversations import Conversations
from teamtr.serving.models import resolve_model
from teamtr.serving.registry import AdapterRegistry
from teamtr.serving.tracing import TeamTracer, TracingConfig, build_tracer_provider
from teamtr.training.config import TeamConfig
from teamtr.training.run_dir import (
    RunDir,
    RunDirError,
    build_team,
    read_config,
    roles_from_factory,
    with_bases,
)
from teamtr.training.user_graph import RoleGraphTeam

CHAIN_ROLES = "teamtr.graphs.chain_team:chain_roles"  # a served team without roles or run: the demo team
CONVERSATIONS_DB = "conversations.db"  # under the run directory / the config's folder


class ServedTeamConfig(BaseModel):
    """One served team of a ServeConfig."""

    model_config = ConfigDict(extra="forbid")

    # `module:function` returning list[Role]; None: the run's roles (run_dir), else the chain demo team
    roles: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)  # keyword arguments of that function
    # `module:function`: who speaks next (graphs/team.py routers); None: the run's team.router, else
    # round-robin. max_turns likewise (None: the run's, else graphs/team.py's default)
    router: str | None = None
    max_turns: int | None = Field(None, ge=1)
    role_bases: dict[str, str] = Field(default_factory=dict)  # role -> base model name (over the run's)
    run_dir: str | None = None  # a training run: the newest adapters/<adapter>/v<N>/ of each role is served
    stage: int | None = Field(None, ge=0)  # ... or those after this many of its stages (0: the start)
    adapters: dict[str, str] = Field(default_factory=dict)  # adapter -> peft dir (overrides run_dir)
    temperature: float | None = Field(0.0, ge=0)  # every role samples at this temperature; None: as declared
    # role -> {temperature|top_p|max_tokens|stop: value}: what a request cannot override (docs/serving.md)
    pinned: dict[str, dict[str, Any]] = Field(default_factory=dict)
    max_in_flight: int = Field(64, ge=1)  # episodes of this team running at once
    max_waiting: int = Field(256, ge=0)  # more episodes queued; beyond: 429 with Retry-After


class TracingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sqlite_path: str | None = "traces.db"  # relative paths: under the run directory (or the cwd)
    otlp_endpoint: str | None = None
    capture_tokens: bool = True


class ServeConfig(BaseModel):
    """Everything `teamtr serve` needs; a YAML file names only what it changes."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # base model directory; None: the cached warm-started demo model
    bases: dict[str, str] = Field(default_factory=dict)  # more base models (name -> directory) beside "base"
    teams: dict[str, ServedTeamConfig]
    engine: Literal["embedded", "vllm"] = "embedded"
    vllm_url: str | None = None  # attach to this vLLM server instead of launching one
    # several vLLM servers behind the team (serving/vllm_replicas.py, docs/scale.md): attach these (one
    # base model), or launch `vllm_replicas` per base, each over tensor x pipeline parallel GPUs
    vllm_urls: list[str] = Field(default_factory=list)
    vllm_replicas: int = Field(1, ge=1)
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    vllm_pipeline_parallel_size: int = Field(1, ge=1)
    vllm_replica_devices: list[str] = Field(default_factory=list)  # CUDA_VISIBLE_DEVICES per replica
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: list[str] = Field(default_factory=list)
    admin_key: str | None = None
    max_prompt_tokens: int | None = None  # None: a quarter of the model's context length
    max_body_bytes: int = 1_000_000
    max_n: int = Field(8, ge=1)  # a request's `n` (episodes, one choice each) above this gets 400
    rate_limit_rpm: float | None = Field(None, gt=0)  # per API key (token bucket); None: no limit
    rate_limit_burst: int | None = Field(None, ge=1)  # the bucket's size; None: one minute's worth
    request_timeout_s: float = Field(600.0, gt=0)  # default deadline of a request, and its maximum
    drain_timeout_s: float = Field(30.0, ge=0)  # on shutdown, in-flight requests get this long to finish
    torch_threads: int = Field(1, ge=1)
    device: str = "auto"  # embedded engine: auto | cpu | cuda | cuda:K (serving/devices.py)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on a GPU, else float32
    tracing: TracingSpec = Field(default_factory=TracingSpec)
    # conversations and their threads (serving/conversations.py), kept across restarts; None: in memory.
    # `from_run_dir` / `from_yaml` (what `teamtr serve` reads) default it to conversations.db
    conversations_path: str | None = None
    base_dir: str = "."  # relative paths resolve here (a run directory, or the config file's folder)

    @classmethod
    def from_run_dir(
        cls, run_dir: str | Path, team_name: str | None = None, stage: int | None = None, **overrides: Any
    ) -> ServeConfig:
        """Serve one training run as the team `team_name` (default: the directory's name): its newest
        adapters, or those after `stage` stages (`teamtr demo` keeps the best stage, not the last)."""
        run = RunDir(run_dir)  # a clear error now if it is not a run or has no adapters
        run.latest_adapters(run.stage_versions(stage))
        team_cfg = run.config.team
        return cls(
            # absolute: the config's relative paths are relative to where training ran, not to base_dir
            model=str(Path(run.model_path(progress=True)).resolve()),
            bases={name: str(Path(p).resolve()) for name, p in team_cfg.bases.items()},
            teams={
                team_name or run.path.resolve().name: ServedTeamConfig(
                    run_dir=str(run.path.resolve()), stage=stage
                )
            },
            base_dir=str(run.path),
            **{"conversations_path": CONVERSATIONS_DB, **overrides},
        )

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> ServeConfig:
        """A serve config, or a training config (`teamtr serve examples/review_loop.yaml`): that config's
        run directory (its run_dir, relative to the working directory as in `teamtr train`) served as
        `from_run_dir` does, under the run directory's name."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        if isinstance(data, dict) and is_train_config(data):
            cfg = read_config(path)
            if not Path(cfg.run_dir).is_dir():
                raise RunDirError(
                    f"{path} is a training config whose run directory {cfg.run_dir} does not exist: train "
                    f"it first (teamtr train {path}), then serve it"
                )
            return cls.from_run_dir(cfg.run_dir, **overrides)
        data.setdefault("base_dir", str(Path(path).parent))
        data.setdefault("conversations_path", CONVERSATIONS_DB)
        return cls(**{**data, **overrides})

    def path(self, p: str) -> Path:
        return Path(p) if Path(p).is_absolute() else Path(self.base_dir) / p


def is_train_config(data: dict[str, Any]) -> bool:
    """A YAML mapping written for `teamtr train` (training/config.py TrainConfig), not a ServeConfig."""
    return "teams" not in data and bool(set(data) & {"team", "task", "run_dir", "stages", "schedule"})


def served_roles(spec: ServedTeamConfig, run: RunDir | None) -> list[Role]:
    """The team's roles on their bases, at the team's temperature."""
    if spec.roles is None and run is not None:
        roles = run.roles
    else:
        roles = roles_from_factory(spec.roles or CHAIN_ROLES, spec.options)
        if run is not None:  # the run's role_bases, for the roles this team has
            names = {r.name for r in roles}
            roles = with_bases(roles, {k: v for k, v in run.config.team.role_bases.items() if k in names})
    roles = with_bases(roles, spec.role_bases)
    return roles if spec.temperature is None else with_temperature(roles, spec.temperature)


def served_team(
    name: str, spec: ServedTeamConfig, run: RunDir | None, roles: list[Role], engine: Any
) -> Team | RoleGraphTeam:
    """The team taking turns by the spec's router, else the run's, or the run's own graph (team.graph)
    (training/run_dir.py `build_team`)."""
    team_cfg = run.config.team if run is not None else TeamConfig()
    update = {k: v for k, v in (("router", spec.router), ("max_turns", spec.max_turns)) if v is not None}
    try:
        return build_team(team_cfg.model_copy(update=update), roles, engine, name=name)
    except RunDirError as e:
        raise RunDirError(f"team {name!r}: {e}") from None


def model_dir(config: ServeConfig) -> Path:
    """The default base: the config's model, else the first served run's, else the cached demo model."""
    if config.model is not None:  # a path (relative to the run / config), else a hub id or GGUF name
        local = config.path(config.model)
        return Path(resolve_model(local if local.exists() else config.model, progress=True).path)
    for spec in config.teams.values():
        if spec.run_dir is not None:
            return Path(RunDir(config.path(spec.run_dir)).model_path(progress=True)).resolve()
    from teamtr.training.warmstart import ensure_warm_model

    return Path(ensure_warm_model())


def context_length(model: Path) -> int:
    try:
        return int(json.loads((model / "config.json").read_text())["max_position_embeddings"])
    except (OSError, KeyError, ValueError):
        return 2048


@dataclass
class Server:
    """A built server: the FastAPI app and what it runs on (closed by `aclose`)."""

    app: Any
    engine: Any
    registry: AdapterRegistry
    tracer: TeamTracer | None
    teams: dict[str, ServedTeam]
    vllm_servers: list[Any] = field(default_factory=list)  # launched by this server, stopped with it
    conversations: Conversations | None = None

    async def aclose(self) -> None:
        await self.registry.close()  # a shared vLLM server must not keep this server's adapters
        if self.tracer is not None:
            self.tracer.shutdown()
        close = getattr(self.engine, "aclose", None)
        if close is not None:
            await close()
        for server in self.vllm_servers:
            server.stop()
        if self.conversations is not None:
            await self.conversations.aclose()


def build_engine(config: ServeConfig, model: Path, max_lora_rank: int = 16) -> tuple[Any, list[Any]]:
    """(engine, the vLLM servers launched for it) for the configured engine; one base model per entry of
    {"base": model, **config.bases}."""
    bases = {DEFAULT_BASE: model, **{name: config.path(p) for name, p in config.bases.items()}}
    if config.engine == "embedded":
        from teamtr.serving.embedded import EmbeddedEngine

        engine = EmbeddedEngine(
            bases,
            threads=config.torch_threads,
            decode_in_thread=True,
            device=config.device,
            dtype=config.dtype,
        )
        return engine, []
    from teamtr.serving.vllm_engine import VLLMEngine
    from teamtr.serving.vllm_server import attach_vllm_server, start_vllm_server

    if (
        config.vllm_urls
        or config.vllm_replicas * config.vllm_tensor_parallel_size > 1
        or (config.vllm_pipeline_parallel_size > 1)
    ):
        from teamtr.serving.vllm_replicas import open_replica_engine

        return open_replica_engine(
            bases,
            urls=config.vllm_urls,
            replicas=config.vllm_replicas,
            tensor_parallel_size=config.vllm_tensor_parallel_size,
            pipeline_parallel_size=config.vllm_pipeline_parallel_size,
            devices=config.vllm_replica_devices,
            max_lora_rank=max_lora_rank,
        )
    if config.vllm_url:
        if config.bases:
            raise ValueError("--vllm-url attaches one server for one base model; this team has several")
        return VLLMEngine.single(attach_vllm_server(config.vllm_url, model_dir=str(model))), []
    servers = {}
    try:
        for name, path in bases.items():
            # room for two versions of a few roles at once: the outgoing one serves pinned episodes
            servers[name] = start_vllm_server(path, max_lora_rank=max_lora_rank, max_loras=8)
    except Exception:
        for server in servers.values():
            server.stop()
        raise
    return VLLMEngine(servers), list(servers.values())


async def build_server(config: ServeConfig, engine: Any | None = None, on_trajectory: Any = None) -> Server:
    """Engine, registry with each role's newest adapter version live, teams, tracer, app."""
    # first: a corrupt conversation store stops the server before anything is loaded (and stays as it is)
    conversations = Conversations(
        ServeSettings.max_conversations,
        config.path(config.conversations_path) if config.conversations_path else None,
    )
    model = model_dir(config)
    vllm_servers: list[Any] = []
    if engine is None:
        engine, vllm_servers = build_engine(config, model)
    registry = AdapterRegistry(engine)
    teams: dict[str, ServedTeam] = {}
    for name, spec in config.teams.items():
        run = RunDir(config.path(spec.run_dir)) if spec.run_dir else None
        roles = served_roles(spec, run)
        pending = [r for r in roles if r.adapter is not None and r.adapter not in registry.adapters()]
        from_run = [r for r in pending if r.adapter not in spec.adapters]
        if from_run and run is None:
            raise ValueError(
                f"team {name!r}: no adapter for roles {[r.name for r in from_run]}: give run_dir or `adapters:`"
            )
        versions = None if run is None else run.stage_versions(spec.stage)
        saved = run.latest_adapters(versions, roles=from_run) if from_run else {}
        for role in pending:
            if role.adapter in registry.adapters():  # two roles of the team share an adapter
                continue
            if role.adapter in spec.adapters:
                await registry.push(
                    role.adapter, config.path(spec.adapters[role.adapter]), base=role.base_model
                )
            else:
                version, path = saved[role.adapter]
                await registry.push(role.adapter, path, version, base=role.base_model)
        team = served_team(name, spec, run, roles, engine)
        teams[name] = ServedTeam(team, {r.name: r.adapter for r in roles if r.adapter is not None})
    tracer = None
    t = config.tracing
    if t.sqlite_path is not None or t.otlp_endpoint:
        tracing = TracingConfig(
            sqlite_path=config.path(t.sqlite_path) if t.sqlite_path else None,
            otlp_endpoint=t.otlp_endpoint,
            capture_tokens=t.capture_tokens,
        )
        tracer = TeamTracer(
            build_tracer_provider(tracing), capture_tokens=t.capture_tokens, store_path=tracing.sqlite_path
        )
    settings = ServeSettings(
        api_keys=tuple(config.api_keys),
        admin_key=config.admin_key,
        max_prompt_tokens=config.max_prompt_tokens or max(1, context_length(model) // 4),
        max_body_bytes=config.max_body_bytes,
        max_n=config.max_n,
        teams={
            name: TeamPolicy(spec.max_in_flight, spec.max_waiting, spec.pinned)
            for name, spec in config.teams.items()
        },
        rate_limit_rpm=config.rate_limit_rpm,
        rate_limit_burst=config.rate_limit_burst,
        request_timeout_s=config.request_timeout_s,
        drain_timeout_s=config.drain_timeout_s,
    )
    app = create_app(
        teams, registry, tracer, settings, on_trajectory=on_trajectory, conversations=conversations
    )
    return Server(app, engine, registry, tracer, teams, vllm_servers, conversations)
