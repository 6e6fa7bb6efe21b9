"""What a task family declares besides its tasks, as class attributes in its own module (tasks/<family>.py):

    system_prompt   the system prompt of its default team's roles (tasks/roles.py `default_roles`) and of
                    the single-model baseline (evals/runners.py)
    max_new_tokens  the longest message its answer needs, in tokens (optional: DEFAULT_MAX_NEW_TOKENS)
    warm_start      how its warm-started model is built (`WarmStart`; optional: a family without one has no
                    warm start of its own and is built as the chain demo's model)

A family registered without them (tasks/__init__.py `register`, as the tests do) gets the defaults below.
Plain data only: tasks sit below training, so training/warmstart/config.py reads these, never the reverse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Short system prompts: the small models read one character per token.
DEFAULT_SYSTEM_PROMPT = "Solve the task."
# in characters (= tokens of the small models): one line of a role's answer
DEFAULT_MAX_NEW_TOKENS = 32


@dataclass(frozen=True)
class WarmStart:
    """How a family's warm-started model is built, for training/warmstart/config.py `warm_config_for`.

    changes        the WarmStartConfig fields whose values differ from its defaults for this family (step
                   budget, batch, the accuracy band); empty: the defaults (the chain demo's model's)
    scaled_budget  for a family built at several team sizes: (the most roles the fixed step budget was
                   measured to reach the band with, steps per role); k roles beyond those get
                   1 + 2 + ... + k times that many steps more (`max_steps_for`). None: one budget at any size
    """

    changes: Mapping[str, Any] = field(default_factory=dict)
    scaled_budget: tuple[int, int] | None = None
