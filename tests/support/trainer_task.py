"""The task and team of the trainer tests (tests/training/test_trainer.py and the tests that reuse its
config), registered when this module is imported.

The team is the chain team's three roles with short messages (a random model rarely writes the stop
newline); the task rewards a final message that starts with a digit, which a random model does often
enough to give every group a reward spread. A subprocess that trains this config (a runner script, a
torchrun rank) imports it through `RUNNER_IMPORT`.
"""

from __future__ import annotations

from pathlib import Path

from teamtr.graphs.chain_team import chain_roles
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskInstance
from teamtr.tasks import register, task_names

TASK = "test-digit-start"
ODD_TASK = "test-odd-start"  # a reward near 50/50 for a random model: almost every batch has a spread
ROLES_FACTORY = "tests.support.trainer_task:roles"  # team.roles of the trainer tests' configs

# the first lines of a script that trains these configs in its own process
RUNNER_IMPORT = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
import tests.support.trainer_task  # registers the test task
"""


class DigitStart:
    name = TASK
    description = "test task: the team's final message starts with a digit"

    def generate(self, n: int, seed: int, **knobs) -> list[TaskInstance]:
        return [TaskInstance(id=f"d-{seed}-{i}", prompt=f"{i}+{seed % 7}", answer=None) for i in range(n)]

    def extract_answer(self, response: str) -> str | None:
        return response[:1] or None

    def verify(self, instance: TaskInstance, response: str) -> float:
        return float(response[:1].isdigit())


class OddStart(DigitStart):
    """For a test that needs an update to move (a new version): reward 1 iff the final message starts
    with a character of odd code point, about half of a random model's messages, so a batch whose every
    advantage is 0 (no update, no version) is as good as impossible."""

    name = ODD_TASK
    description = "test task: the team's final message starts with a character of odd code point"

    def verify(self, instance: TaskInstance, response: str) -> float:
        return float(bool(response) and ord(response[0]) % 2 == 1)


def roles() -> list[Role]:
    return chain_roles(sampling=SamplingParams(temperature=1.0, max_new_tokens=4, stop=("\n",)))


for _task in (DigitStart, OddStart):
    if _task.name not in task_names():
        register(_task)
