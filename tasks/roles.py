"""The team a task family is warm-started, evaluated and served with when no roles are given: the chain
demo's adders for `chain`, else generic solvers with the family's short system prompt and message budget
(`default_roles`); a split-information family's private view of a role (`with_private_view`)."""

from __future__ import annotations

from typing import Any

from teamtr.graphs.chain_team import chain_roles
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role, with_view
from teamtr.graphs.task import TaskFamily, TaskInstance

# Short system prompts: the small models read one character per token.
SYSTEM_PROMPTS = {
    "chain": "Add the first two numbers.",
    "countdown": "Write an expression.",
    "zebra": "Solve the grid.",
    "autologi": "Place the items.",
    "blocksworld": "Write a plan.",
    "arbench": "Find the code.",
    "split": "Look up the symbol.",
    "convention": "Continue the sums.",
    "relay": "Pass on the value.",
}
MESSAGE_END = "\n"  # the small character models end a message with a newline


# Longest message a family's answer needs, in characters (= tokens of the small models); default 32:
# a 3-block plan is up to ~70 characters.
MAX_NEW_TOKENS = {"blocksworld": 96}


def default_roles(
    task: str, n_roles: int | None = None, options: dict[str, Any] | None = None, trainable: bool = False
) -> list[Role]:
    """The team a family is warm-started and evaluated with: the chain adders for `chain`, else
    `n_roles` generic solvers with the family's system prompt; `trainable` gives each solver its own
    LoRA adapter (`solver1`, ...) and the family's message budget, for `teamtr train`. n_roles None: the
    family option `steps` (one role per step, as the warm start builds it), else 3."""
    if task == "chain":
        return chain_roles(int((options or {}).get("steps", 3)))
    if n_roles is None:
        n_roles = int((options or {}).get("steps", 3))
    prompt = SYSTEM_PROMPTS.get(task, "Solve the task.")
    sampling = SamplingParams(max_new_tokens=MAX_NEW_TOKENS.get(task, 32), stop=(MESSAGE_END,))
    return [
        Role(
            name=f"solver{i}",
            system_prompt=prompt,
            adapter=f"solver{i}" if trainable else None,
            sampling=sampling,
        )
        for i in range(1, n_roles + 1)
    ]


def with_private_view(role: Role, family: TaskFamily, instance: TaskInstance, index: int) -> Role:
    """Role `index` (0-based) as it acts on `instance`: for a split-information family (one with
    `role_view`), its private facts are appended to its system prompt. The warm start renders its
    training contexts through this same function."""
    role_view = getattr(family, "role_view", None)
    if role_view is None:
        return role
    return with_view(role, role_view(instance, index))
