"""Roles as named chat models: the one change a user makes to an existing LangGraph graph.

    team = RoleModels(engine, roles)
    async def plan(state):                       # any node of any graph
        reply = await team.model("planner").ainvoke(state["messages"])

`model(name)` is an `EngineChatModel` (graphs/chat_model.py) bound to the role's adapter, base model and
sampling settings, or the chat model given for that role (e.g. `ChatOpenAI`). Every model carries the
role in its call metadata (`teamtr_role`, `teamtr_adapter`, `teamtr_base_model`) so episode capture
(graphs/capture.py) attributes each call to its role whichever model made it.

An engine-backed role model sends the role's system prompt first when the messages a node passes have no
system message (`EngineChatModel.system_prompt`); messages that carry one are sent as given. A chat
model given for a role (`models=`) gets the messages exactly as the node passes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable

from teamtr.graphs.chat_format import ChatFormat
from teamtr.graphs.chat_model import EngineChatModel
from teamtr.graphs.roles import Role


class UnknownRoleError(LookupError):
    """A graph asked for a role the team does not have."""


def role_metadata(role: Role) -> dict[str, Any]:
    """What a call's metadata says about its role (read by graphs/capture.py and EngineChatModel)."""
    return {"teamtr_role": role.name, "teamtr_adapter": role.adapter, "teamtr_base_model": role.base_model}


def _tagged(model: BaseChatModel | Runnable, role: Role) -> BaseChatModel | Runnable:
    """The model, telling capture which role it speaks for.

    An EngineChatModel carries its role itself (no wrapper: it stays a plain BaseChatModel); any other
    model is bound once to the role's metadata, which LangChain merges into every call's."""
    if isinstance(model, EngineChatModel):
        return model if model.role == role.name else model.model_copy(update={"role": role.name})
    return model.with_config(metadata=role_metadata(role))


def role_chat_model(role: Role, engine: Any, chat_format: ChatFormat | None = None) -> EngineChatModel:
    """The engine-backed chat model of `role`: its adapter, base model and sampling settings."""
    return EngineChatModel(
        engine=engine,
        adapter=role.adapter,
        base_model=role.base_model,
        sampling=role.sampling,
        chat_format=chat_format,
        role=role.name,
        system_prompt=role.system_prompt,
    )


class RoleModels:
    """One chat model per role: engine-backed by default, or the model given for that role in `models`.

    engine: an `Engine` (graphs/engine.py); may be None when `models` covers every role.
    chat_format: how engine-backed roles render the team's context (graphs/chat_format.py).
    """

    def __init__(
        self,
        engine: Any | None,
        roles: Sequence[Role],
        models: Mapping[str, BaseChatModel | Runnable] | None = None,
        chat_format: ChatFormat | None = None,
    ) -> None:
        self.roles = list(roles)
        names = [r.name for r in self.roles]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate role names: {dupes}")
        given = dict(models or {})
        strangers = sorted(set(given) - set(names))
        if strangers:
            raise UnknownRoleError(
                f"chat models given for roles {strangers} that are not roles; roles are {names}"
            )
        self._raw: dict[str, BaseChatModel | Runnable] = {}
        for r in self.roles:
            if r.name in given:
                self._raw[r.name] = given[r.name]
            elif engine is not None:
                self._raw[r.name] = role_chat_model(r, engine, chat_format)
        missing = [n for n in names if n not in self._raw]
        if missing:
            raise ValueError(f"no engine and no chat model for roles {missing}")
        self._bound = {r.name: _tagged(self._raw[r.name], r) for r in self.roles}

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.roles]

    def role(self, name: str) -> Role:
        for r in self.roles:
            if r.name == name:
                return r
        raise UnknownRoleError(f"no role {name!r}; roles are {self.names}")

    def model(self, name: str) -> BaseChatModel | Runnable:
        """The chat model role `name` speaks with, tagged with its role for capture."""
        try:
            return self._bound[name]
        except KeyError:
            raise UnknownRoleError(
                f"graph asked for role {name!r}, which the team does not have; roles are {self.names}"
            ) from None

    def raw_model(self, name: str) -> BaseChatModel | Runnable:
        """The model itself, untagged (its class, its settings)."""
        self.role(name)
        return self._raw[name]
