"""A request's sampling settings applied to a served team, under the settings the team pins per role.

Semantics (docs/serving.md, "Sampling"): `temperature`, `top_p`, `max_tokens` / `max_completion_tokens`
and `stop` apply to every role's turns, because which role speaks last is only known when the router
ends the episode; a role keeps its own stop strings and adds the request's. A team pins fields per role
(`TeamPolicy.pinned`, serving/settings.py) and a request cannot override them; a request field that
every role of the team pins changes nothing, so it is refused (400) rather than ignored. A role that
speaks through a plain LangChain chat model (not engine-backed) samples as that model is configured; it
counts as pinning every field.

The team's LangGraph graph is compiled once per distinct combination of settings and cached: a variant
is the same team whose engine-backed chat models sample with the resolved settings.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

from teamtr.client.protocol import ChatCompletionRequest, RoleSampling
from teamtr.graphs.chat_model import EngineChatModel
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.team import Team
from teamtr.serving.errors import APIError
from teamtr.serving.settings import SAMPLING_FIELDS

Overrides = tuple[tuple[str, Any], ...]  # sorted (field, value) pairs: a hashable cache key


def request_overrides(request: ChatCompletionRequest) -> dict[str, Any]:
    """The sampling fields the request sets (field names as in SAMPLING_FIELDS)."""
    asked: dict[str, Any] = {}
    if request.temperature is not None:
        asked["temperature"] = request.temperature
    if request.top_p is not None:
        asked["top_p"] = request.top_p
    if request.turn_token_cap() is not None:
        asked["max_tokens"] = request.turn_token_cap()
    if request.stop_strings():
        asked["stop"] = request.stop_strings()
    return asked


def check_pins(team: Team, pinned: dict[str, dict[str, Any]]) -> None:
    """A team's pins name its roles and known fields with valid values (ValueError when built)."""
    names = {r.name for r in team.roles}
    for role, fields in pinned.items():
        if role not in names:
            raise ValueError(f"team {team.name!r}: pinned role {role!r} is not one of {sorted(names)}")
        unknown = set(fields) - set(SAMPLING_FIELDS)
        if unknown:
            raise ValueError(f"team {team.name!r}: cannot pin {sorted(unknown)}; fields: {SAMPLING_FIELDS}")
        apply(team.role(role).sampling, fields)  # raises on a bad value


def apply(sampling: SamplingParams, fields: dict[str, Any]) -> SamplingParams:
    """`sampling` with request-style fields applied (request stop strings add to the role's own)."""
    changes: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "max_tokens":
            changes["max_new_tokens"] = int(value)
        elif name == "stop":
            stops = (value,) if isinstance(value, str) else tuple(value)
            changes["stop"] = tuple(dict.fromkeys((*sampling.stop, *stops)))
        else:
            changes[name] = value
    return dataclasses.replace(sampling, **changes)


def refuse_fully_pinned(team: Team, pinned: dict[str, dict[str, Any]], asked: dict[str, Any]) -> None:
    """400 for a request field that no role of the team would sample with: every role pins it, or speaks
    through a plain LangChain chat model (its settings are that model's own)."""
    for name in asked:
        if all(
            name in pinned.get(r.name, {}) or not isinstance(team.models[r.name], EngineChatModel)
            for r in team.roles
        ):
            param = "max_tokens" if name == "max_tokens" else name
            raise APIError(
                400,
                f"{param}: team {team.name!r} pins {name} for every role, so a request cannot set it",
                param=param,
                code="pinned_by_team",
            )


class TeamVariants:
    """One compiled variant of a team per distinct effective sampling, most recently used kept."""

    def __init__(self, team: Team, pinned: dict[str, dict[str, Any]], capacity: int = 64) -> None:
        check_pins(team, pinned)
        self.team, self.pinned, self.capacity = team, pinned, capacity
        self._cache: OrderedDict[Overrides, Team] = OrderedDict()

    def sampling_of(self, asked: dict[str, Any]) -> dict[str, SamplingParams]:
        """role -> the settings its turns use: declared, then the request's, then the team's pins (roles
        on engine-backed chat models; others sample as their own chat model says)."""
        out = {}
        for role in self.team.roles:
            model = self.team.models[role.name]
            if isinstance(model, EngineChatModel):
                out[role.name] = apply(apply(model.sampling, asked), self.pinned.get(role.name, {}))
        return out

    def team_for(self, asked: dict[str, Any]) -> Team:
        if not asked:
            return self.team
        key: Overrides = tuple(sorted(asked.items()))
        variant = self._cache.get(key)
        if variant is None:
            sampling = self.sampling_of(asked)
            models = {
                name: m.model_copy(update={"sampling": sampling[name]})
                if isinstance(m, EngineChatModel)
                else m
                for name, m in self.team.models.items()
            }
            variant = dataclasses.replace(self.team, models=models)
            self._cache[key] = variant
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return variant


def described(sampling: dict[str, SamplingParams]) -> dict[str, RoleSampling]:
    return {
        role: RoleSampling(
            temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_new_tokens, stop=list(s.stop)
        )
        for role, s in sampling.items()
    }
