"""The team a task family is warm-started, evaluated and served with when no roles are given: the chain
demo's adders for `chain`, else generic solvers with the system prompt and message budget the family declares
in its module (`default_roles`; tasks/family_settings.py); a split-information family's private view of a role
(`with_private_view`)."""

from __future__ import annotations

from typing import Any

from teamtr.graphs.chain_team import chain_roles
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role, with_view
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.tasks import family_class
from teamtr.tasks.family_settings import DEFAULT_MAX_NEW_TOKENS, DEFAULT_SYSTEM_PROMPT

MESSAGE_END = "\n"  # the small character models end a message with a newline


def system_prompt_for(task: str) -> str:
    """The system prompt of task `task`'s generic roles: its family's (a default for other names)."""
    return getattr(family_class(task), "system_prompt", DEFAULT_SYSTEM_PROMPT)


def max_new_tokens_for(task: str) -> int:
    """The longest message a role of task `task` writes: its family's budget (a default for other names)."""
    return getattr(family_class(task), "max_new_tokens", DEFAULT_MAX_NEW_TOKENS)


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
    prompt = system_prompt_for(task)
    sampling = SamplingParams(max_new_tokens=max_new_tokens_for(task), stop=(MESSAGE_END,))
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
