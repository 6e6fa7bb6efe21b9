"""The team a warm start trains: its roles on an instance, what each role is demonstrated to write, and
when a message counts as right.

It is the team `teamtr eval` runs for that family (tasks/roles.py):
- `chain`: the demo's adders; role k writes the running sum after addition k (`10+9+5`, `19+5`, `24`);
- `split`: generic solvers, role i sees its private table; role i writes its own lookup of the symbol
  the previous role wrote (the hand-off), the last role's lookup is the answer;
- `convention`: generic solvers; role i writes the partial sums so far in the instance's demonstrated
  notation (`ConventionChain.demonstration`); the other notation is right too while the transcript
  reads the same in both (always for role 1);
- every other family: generic solvers with the family's short system prompt; every role writes the
  family's reference answer (`family.demonstration`) on the correct transcript so far, so role 1 solves
  the task and the later roles learn to check / pass on the answer.
"""

from __future__ import annotations

from teamtr.graphs.chain_team import chain_roles
from teamtr.graphs.roles import Role, with_view
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.tasks import get_task
from teamtr.tasks.chain import ChainArithmetic
from teamtr.tasks.convention import ConventionChain
from teamtr.training.warmstart.config import WarmStartConfig


class WarmTeam:
    """The generic team of `teamtr eval` for a family: role i (0-based) acts with
    `with_private_view(role_i, family, instance, i)` and is demonstrated `family.demonstration(instance, i)`
    (the family's reference answer, or for `split` its own lookup)."""

    def __init__(self, family: TaskFamily, roles: list[Role]) -> None:
        if not hasattr(family, "demonstration"):
            raise ValueError(
                f"task {family.name!r} has no demonstration(instance, role_index): no warm start"
            )
        self.family, self.roles = family, roles

    def roles_for(self, instance: TaskInstance) -> list[Role]:
        from teamtr.tasks.roles import with_private_view

        return [with_private_view(r, self.family, instance, i) for i, r in enumerate(self.roles)]

    def demonstration(self, instance: TaskInstance, index: int) -> str:
        return self.family.demonstration(instance, index)

    def message_ok(self, instance: TaskInstance, index: int, message: str) -> bool:
        """The demonstrated message, or, where that message is itself a full answer, any answer the
        verifier accepts (another valid plan, arrangement or expression)."""
        demo = self.demonstration(instance, index)
        if message == demo:
            return True
        return self.family.verify(instance, demo) == 1.0 and self.family.verify(instance, message) == 1.0

    def max_new_tokens(self, instances: list[TaskInstance]) -> int:
        """Room for the longest demonstrated message and a little more (a wrong answer may be longer)."""
        longest = max(len(self.demonstration(i, k)) for i in instances for k in range(len(self.roles)))
        return longest + 8


class ChainTeam(WarmTeam):
    """The chain demo's adders: role k writes the running sum after addition k+1 (joined by `separator`)."""

    def __init__(self, family: ChainArithmetic, roles: list[Role], separator: str = "+") -> None:
        self.family, self.roles, self.separator = family, roles, separator

    def demonstration(self, instance: TaskInstance, index: int) -> str:
        return ChainArithmetic.demonstration(instance.meta["operands"], index + 1, self.separator)

    def message_ok(self, instance: TaskInstance, index: int, message: str) -> bool:
        return message == self.demonstration(instance, index)

    def max_new_tokens(self, instances: list[TaskInstance]) -> int:
        # a message is never longer than the task written with the message protocol's separator
        return max(len(inst.prompt.replace("+", self.separator)) for inst in instances) + 1


class ConventionTeam(WarmTeam):
    """Generic solvers on `convention`: a message is right in the demonstrated notation, or in the other
    one while nothing written so far tells them apart (role 1, or every earlier sum one digit long)."""

    def message_ok(self, instance: TaskInstance, index: int, message: str) -> bool:
        if message == self.demonstration(instance, index):
            return True
        undecided = index == 0 or ConventionChain.alternative(instance, index - 1) == self.demonstration(
            instance, index - 1
        )
        return undecided and message == ConventionChain.alternative(instance, index)


class RelayTeam(WarmTeam):
    """Generic solvers on `relay`, one entry per turn (the first role once, then the others for two
    rounds: tasks/relay.py `speakers`), each with its private view; demonstrated the instance's
    drawn message of that turn (slips and corrections included, at the rates the family sets)."""

    def __init__(self, family: TaskFamily, roles: list[Role]) -> None:
        from teamtr.tasks.relay import speakers

        self.family, self.team_roles = family, roles
        self.turns = speakers(len(roles))
        self.roles = [roles[k] for k in self.turns]

    def roles_for(self, instance: TaskInstance) -> list[Role]:
        views = instance.meta["role_views"]
        return [with_view(self.team_roles[k], views[k]) for k in self.turns]

    def message_ok(self, instance: TaskInstance, index: int, message: str) -> bool:
        return message == self.demonstration(instance, index)


def warm_team(cfg: WarmStartConfig) -> tuple[TaskFamily, WarmTeam]:
    """The task family and the team that `cfg` trains (the team `teamtr eval` runs for that family)."""
    if cfg.task == "chain":
        family = ChainArithmetic(steps=cfg.steps, max_operand=cfg.max_operand)
        return family, ChainTeam(family, chain_roles(cfg.steps), cfg.message_separator)
    from teamtr.tasks.roles import default_roles

    family = get_task(cfg.task, **cfg.task_options)
    if cfg.task == "convention":
        return family, ConventionTeam(family, default_roles(cfg.task, cfg.steps))
    if cfg.task == "relay":
        return family, RelayTeam(family, default_roles(cfg.task, cfg.steps))
    return family, WarmTeam(family, default_roles(cfg.task, cfg.steps))


def as_team(task: TaskFamily | None, team: WarmTeam | list[Role], separator: str = "+") -> WarmTeam:
    """A list of roles means the chain's adders (the original signature of the data and evaluation
    functions, which tests and benchmarks still call with a list)."""
    if isinstance(team, WarmTeam):
        return team
    chain = task if isinstance(task, ChainArithmetic) else ChainArithmetic(steps=len(team))
    return ChainTeam(chain, team, separator)
