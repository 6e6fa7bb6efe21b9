"""A user's own LangGraph graph as a run's team, from the config alone (docs/graphs.md, "From a config").

    team:  {graph: my_pkg.graphs:build, roles: my_pkg.graphs:roles, reward: my_pkg.graphs:score,
            input: ..., output: ..., order: [coder, reviewer]}
    task:  {data: tasks.jsonl}

`graph_team(team_cfg, roles, engine, ...)` builds the graphs/capture.py `GraphTeam` that graphs/spec.py
`build_team` returns for such a run, so rollouts, evaluations, reports and serving run it as they run
Team. `data_family(path_or_factory)` turns a JSONL file (or a `module:function`) into a TaskFamily.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teamtr.graphs.capture import EpisodeError, EpisodeRunner, GraphTeam, last_ai_text, messages_input
from teamtr.graphs.loading import ConfigObjectError, load_function, load_object
from teamtr.graphs.role_models import RoleModels, UnknownRoleError
from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.graphs.trajectory import Trajectory


class UserGraphError(ConfigObjectError):
    """A config's graph, input, output, reward or data is not what it must be."""


def is_graph(obj: Any) -> bool:
    """A compiled LangGraph graph (or anything with its async `ainvoke`)."""
    return callable(getattr(obj, "ainvoke", None))


def build_graph(spec: str, models: RoleModels) -> Any:
    """The compiled graph `team.graph` names: the object itself, or what its builder returns for `models`."""
    factory = load_object(spec, "team.graph")
    if is_graph(factory):
        return factory
    if not callable(factory):
        raise UserGraphError(
            f"team.graph {spec!r} is a {type(factory).__name__}: neither a graph nor a builder"
        )
    graph = factory(models)
    if not is_graph(graph):
        raise UserGraphError(
            f"team.graph {spec!r} returned a {type(graph).__name__}, not a compiled LangGraph graph "
            "(call .compile() on the StateGraph)"
        )
    return graph


def with_row_input(make_input: Callable[[TaskInstance], Any]) -> Callable[[TaskInstance], Any]:
    """A JSONL row's own graph `input` when it has one, else `make_input(task)`."""

    def make(task: TaskInstance) -> Any:
        return task.meta["input"] if "input" in task.meta else make_input(task)

    return make


def default_input(task: TaskInstance) -> Any:
    """LangGraph's MessagesState: a served chat request's own messages (serving puts them in
    `task.meta["messages"]` as LangChain messages), else the task prompt as one human message."""
    if task.meta.get("messages"):
        return {"messages": list(task.meta["messages"])}
    return messages_input(task)


class ConfigGraphTeam(GraphTeam):
    """A GraphTeam whose episodes fail as an `EpisodeError` naming the graph and the task when the graph
    asks for a role the team does not have (graphs/role_models.py `UnknownRoleError`)."""

    async def arun(self, task: TaskInstance | str, **options: Any) -> Trajectory:
        try:
            return await super().arun(task, **options)
        except UnknownRoleError as e:
            task_id = task.id if isinstance(task, TaskInstance) else "adhoc"
            raise EpisodeError(f"graph {self.name!r}, task {task_id!r}: {e}") from e


def graph_team(
    team_cfg: Any, roles: list[Role], engine: Any, *, name: str = "team", models: RoleModels | None = None
) -> GraphTeam:
    """The GraphTeam of `team_cfg.graph` over `roles` on `engine` (training/config.py TeamConfig keys)."""
    models = models or RoleModels(engine, roles)
    return ConfigGraphTeam(
        build_graph(team_cfg.graph, models),
        name=name,
        roles=[r.name for r in roles],
        reward=load_function(team_cfg.reward, "team.reward"),
        make_input=with_row_input(load_function(team_cfg.input, "team.input", default_input)),
        read_output=load_function(team_cfg.output, "team.output", last_ai_text),
        recursion_limit=team_cfg.recursion_limit,
    )


