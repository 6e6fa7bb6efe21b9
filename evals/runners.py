"""Runners that answer task instances with a real team or one model (a LangGraph team on any engine).

Engine-free: this module builds no engine and reads no run. `EngineRunners` takes an engine that
implements graphs/engine.py's `Engine` and the roles to run on it; evals/teams.py `load_eval_team` builds
both from `warm`, a model directory or a run directory (training/run_dir.py `RunDir`).

Roles: the run's roles, else the chain demo's adders for `chain`, else generic solvers with a short
per-family system prompt (`default_roles`). For `split`, role i also sees its private table
(`role_view`). The single-model baseline is one agent (one policy) given every private fact; see
`EngineRunners.single`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from teamtr.evals.harness import Episode, Runner
from teamtr.graphs.engine import Engine, SamplingParams
from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.graphs.team import RoundRobin, Team, derive_seed
from teamtr.tasks.roles import MESSAGE_END, system_prompt_for, with_private_view


class EngineRunners:
    """One engine and event loop shared by the team runner and the single-model runner."""

    def __init__(
        self,
        engine: Engine,
        roles: list[Role],
        family: TaskFamily,
        *,
        temperature: float = 1.0,
        max_new_tokens: int = 32,
        seed: int = 0,
        team_options: dict[str, Any] | None = None,
    ) -> None:
        self.engine, self.roles, self.family, self.seed = engine, roles, family, seed
        self.team_options = team_options or {}  # Team keyword arguments: a run's router / max_turns
        self.loop = asyncio.new_event_loop()
        self.sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
        self.calls = 0

    def close(self) -> None:
        self.loop.close()

    def _roles_for(self, instance: TaskInstance) -> list[Role]:
        roles = []
        for i, r in enumerate(self.roles):
            sampling = replace(self.sampling, stop=r.sampling.stop or (MESSAGE_END,))
            roles.append(replace(with_private_view(r, self.family, instance, i), sampling=sampling))
        return roles

    def _episodes(
        self, teams_and_tasks: list[tuple[Any, TaskInstance]], samples: int, rewarded: bool = False
    ) -> list[list[Episode]]:
        """`samples` episodes of each (team, task); `rewarded`: each keeps the reward its team gave it."""
        self.calls += 1
        call = self.calls
        options = {"verifier": self.family} if rewarded else {}

        async def one(team, inst: TaskInstance, g: int) -> Episode:
            traj = await team.arun(inst, seed=derive_seed(self.seed, call, inst.id, g), **options)
            return Episode(
                response=traj.final_answer or "",
                completion_tokens=sum(len(t.completion_ids) for t in traj.turns),
                prompt_tokens=sum(len(t.prompt_ids) for t in traj.turns),
                turns=len(traj.turns),
                reward=traj.reward if rewarded else None,
            )

        async def all_episodes() -> list[Episode]:
            jobs = [one(team, inst, g) for team, inst in teams_and_tasks for g in range(samples)]
            return list(await asyncio.gather(*jobs))

        flat = self.loop.run_until_complete(all_episodes())
        return [flat[i * samples : (i + 1) * samples] for i in range(len(teams_and_tasks))]

    def team(self) -> Runner:
        def run(instances: Sequence[TaskInstance], samples: int) -> list[list[Episode]]:
            teams = [
                (
                    Team.from_engine(
                        self._roles_for(inst), self.engine, name=self.family.name, **self.team_options
                    ),
                    inst,
                )
                for inst in instances
            ]
            return self._episodes(teams, samples)

        return run

    def graph(self, team: Any, rewarded: bool = True) -> Runner:
        """A user's own graph as the team (training/run_dir.py `build_team` -> RoleGraphTeam): its roles
        speak as the graph routes them, with their own sampling. `rewarded`: an episode is scored by the
        graph's own reward (team.reward on its final state; without one, this family's verifier on its
        answer); else the harness verifies the answer."""

        def run(instances: Sequence[TaskInstance], samples: int) -> list[list[Episode]]:
            return self._episodes([(team, inst) for inst in instances], samples, rewarded)

        return run

    def single(self, adapter: str | None = None, turns: int | None = None) -> Runner:
        """One agent (one policy, no role adapters unless `adapter`) that sees every role's private facts.

        turns=None: it speaks as many turns as the team has roles, each one message like a role's (the
        small character models write one line per message and never stop on their own, so a single long
        message would only ramble to the limit). turns=1: one message with the whole team's allowance and
        no newline stop, the natural form for a chat model that ends its answer with EOS."""
        n_roles = len(self.roles)
        turns = n_roles if turns is None else turns
        if turns < 1:
            raise ValueError("turns must be >= 1")
        if turns == 1:
            sampling = replace(self.sampling, max_new_tokens=self.sampling.max_new_tokens * n_roles, stop=())
        else:
            sampling = replace(self.sampling, stop=(MESSAGE_END,))
        solo = Role(
            name="single",
            system_prompt=system_prompt_for(self.family.name),
            adapter=adapter,
            sampling=sampling,
        )
        team = Team.from_engine(
            [solo], self.engine, router=RoundRobin(rounds=turns), name=f"{self.family.name}-single"
        )
        full_prompt = getattr(self.family, "full_prompt", None)

        def run(instances: Sequence[TaskInstance], samples: int) -> list[list[Episode]]:
            shown = [replace(i, prompt=full_prompt(i)) if full_prompt else i for i in instances]
            return self._episodes([(team, inst) for inst in shown], samples)

        return run
