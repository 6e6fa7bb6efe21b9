"""The blind relay's router (tasks/relay.py): `team.router: teamtr.tasks.relay:relay_order`."""

from __future__ import annotations

from langgraph.graph import END

from teamtr.graphs.team import RoundRobin, TeamState, episode_turns
from teamtr.tasks.relay import ROUNDS, speakers


class RelayOrder(RoundRobin):
    """The relay's turns: the first role once, then the others round-robin for ROUNDS rounds. It reads
    only the number of turns taken, so an episode restarts from any prefix (suffix resampling).
    `Team` sets `order` when it is built (one team's roles at a time per instance)."""

    def __init__(self) -> None:
        super().__init__(rounds=ROUNDS)

    def __call__(self, state: TeamState) -> str:
        k, n = episode_turns(state), len(self.order)
        turns = speakers(n)
        return self.order[turns[k]] if k < len(turns) else END


relay_order = RelayOrder()  # `team.router: teamtr.tasks.relay:relay_order`
