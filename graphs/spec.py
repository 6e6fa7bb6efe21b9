"""The team a config names, below every area that runs one: which roles (on which bases), who speaks
next, and the user's own graph (team.graph), and `build_team`, which turns that spec into a runnable
team on any engine. Training (training/run_dir.py), evaluation and serving (serving/server.py) all build
their teams here, so a run is trained and served as one team.

    team = build_team(TeamConfig(router="mine.routers:reversed"), roles, engine, temperature=0.0)
"""

from __future__ import annotations

# graphs.team and graphs.user_graph (langgraph) are imported by the functions that build a team, so that
# reading a config (the CLI's config errors) stays light
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from teamtr.graphs.loading import ConfigObjectError, load_object
from teamtr.graphs.roles import Role, with_temperature

if TYPE_CHECKING:
    from teamtr.graphs.team import Team
    from teamtr.graphs.user_graph import RoleGraphTeam
from teamtr.graphs.task import HELDOUT_SEED


class SpecError(ValueError):
    """A team spec that cannot be built (unknown role, bad router, a factory that returns no roles): one
    line naming the key, which the CLI prints as it is."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskConfig(_Strict):
    """Which task family the team solves and how training / held-out prompts are drawn."""

    name: str = "chain"  # a name in teamtr.tasks
    options: dict[str, Any] = Field(default_factory=dict)  # constructor options of the task family
    train_seed: int = 1  # prompts for rollouts come from this generator seed ...
    eval_seed: int = HELDOUT_SEED  # ... held-out evaluation prompts from a disjoint one
    # where a user graph's tasks come from instead of the family `name` (docs/graphs.md): a JSONL file (one
    # task a line: `prompt` or a graph `input`, optional `answer` and `id`) or `module:function` returning
    # a TaskFamily or a list of TaskInstance; None = the task family `name`
    data: str | None = None
    # held-out tasks for the run's evaluations, as `data` names them (a JSONL file or `module:function`):
    # training's held-out return (eval.stage_episodes of them, each at most once) and `teamtr eval RUN_DIR`
    # are scored on these; None = held-out prompts drawn with `eval_seed` from the task family or, with
    # `data`, from the training list itself (not held out)
    eval_data: str | None = None


class TeamConfig(_Strict):
    """The team being trained: a factory `module:function` returning the list of `Role`s, who speaks when
    (`router`: round-robin in role order by default, as in graphs/team.py), and the base model every
    role's adapter sits on."""

    # `module:function` returning list[Role]; None = the task's own team: the chain adders for `chain`,
    # else three generic solvers with the family's system prompt (the team `teamtr warmstart` trains)
    roles: str | None = None
    # `module:function`: a router of graphs/team.py (a function of the team state returning the next role
    # or END, declaring its destinations by a `Literal[...]` return annotation); None = round-robin. The
    # run's rollouts, evaluations, swap and `teamtr serve RUN_DIR` all take turns by it (training/run_dir.py)
    router: str | None = None
    max_turns: int | None = Field(None, ge=1)  # episode length guard; None = graphs/team.py's default
    # A user's own LangGraph graph instead of Team (docs/graphs.md): `module:factory`, a compiled graph or
    # a builder `factory(models: RoleModels) -> compiled graph` whose nodes call `models.model(role)`.
    # None = the turn-taking Team of `roles` (and `router`). The keys below apply only with a graph.
    graph: str | None = None
    # `module:function` (task: TaskInstance) -> the graph's input; None = a JSONL row's `input`, else
    # LangGraph's MessagesState: {"messages": [the task prompt as a HumanMessage]}
    input: str | None = None
    # `module:function` (final state) -> the final answer text; None = the last AI message's text
    output: str | None = None
    # `module:function` (task, final state) -> float reward; None = the task family's verifier
    reward: str | None = None
    # sigma: the roles in the order TeamTR updates them each stage (schedule.order then fixes, reverses or
    # shuffles it); None = the order `roles` lists them in
    order: list[str] | None = None
    # the roles TeamTR updates (a subset of the roles, in any order); the others keep their adapter's
    # version 0 (a fresh LoRA adapter speaks as the base model) and go on speaking in every episode.
    # None = every role. A stage then costs only the named roles' updates
    train: list[str] | None = None
    recursion_limit: int | None = Field(None, ge=1)  # a graph episode's LangGraph step limit; None = 25
    # the default base: a model folder, hub id, GGUF file or shipped name (engines/models.py);
    # None = the task's cached warm-started model, or for a user's graph SmolLM2 (`default_model`)
    model: str | None = None
    # with model: None, how that warm-started model is built: overrides of the task's WarmStartConfig
    # (training/warmstart/config.py), e.g. {stop_accuracy: 0.45, seed: 1}; {} = the task's own settings.
    # Given with a graph and no model, the graph trains on that warm model instead of SmolLM2
    warm_start: dict[str, Any] = Field(default_factory=dict)
    # heterogeneous teams: more base models (name -> directory) beside `model` (which is named "base"),
    # and which base each role's adapter sits on (role -> base name; default: the Role's base_model)
    bases: dict[str, str] = Field(default_factory=dict)
    role_bases: dict[str, str] = Field(default_factory=dict)
    # the single-policy baseline: every role speaks with ONE LoRA adapter (`SHARED_ADAPTER`), a policy that
    # plays every part, updated once per stage on all roles' messages inside one trust region
    # (training/llm_team.py); False: each role its own adapter, as the roles factory names them
    shared_adapter: bool = False
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_targets: list[str] | None = None  # module names; None = the engine's default (every linear layer)
    # where the embedded engine loads the base models (engines/devices.py): auto = the first GPU in
    # bfloat16 when torch sees one, else the CPU in float32; a GPU asked for where none exists fails early
    device: str = "auto"  # auto | cpu | cuda | cuda:K
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


