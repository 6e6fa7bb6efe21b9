"""The demo team: three adders that reduce a running sum one addition each (task `chain`)."""

from __future__ import annotations

from typing import Any

from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role
from teamtr.graphs.team import Team

SYSTEM_PROMPT = "Add the first two numbers."
# The small character model ends each message with a newline; a chat model ends it with EOS anyway.
MESSAGE_SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=16, stop=("\n",))


def chain_roles(steps: int = 3, sampling: SamplingParams = MESSAGE_SAMPLING) -> list[Role]:
    return [
        Role(name=f"adder{k}", system_prompt=SYSTEM_PROMPT, adapter=f"adder{k}", sampling=sampling)
        for k in range(1, steps + 1)
    ]


def chain_team(engine: Any, steps: int = 3, sampling: SamplingParams = MESSAGE_SAMPLING) -> Team:
    """adder1 -> adder2 -> ... -> adder{steps} -> END, each with its own LoRA adapter on one base."""
    return Team.from_engine(chain_roles(steps, sampling), engine, name="chain")
