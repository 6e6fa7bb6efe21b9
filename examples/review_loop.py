"""A 4-role graph with its own state, a non-LLM checker and a loop: train it and serve it from a config.

    teamtr train examples/review_loop.yaml       # TeamTR on the graph below, tasks from review_loop.jsonl
    teamtr serve examples/review_loop.yaml       # the same graph as the chat API (model "review_loop")

planner -> solver -> check (a calculator, no LLM) -> passed or out of rounds? -> finalizer -> END
                        ^                                    | no
                        +------------ reviewer <-------------+

The graph is ordinary LangGraph code: the only teamtr-specific line is `models.model(role)` in `speak`,
the chat model of a role (graphs/role_models.py), which the config's `team.graph` builder receives.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any, Literal, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph

from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.role_models import RoleModels
from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskInstance

MAX_ROUNDS = 2  # solver attempts before the finalizer answers anyway


class ReviewState(TypedDict, total=False):
    question: str  # an arithmetic expression, e.g. "3+4*2"
    plan: str
    draft: str
    review: str
    passed: bool
    rounds: int  # solver attempts so far
    answer: str


def roles(max_new_tokens: int = 8) -> list[Role]:
    """The four roles, each with its own LoRA adapter (short one-line messages)."""
    say = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop=("\n",))
    prompts = {
        "planner": "Say how to compute the expression.",
        "solver": "Give the value of the expression as a number.",
        "reviewer": "The value was wrong: say what to fix.",
        "finalizer": "Write the final value.",
    }
    return [Role(name, text, adapter=name, sampling=say) for name, text in prompts.items()]


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> int | None:
    """The value of an integer + - * expression, None if it is not one (no eval of arbitrary code)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(expression)

    try:
        return value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError):
        return None


def first_number(text: str) -> str | None:
    match = re.search(r"-?\d+", text or "")
    return match.group(0) if match else None


def build(models: RoleModels) -> Any:
    """The compiled graph over the team's role models (the config's `team.graph`)."""

    async def speak(role: str, *lines: str) -> str:
        messages = [SystemMessage(models.role(role).system_prompt), HumanMessage("\n".join(lines))]
        reply = await models.model(role).ainvoke(messages)
        return str(reply.content)

    async def planner(state: ReviewState) -> dict:
        return {"plan": await speak("planner", state["question"]), "rounds": 0}

    async def solver(state: ReviewState) -> dict:
        lines = [state["question"], state.get("plan", ""), state.get("review", "")]
        return {"draft": await speak("solver", *lines), "rounds": state.get("rounds", 0) + 1}

    def check(state: ReviewState) -> dict:  # the non-LLM node: a deterministic calculator
        expected = calculate(state["question"])
        return {"passed": expected is not None and first_number(state.get("draft", "")) == str(expected)}

    async def reviewer(state: ReviewState) -> dict:
        return {"review": await speak("reviewer", state["question"], state.get("draft", ""))}

    async def finalizer(state: ReviewState) -> dict:
        return {"answer": await speak("finalizer", state["question"], state.get("draft", ""))}

    def after_check(state: ReviewState) -> Literal["finalizer", "reviewer"]:
        return "finalizer" if state.get("passed") or state.get("rounds", 0) >= MAX_ROUNDS else "reviewer"

    graph = StateGraph(ReviewState)
    for name, node in [
        ("planner", planner),
        ("solver", solver),
        ("check", check),
        ("reviewer", reviewer),
        ("finalizer", finalizer),
    ]:
        graph.add_node(name, node)
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "solver")
    graph.add_edge("solver", "check")
    graph.add_conditional_edges("check", after_check)
    graph.add_edge("reviewer", "solver")  # the loop back to an earlier role
    graph.add_edge("finalizer", END)
    return graph.compile()


def make_input(task: TaskInstance) -> ReviewState:
    """The config's `team.input`: the task (a data row, or a served chat's text) as the graph's state."""
    return {"question": task.prompt.strip().splitlines()[-1] if task.prompt.strip() else ""}


def final_answer(state: ReviewState) -> str | None:
    """The config's `team.output`: what the team answers (the finalizer's message)."""
    return state.get("answer")


def reward(task: TaskInstance, state: ReviewState) -> float:
    """The config's `team.reward`: 1 for the right value, 0.5 for a number at all (a signal a small model
    can find), else 0."""
    number = first_number(state.get("answer") or "")
    if number is None:
        return 0.0
    return 1.0 if number == str(calculate(state["question"])) else 0.5


def verify(task: TaskInstance, response: str) -> float:
    """A verifier of the answer alone (`teamtr eval RUN_DIR --verifier examples.review_loop:verify`): 1 when
    its first number is the expression's value. What a single model's answer can be scored by too."""
    return float(first_number(response) == str(calculate(task.prompt.strip().splitlines()[-1])))