@dataclass
class RoleGraphTeam(EpisodeRunner):
    """A config's graph with graphs/team.py `Team`'s face (`name`, `roles`, `models`, `role(name)`,
    `arun` / `rollout` / `run`), so what runs a Team runs it: training's rollouts and evaluations, and
    serving (serving/sampling.py makes a request's sampling variant by `dataclasses.replace(team,
    models=...)`, which builds the graph again over those models).

    models: role name -> its chat model (engine-backed `EngineChatModel`s from `from_engine`).
    """

    team_cfg: Any
    roles: list[Role]
    models: dict[str, Any]
    name: str = "team"

    def __post_init__(self) -> None:
        self.role_models = RoleModels(None, self.roles, self.models)
        self.graph_team = graph_team(self.team_cfg, self.roles, None, name=self.name, models=self.role_models)

    @classmethod
    def from_engine(cls, team_cfg: Any, roles: list[Role], engine: Any, name: str = "team") -> RoleGraphTeam:
        built = RoleModels(engine, roles)
        return cls(team_cfg, list(roles), {r.name: built.raw_model(r.name) for r in roles}, name)

    def role(self, name: str) -> Role:
        return self.role_models.role(name)

    async def arun(self, task: TaskInstance | str, **options: Any) -> Trajectory:
        return await self.graph_team.arun(task, **options)


def check_order(order: list[str] | None, roles: list[Role]) -> list[Role]:
    """`roles` in the update order sigma `order` names (a permutation of the role names)."""
    if order is None:
        return roles
    names = [r.name for r in roles]
    if sorted(order) != sorted(names):
        raise UserGraphError(f"team.order {order} must list each role once; the roles are {names}")
    by_name = {r.name: r for r in roles}
    return [by_name[n] for n in order]


# ---- data ---------------------------------------------------------------------------------------------


@dataclass
class DataFamily:
    """A fixed list of tasks as a TaskFamily: `generate(n, seed)` draws n of them (with replacement when
    n exceeds the list, unless `whole`: then at most the whole list, each task once, as a held-out file is
    scored); `verify` is an exact match on the answer (a run's team.reward replaces it)."""

    name: str
    tasks: list[TaskInstance]
    description: str = "tasks from a data file"
    whole: bool = False

    def generate(self, n: int, seed: int, **difficulty: Any) -> list[TaskInstance]:
        rng = random.Random(seed)
        if n <= len(self.tasks) or self.whole:
            return rng.sample(self.tasks, min(n, len(self.tasks)))
        return [rng.choice(self.tasks) for _ in range(n)]

    def extract_answer(self, response: str) -> str | None:
        return response.strip() or None

    def verify(self, instance: TaskInstance, response: str) -> float:
        if instance.answer is None:
            return 0.0
        return float(response.strip() == str(instance.answer).strip())


def read_jsonl_tasks(path: Path, key: str = "task.data") -> list[TaskInstance]:
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserGraphError(f"{key} {path}:{n}: not JSON ({e})") from None
        if not isinstance(row, dict) or ("prompt" not in row and "input" not in row):
            raise UserGraphError(f"{key} {path}:{n}: want an object with 'prompt' or 'input'")
        meta = {"input": row["input"]} if "input" in row else {}
        prompt = row.get("prompt") or json.dumps(row.get("input"))
        tasks.append(
            TaskInstance(
                id=str(row.get("id", f"{path.stem}-{n}")), prompt=prompt, answer=row.get("answer"), meta=meta
            )
        )
    if not tasks:
        raise UserGraphError(f"{key} {path}: no tasks")
    return tasks


def data_family(
    spec: str, name: str, base_dir: Path | None = None, *, key: str = "task.data", whole: bool = False
) -> TaskFamily:
    """The TaskFamily `task.data` (or `key`, e.g. task.eval_data) names: a JSONL file, or `module:function`
    returning a TaskFamily or a list of TaskInstance. `whole`: a fixed list is drawn at most whole, without
    repeats (held-out tasks, each scored once)."""
    path = Path(spec) if base_dir is None or Path(spec).is_absolute() else base_dir / spec
    if spec.endswith((".jsonl", ".json")) or path.is_file():
        if not path.is_file():
            raise UserGraphError(f"{key} {spec!r}: no such file")
        return DataFamily(name, read_jsonl_tasks(path, key), whole=whole)
    made = load_function(spec, key)()
    if isinstance(made, TaskFamily):
        return made
    if isinstance(made, list) and made and all(isinstance(t, TaskInstance) for t in made):
        return DataFamily(name, made, whole=whole)
    raise UserGraphError(f"{key} {spec!r} returned a {type(made).__name__}, not a TaskFamily or tasks")
