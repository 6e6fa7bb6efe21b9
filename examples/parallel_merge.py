"""Two roles read private tables in parallel (`Send`), a third merges: train and serve from a config.

    teamtr train examples/parallel_merge.yaml    # TeamTR on the `split` task family (tasks/split.py)
    teamtr serve examples/parallel_merge.yaml    # the same graph as the chat API (model "parallel_merge")

START --Send--> reader (as reader_a, sees table 1 only) --+
      --Send--> reader (as reader_b, sees table 2 only) --+--> merger -> END

Each reader sees the public prompt and its own role's table (the split family's private views), never the
other's; both branches run in the same LangGraph step, through one node, as two roles. The merger sees
the public prompt and both notes, and answers. The graph's reward is the split family's verifier.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.role_models import RoleModels
from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskInstance

READERS = ("reader_a", "reader_b")


class MergeState(TypedDict, total=False):
    task: str  # the public prompt
    views: list[str]  # private table per reader (not shown to the merger)
    notes: Annotated[list[str], operator.add]  # "role: note", one per reader, merged from parallel branches
    answer: str


class ReaderInput(TypedDict):
    role: str
    task: str
    view: str


def roles(max_new_tokens: int = 8) -> list[Role]:
    say = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop=("\n",))
    return [
        Role(
            "reader_a",
            "Write the row of your table the start symbol leads to.",
            adapter="reader_a",
            sampling=say,
        ),
        Role("reader_b", "Write the rows of your table.", adapter="reader_b", sampling=say),
        Role(
            "merger",
            "Follow the rows from the start symbol; write the last symbol.",
            adapter="merger",
            sampling=say,
        ),
    ]


def build(models: RoleModels) -> Any:
    """The compiled graph over the team's role models (the config's `team.graph`)."""

    async def speak(role: str, *lines: str) -> str:
        messages = [SystemMessage(models.role(role).system_prompt), HumanMessage("\n".join(lines))]
        return str((await models.model(role).ainvoke(messages)).content)

    def fan_out(state: MergeState) -> list[Send]:
        views = list(state.get("views") or [])
        return [
            Send(
                "reader", ReaderInput(role=role, task=state["task"], view=views[i] if i < len(views) else "")
            )
            for i, role in enumerate(READERS)
        ]

    async def reader(view: ReaderInput) -> dict:
        return {"notes": [f"{view['role']}: {await speak(view['role'], view['task'], view['view'])}"]}

    async def merger(state: MergeState) -> dict:
        notes = sorted(state.get("notes", []))  # branch order is not fixed: sort for a stable context
        return {"answer": await speak("merger", state["task"], *notes)}

    graph = StateGraph(MergeState)
    graph.add_node("reader", reader)
    graph.add_node("merger", merger)
    graph.add_conditional_edges(START, fan_out, ["reader"])
    graph.add_edge("reader", "merger")
    graph.add_edge("merger", END)
    return graph.compile()


def make_input(task: TaskInstance) -> MergeState:
    """The config's `team.input`: the public prompt and the private views (a served chat has none)."""
    return {"task": task.prompt, "views": list(task.meta.get("views", [])), "notes": []}


def final_answer(state: MergeState) -> str | None:
    return state.get("answer")
