"""A tool-using team: a solver that calls a calculator tool, and a reviewer; trained with TeamTR on the
chain arithmetic task and served with threads (docs/graphs.md "Tools", docs/serving.md "Threads").

    teamtr train examples/tool_team.yaml          # TeamTR on the graph below
    teamtr serve runs/tool_team                   # the chat API; X-Conversation-Id continues a thread

START -> solver --tools_condition--> tools (ToolNode: calc) -> solver ... -> reviewer -> END
                 (no call, or MAX_TOOL_ROUNDS used) -------------------------^

Plain LangGraph: `ToolNode` and `tools_condition` run unchanged around the solver's `EngineChatModel`,
whose `bind_tools` puts the tool's schema in the prompt and whose replies' `<tool_call>` blocks become
`AIMessage.tool_calls`. A call that fails (the tool raises, an unknown tool, arguments that fail the
schema) comes back as an error `ToolMessage` (`handle_tool_errors=True`) and the episode goes on.
The state is LangGraph's `MessagesState`, so a served thread's checkpoint holds the conversation: a later
request's message is appended to it and both roles see everything said before. `tool_rounds` counts
this episode's tool calls (reset by `make_input` on every request, so the guard works per episode).
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.messages import SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from examples.review_loop import calculate
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.role_models import RoleModels
from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskInstance
from teamtr.graphs.tool_calls import format_tool_call
from teamtr.graphs.user_graph import default_input

MAX_TOOL_ROUNDS = 2  # solver turns that may call the tool in one episode


class ToolTeamState(MessagesState):
    tool_rounds: int


@tool
def calc(expression: str) -> str:
    """Evaluate an integer + - * expression."""
    value = calculate(expression)
    if value is None:  # ToolNode turns the exception into an error ToolMessage for the solver
        raise ValueError(f"not an integer + - * expression: {expression!r}")
    return str(value)


TOOLS = [calc]
# a small model copies a call it is shown more readily than it follows a schema alone
SOLVER_PROMPT = (
    "Work out the sum with the calc tool. Call it like this:\n"
    + format_tool_call("calc", {"expression": "2+2"})
    + "\nThen say the value."
)


def roles(max_new_tokens: int = 96) -> list[Role]:
    """The solver (calls `calc`) and the reviewer (writes the final value), each with its own adapter.
    No stop string: a tool call spans several lines, so a message ends at the model's end of message;
    `max_new_tokens` leaves room for a call written one character a token (the warm-started tiny model)."""
    say = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    return [
        Role("solver", SOLVER_PROMPT, adapter="solver", sampling=say),
        Role("reviewer", "Check the work above and write the final value as one integer.", adapter="reviewer",
             sampling=say),
    ]  # fmt: skip


def build(models: RoleModels) -> Any:
    """The compiled graph over the team's role models (the config's `team.graph`)."""
    solver_model = models.model("solver").bind_tools(TOOLS)
    reviewer_model = models.model("reviewer")

    def context(role: str, state: ToolTeamState) -> list:
        return [SystemMessage(models.role(role).system_prompt), *state["messages"]]

    async def solver(state: ToolTeamState) -> dict:
        reply = await solver_model.ainvoke(context("solver", state))
        return {"messages": [reply], "tool_rounds": state.get("tool_rounds", 0) + bool(reply.tool_calls)}

    def after_solver(state: ToolTeamState) -> Literal["tools", "reviewer"]:
        wants_tool = tools_condition(state) == "tools"
        return "tools" if wants_tool and state.get("tool_rounds", 0) <= MAX_TOOL_ROUNDS else "reviewer"

    async def reviewer(state: ToolTeamState) -> dict:
        return {"messages": [await reviewer_model.ainvoke(context("reviewer", state))]}

    graph = StateGraph(ToolTeamState)
    graph.add_node("solver", solver)
    graph.add_node("tools", ToolNode(TOOLS, handle_tool_errors=True))
    graph.add_node("reviewer", reviewer)
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", after_solver)
    graph.add_edge("tools", "solver")
    graph.add_edge("reviewer", END)
    return graph.compile()


def make_input(task: TaskInstance) -> dict[str, Any]:
    """The config's `team.input`: the chat messages (a served request's, else the task as one human
    message) and a fresh tool-round count; in a thread the messages are appended to the stored ones."""
    return {**default_input(task), "tool_rounds": 0}
