"""A three-role team in a few lines: declare roles, pick a router, run episodes, get trajectories.

    python examples/three_role_team.py

Each role is a node of a LangGraph `StateGraph` whose state is the shared transcript; the router is a
conditional edge. Here the roles speak through the embedded engine (one small base model, one LoRA
adapter per role); swap `Team.from_engine(...)` for `Team(roles, models={name: ChatOpenAI(...)})` to run
the same graph on any LangChain chat model, e.g. a vLLM server.
"""

from __future__ import annotations

from typing import Literal

from langgraph.graph import END

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role
from teamtr.graphs.team import Team, TeamState
from teamtr.tasks import get_task
from teamtr.training.warmstart import ensure_warm_model

# 1. Roles: a name, a system prompt, the LoRA adapter it speaks with (and optionally its base model).
message = SamplingParams(temperature=1.0, max_new_tokens=16, stop=("\n",))
roles = [
    Role("adder1", "Add the first two numbers.", adapter="adder1", sampling=message),
    Role("adder2", "Add the first two numbers.", adapter="adder2", sampling=message),
    Role("adder3", "Add the first two numbers.", adapter="adder3", sampling=message),
]


# 2. A router is a LangGraph conditional edge: the state in, the next role (or END) out.
def router(state: TeamState) -> Literal["adder1", "adder2", "adder3", "__end__"]:
    done = len(state["transcript"])
    if done and "+" not in state["transcript"][-1]["text"]:  # fully reduced: the final answer
        return END
    return ["adder1", "adder2", "adder3"][done] if done < 3 else END


def main() -> None:
    # 3. An engine: the cached warm-started demo model (built on first use, ~2 min on 2 cores).
    engine = EmbeddedEngine(ensure_warm_model(), adapters={r.adapter: None for r in roles})
    team = Team.from_engine(roles, engine, router=router, name="adders")
    print(team.graph.get_graph().draw_mermaid())

    # 4. Episodes: 8 tasks x 4 samples, all in flight at once; each a token-level Trajectory.
    task = get_task("chain")
    trajectories = team.run(task.generate(8, seed=0), group_size=4, verifier=task, seed=0)
    accuracy = sum(t.reward for t in trajectories) / len(trajectories)
    print(f"accuracy {accuracy:.2f} over {len(trajectories)} episodes")
    for turn in trajectories[0].turns:
        print(
            f"  {turn.role:>7} (adapter {turn.adapter} v{turn.adapter_version}): {turn.text.strip()!r}"
            f"  {len(turn.completion_ids)} tokens, log p = {turn.logprob_sum:.2f}"
        )


if __name__ == "__main__":
    main()
