"""What `teamtr serve` serves and how it is built: `ServeConfig` and `build_server` (docs/serving.md).

A run directory is read as graphs/run_layout.py's `RunFiles` (roles, router or graph, bases, the newest
`adapters/<adapter>/v<N>/` of each role), never through training; the engine comes from
engines/open.py `open_engine`. cli/serve.py holds the commands (and checks a run's whole config,
which is training's, before serving it).

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
from pydantic import BaseModel, ConfigDict, Field, model_validator

from teamtr.engines.models import local_or_reference, resolve_model
from teamtr.engines.open import EngineKind, EngineSpec, VLLMSettings, open_engine
from teamtr.graphs.engine import DEFAULT_BASE, Closable
from teamtr.graphs.roles import Role, with_temperature
from teamtr.graphs.run_layout import DEFAULT_RUN_DIR, RunDirError, RunFiles
from teamtr.graphs.spec import SpecError, TeamConfig, build_team, roles_from_factory, with_bases
from teamtr.graphs.team import Team
from teamtr.graphs.user_graph import RoleGraphTeam
from teamtr.serving.app import ServedTeam, ServeSettings, TeamPolicy, create_app
from teamtr.serving.conversations import Conversations, ConversationStore
from teamtr.serving.pg_conversations import PgConversations
from teamtr.serving.pg_store import PgStore, is_database_url
from teamtr.serving.promotion_log import PROMOTION_LOG, PromotionLog, SharedPromotionLog
from teamtr.serving.registry import AdapterRegistry
from teamtr.serving.settings import ApiLimits
from teamtr.serving.tracing import TeamTracer, TracingConfig, build_tracer_provider

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
    # the share of episodes (each drawn on its own) sampled at exploration_temperature, top_p 1, for
    # training on their /v1/feedback (serving/exploration.py, docs/improve.md); 0: every episode as served
    exploration_share: float = Field(0.0, ge=0, le=1)
    exploration_temperature: float | None = Field(None, gt=0)  # None: the run's rollout.temperature, else 1
    exploration_seed: int | None = None  # seeds the draws (reproducible tests); None: from the OS
    # a user graph's role that answers once, last (its node's message is what team.output reads): its
    # tokens stream as the answer's content as they are decoded (serving/token_stream.py); None: a
    # round-robin team streams its last turn, any other team sends its answer when the episode ends
    answer_role: str | None = None
    max_in_flight: int = Field(64, ge=1)  # episodes of this team running at once
    max_waiting: int = Field(256, ge=0)  # more episodes queued; beyond: 429 with Retry-After


class TracingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sqlite_path: str | None = "traces.db"  # relative paths: under the run directory (or the cwd)
    otlp_endpoint: str | None = None
    capture_tokens: bool = True


class ServeConfig(VLLMSettings, ApiLimits):
    """Everything `teamtr serve` needs; a YAML file names only what it changes."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # base model directory; None: the cached warm-started demo model
    bases: dict[str, str] = Field(default_factory=dict)  # more base models (name -> directory) beside "base"
    teams: dict[str, ServedTeamConfig]
    engine: EngineKind = "embedded"
    # vllm_url (attach to this server instead of launching one), vllm_urls, vllm_replicas, ...: VLLMSettings
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    # api_keys, admin_key, max_body_bytes, max_n, rate limits, timeouts, reward_range: ApiLimits
    max_prompt_tokens: int | None = None  # None: a quarter of the model's context length
    # an idle keep-alive connection stays open this long: longer than the longest Retry-After (30 s,
    # serving/errors.py), so a pooled client waiting out a 429 still finds it (uvicorn's default is 5 s)
    keep_alive_s: float = Field(45.0, gt=0)
    torch_threads: int = Field(1, ge=1)
    device: str = "auto"  # embedded engine: auto | cpu | cuda | cuda:K (engines/devices.py)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on a GPU, else float32
    tracing: TracingSpec = Field(default_factory=TracingSpec)
    # conversations and their threads (serving/conversations.py), kept across restarts; None: in memory.
    # `from_run_dir` / `from_yaml` (what `teamtr serve` reads) default it to conversations.db
    conversations_path: str | None = None
    # what the admin API promoted, loaded as candidates and rolled back (serving/promotion_log.py), replayed at start so
    # a restarted server serves the last promoted team; None: in memory. `from_run_dir` defaults it to
    # RUN/promotions.jsonl (not with an explicit stage: that serves the stage asked for)
    promotion_log: str | None = None
    # several replicas: a postgresql:// URL of their shared store (serving/pg_store.py) holding the
    # conversations, threads, spans and promotion log instead of conversations_path, tracing.sqlite_path
    # and promotion_log; None: those local files (one server)
    db: str | None = None
    base_dir: str = "."  # relative paths resolve here (a run directory, or the config file's folder)
    # production: the chat API needs a key (api_keys required), /docs, /openapi.json, /health and /metrics
    # too, and pushed adapters must lie under adapter_roots (default: base_dir); docs/serving.md
    preset: Literal["development", "production"] = "development"
    adapter_roots: list[str] | None = None  # pushed adapter paths must be under one; None: anywhere

    @model_validator(mode="after")
    def _db_is_a_database_url(self) -> ServeConfig:
        if self.db is not None and not is_database_url(self.db):
            raise ValueError(f"db must be a postgresql:// URL (the replicas' shared store), got {self.db!r}")
        return self

    @model_validator(mode="after")
    def _production_needs_keys(self) -> ServeConfig:
        if self.preset == "production" and not (self.api_keys and self.admin_key):
            raise ValueError("preset: production needs api_keys and an admin_key")
        return self

    def roots(self) -> tuple[str, ...] | None:
        """Where pushed adapters may come from (the production preset: base_dir unless named)."""
        if self.adapter_roots is not None:
            return tuple(str(self.path(r)) for r in self.adapter_roots)
        return (str(Path(self.base_dir)),) if self.preset == "production" else None

    @classmethod
    def from_run_dir(
        cls, run_dir: str | Path, team_name: str | None = None, stage: int | None = None, **overrides: Any
    ) -> ServeConfig:
        """Serve one training run as the team `team_name` (default: the directory's name): its newest
        adapters, or those after `stage` stages (`teamtr demo` keeps the best stage, not the last)."""
        run = open_run(run_dir)  # a clear error now if it is not a run or has no adapters
        run.saved_adapters(run.stage_versions(stage))
        team_cfg = run.team_config
        return cls(
            # absolute: the config's relative paths are relative to where training ran, not to base_dir
            model=local_or_reference(run.default_model()),
            bases={name: local_or_reference(p) for name, p in team_cfg.bases.items()},
            teams={
                team_name or run.path.resolve().name: ServedTeamConfig(
                    run_dir=str(run.path.resolve()), stage=stage
                )
            },
            base_dir=str(run.path),
            **{
                "conversations_path": CONVERSATIONS_DB,
                "promotion_log": PROMOTION_LOG if stage is None else None,
                **overrides,
            },
        )

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> ServeConfig:
        """A serve config, or a training config (`teamtr serve examples/review_loop.yaml`): that config's
        run directory (its run_dir, relative to the working directory as in `teamtr train`) served as
        `from_run_dir` does, under the run directory's name."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        if isinstance(data, dict) and is_train_config(data):
            run_dir = Path(data.get("run_dir", DEFAULT_RUN_DIR))
            if not run_dir.is_dir():
                raise RunDirError(
                    f"{path} is a training config whose run directory {run_dir} does not exist: train "
                    f"it first (teamtr train {path}), then serve it"
                )
            return cls.from_run_dir(run_dir, **overrides)
        data.setdefault("base_dir", str(Path(path).parent))
        data.setdefault("conversations_path", CONVERSATIONS_DB)
        return cls(**{**data, **overrides})

    def path(self, p: str) -> Path:
        return Path(p) if Path(p).is_absolute() else Path(self.base_dir) / p

    def reference(self, model: str) -> str:
        """A model the config names: a path here (relative to base_dir), else a hub id or shipped name."""
        local = self.path(model)
        return str(local) if local.exists() else model


def is_train_config(data: dict[str, Any]) -> bool:
    """A YAML mapping written for `teamtr train` (training/config.py TrainConfig), not a ServeConfig."""
    return "teams" not in data and bool(set(data) & {"team", "task", "run_dir", "stages", "schedule"})


def open_run(path: str | Path) -> RunFiles:
    """A run directory read as a served team (its task's own team when the config names no roles)."""
    from teamtr.tasks.roles import default_roles

    return RunFiles(path, default_roles)


def served_roles(spec: ServedTeamConfig, run: RunFiles | None) -> list[Role]:
    """The team's roles on their bases, at the team's temperature."""
    if spec.roles is None and run is not None:
        roles = run.roles
    else:
        roles = roles_from_factory(spec.roles or CHAIN_ROLES, spec.options)
        if run is not None:  # the run's role_bases, for the roles this team has
            names = {r.name for r in roles}
            roles = with_bases(roles, {k: v for k, v in run.team_config.role_bases.items() if k in names})
    roles = with_bases(roles, spec.role_bases)
    return roles if spec.temperature is None else with_temperature(roles, spec.temperature)


def exploration_temperature(spec: ServedTeamConfig, run: RunFiles | None) -> float:
    """What exploratory episodes sample at: the team's setting, else the run's training temperature."""
    if spec.exploration_temperature is not None:
        return spec.exploration_temperature
    return run.rollout_temperature() if run is not None else 1.0


def served_team(
    name: str, spec: ServedTeamConfig, run: RunFiles | None, roles: list[Role], engine: Any
) -> Team | RoleGraphTeam:
    """The team taking turns by the spec's router, else the run's, or the run's own graph (team.graph)
    (graphs/spec.py `build_team`)."""
    team_cfg = run.team_config if run is not None else TeamConfig()
    update = {k: v for k, v in (("router", spec.router), ("max_turns", spec.max_turns)) if v is not None}
    try:
        return build_team(team_cfg.model_copy(update=update), roles, engine, name=name)
    except SpecError as e:
        raise SpecError(f"team {name!r}: {e}") from None


def model_dir(config: ServeConfig) -> Path:
    """The default base: the config's model, else the first served run's (`teamtr serve` gives a config
    with neither the demo model)."""
    if config.model is not None:  # a path (relative to the run / config), else a hub id or GGUF name
        return Path(resolve_model(config.reference(config.model), progress=True).path)
    for spec in config.teams.values():
        if spec.run_dir is not None:
            model = local_or_reference(open_run(config.path(spec.run_dir)).default_model())
            return Path(resolve_model(model, progress=True).path)
    raise SpecError("no base model: give `model:` (a model directory, hub id or GGUF file) or a team with `run_dir`")


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
    conversations: ConversationStore | None = None
    base_models: dict[str, str] = field(default_factory=dict)  # base name -> the model it serves
    store: PgStore | None = None  # the replicas' shared store (`db`), closed last

    async def aclose(self) -> None:
        await self.registry.close()  # a shared vLLM server must not keep this server's adapters
        if self.tracer is not None:
            self.tracer.shutdown()
        if isinstance(self.engine, Closable):
            await self.engine.aclose()
        for server in self.vllm_servers:
            server.stop()
        if self.conversations is not None:
            await self.conversations.aclose()
        if self.store is not None:
            self.store.close()


def served_bases(config: ServeConfig, model: Path) -> dict[str, str]:
    """Base name -> model directory: "base" is `model`, the others the config's `bases`."""
    return {DEFAULT_BASE: str(model), **{name: config.reference(p) for name, p in config.bases.items()}}


def engine_spec(config: ServeConfig, bases: dict[str, str], runs: list[RunFiles]) -> EngineSpec:
    """The served engine: one base model per entry of `bases` (`served_bases`), holding the served runs'
    adapters (their LoRA rank sizes vLLM's --max-lora-rank: a rank-32 run is served, not refused)."""
    if config.vllm_url and config.bases:
        raise SpecError("--vllm-url attaches one server for one base model; this team has several")
    adapters = {r.adapter for run in runs for r in run.roles if r.adapter is not None}
    return EngineSpec(
        bases=bases,
        kind=config.engine,
        device=config.device,
        dtype=config.dtype,
        threads=config.torch_threads,
        decode_in_thread=True,
        lora_rank=max([run.team_config.lora_rank for run in runs] + [16]),
        adapters=max(len(adapters), 3),
        vllm=config.vllm_spec("--vllm-url"),
    )


async def build_server(config: ServeConfig, engine: Any | None = None, on_trajectory: Any = None) -> Server:
    """Engine, registry with each role's newest adapter version live, teams, tracer, app."""
    # first: a corrupt conversation store, or a shared one out of reach, stops the server before anything
    # is loaded (and stays as it is)
    capacity = ServeSettings.model_fields["max_conversations"].default
    store = PgStore(config.db) if config.db is not None else None
    conversations: ConversationStore
    if store is not None:
        conversations = PgConversations(capacity, store)
    else:
        conversations = Conversations(
            capacity, config.path(config.conversations_path) if config.conversations_path else None
        )
    model = model_dir(config)
    bases = served_bases(config, model)
    runs = {name: open_run(config.path(spec.run_dir)) for name, spec in config.teams.items() if spec.run_dir}
    vllm_servers: list[Any] = []
    if engine is None:
        opened = open_engine(engine_spec(config, bases, list(runs.values())))
        engine, vllm_servers = opened.engine, opened.servers
    registry = AdapterRegistry(engine)
    teams: dict[str, ServedTeam] = {}
    for name, spec in config.teams.items():
        run = runs.get(name)
        roles = served_roles(spec, run)
        pending = [r for r in roles if r.adapter is not None and r.adapter not in registry.adapters()]
        from_run = [r for r in pending if r.adapter not in spec.adapters]
        if from_run and run is None:
            raise ValueError(
                f"team {name!r}: no adapter for roles {[r.name for r in from_run]}: give run_dir or `adapters:`"
            )
        versions = None if run is None else run.stage_versions(spec.stage)
        saved = run.saved_adapters(versions, roles=from_run) if from_run else {}
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
        if spec.answer_role is not None and spec.answer_role not in {r.name for r in roles}:
            raise SpecError(
                f"team {name!r}: answer_role {spec.answer_role!r} is not one of its roles {[r.name for r in roles]}"
            )
        adapters = {r.name: r.adapter for r in roles if r.adapter is not None}
        teams[name] = ServedTeam(team, adapters, spec.answer_role)
    if store is not None:  # the replicas' log: what they promoted serves here too, from now on
        await registry.attach_log(SharedPromotionLog(store))
    elif config.promotion_log is not None:  # the last promoted team serves again, with its history
        await registry.attach_log(PromotionLog(config.path(config.promotion_log)))
    tracer = None
    t = config.tracing
    if t.sqlite_path is not None or t.otlp_endpoint:
        tracing = TracingConfig(
            sqlite_path=config.path(t.sqlite_path) if t.sqlite_path else None,
            shared_store=store if t.sqlite_path is not None else None,
            otlp_endpoint=t.otlp_endpoint,
            capture_tokens=t.capture_tokens,
        )
        tracer = TeamTracer(
            build_tracer_provider(tracing),
            capture_tokens=t.capture_tokens,
            store_path=config.db if tracing.shared_store is not None else tracing.sqlite_path,
        )
    settings = ServeSettings(
        **config.model_dump(include=set(ApiLimits.model_fields)),
        max_prompt_tokens=config.max_prompt_tokens or max(1, context_length(model) // 4),
        teams={
            name: TeamPolicy(
                spec.max_in_flight,
                spec.max_waiting,
                spec.pinned,
                spec.exploration_share,
                exploration_temperature(spec, runs.get(name)),
                spec.exploration_seed,
            )
            for name, spec in config.teams.items()
        },
        protect_pages=config.preset == "production",
        adapter_roots=config.roots(),
    )
    app = create_app(
        teams, registry, tracer, settings, on_trajectory=on_trajectory, conversations=conversations
    )
    return Server(app, engine, registry, tracer, teams, vllm_servers, conversations, bases, store)