# A user's graph speaks with its own prompts, which the char-level warm models (trained on one task
# family's format) cannot follow: its default base is a real instruction-following model.
GRAPH_DEFAULT_MODEL = "smollm2"  # SmolLM2-135M-Instruct, shipped on PyPI (engines/models.py)


def default_model(team: TeamConfig) -> str | None:
    """The default base a team trains on: `team.model`; else, for a user's graph (team.graph) that asks
    for no warm start (team.warm_start), GRAPH_DEFAULT_MODEL; else None, the task's warm-started model."""
    if team.model:
        return team.model
    if team.graph is not None and not team.warm_start:
        return GRAPH_DEFAULT_MODEL
    return None


def roles_from_factory(factory: str, options: dict[str, Any] | None = None) -> list[Role]:
    """`module:function` (called with `options`) -> the list of Role it returns."""
    try:  # as the config's other `module:function` keys: the working directory is searched too
        fn = load_object(factory, "roles")
    except ConfigObjectError as e:
        raise SpecError(str(e).replace("'module:attribute'", "'module:function'")) from None
    roles = fn(**(options or {}))
    if not roles or not all(isinstance(r, Role) for r in roles):
        raise SpecError(f"roles {factory!r} did not return a non-empty list of Role")
    return list(roles)


def with_bases(roles: list[Role], role_bases: dict[str, str]) -> list[Role]:
    """Roles with the base model a config names for them (team.role_bases), the others unchanged."""
    unknown = sorted(set(role_bases) - {r.name for r in roles})
    if unknown:
        raise SpecError(f"team.role_bases names unknown roles {unknown}")
    return [dataclasses.replace(r, base_model=role_bases.get(r.name, r.base_model)) for r in roles]


SHARED_ADAPTER = "shared"  # the one adapter of every role when team.shared_adapter is set
DefaultRoles = Callable[..., list[Role]]  # (task name, options=..., trainable=True) -> the task's own team


def team_roles(team: TeamConfig, task: TaskConfig, default_roles: DefaultRoles) -> list[Role]:
    """The roles a config trains, on the bases it names: `team.roles` (`module:function`), or None for
    the task's own team (`default_roles`: tasks/roles.py's, the chain adders or generic solvers)."""
    if team.roles is None:
        # split's roles read private tables, which the trainer's rollouts do not pass
        if task.name == "split" and team.graph is None:
            raise SpecError("task split: the trainer has no private per-role views; give team.roles")
        roles = default_roles(task.name, options=task.options, trainable=True)
    else:
        roles = roles_from_factory(team.roles)
    missing = [r.name for r in roles if r.adapter is None]
    if missing:
        raise SpecError(f"roles {missing} have no LoRA adapter: nothing to train")
    adapters = [r.adapter for r in roles]
    if len(set(adapters)) != len(adapters):
        raise SpecError(f"roles share adapters {adapters}: each trained role needs its own")
    from teamtr.graphs.user_graph import check_order

    try:  # a user graph's update order sigma (team.order); a Team's roles keep their turn order
        roles = check_order(team.order, roles)
    except ConfigObjectError as e:
        raise SpecError(str(e)) from None
    unknown = sorted(set(team.train or []) - {r.name for r in roles})
    if unknown or team.train == []:
        names = [r.name for r in roles]
        raise SpecError(f"team.train {team.train} must name some of the roles {names}; unknown: {unknown}")
    roles = with_bases(roles, team.role_bases)
    if team.shared_adapter:  # one policy for every role: one adapter, so one base model
        bases = sorted({r.base_model for r in roles})
        if len(bases) > 1:
            raise SpecError(f"team.shared_adapter: one adapter sits on one base model; the roles use {bases}")
        if team.train is not None:
            raise SpecError("team.train with team.shared_adapter: one adapter speaks every role")
        roles = [dataclasses.replace(r, adapter=SHARED_ADAPTER) for r in roles]
    return roles


def team_options(team: TeamConfig) -> dict[str, Any]:
    """`Team` keyword arguments of the config's turn-taking (team.router, team.max_turns); {} when it names
    neither: round-robin. Every team of a run is built with them (`build_team`), so rollouts, evaluations,
    swap and serving take turns alike."""
    from teamtr.graphs.team import TeamError, load_router

    options: dict[str, Any] = {}
    if team.router is not None:
        try:
            options["router"] = load_router(team.router)
        except TeamError as e:
            raise SpecError(f"team.router: {e}") from None
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
    graph over them when the config names one (team.graph: graphs/user_graph.py `graph_team`). A router
    that does not fit the roles (no declared destinations, an unknown role), or a graph factory that does
    not return a graph, is one SpecError line."""
    from teamtr.graphs.team import Team, TeamError
    from teamtr.graphs.user_graph import RoleGraphTeam

    if temperature is not None:
        roles = with_temperature(roles, temperature)
    if team_cfg.graph is not None:
        try:
            return RoleGraphTeam.from_engine(team_cfg, roles, engine, name=name)
        except ConfigObjectError as e:
            raise SpecError(str(e)) from None
    options = team_options(team_cfg) if options is None else options
    try:
        return Team.from_engine(roles, engine, name=name, **options)
    except TeamError as e:
        if "router" not in options:
            raise
        raise SpecError(f"team.router {team_cfg.router!r}: {e}") from None


