"""The convention family (tasks/convention.py): seeded generator, exact verifier (either notation,
only if used consistently), demonstrations that verify, and its warm-start team's message check."""

from __future__ import annotations

import pytest

from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.tasks import get_task, task_names
from teamtr.tasks.convention import ConventionChain, partial_sums
from teamtr.training.warmstart.config import warm_config_for
from teamtr.training.warmstart.teams import ConventionTeam, warm_team


def instance(ops: list[int], reversed_digits: bool = False) -> TaskInstance:
    return TaskInstance(
        id="t",
        prompt="+".join(map(str, ops)),
        answer=sum(ops),
        meta={"operands": ops, "reversed": reversed_digits},
    )


def test_registered_and_generator_is_deterministic_per_seed() -> None:
    assert "convention" in task_names()
    family = get_task("convention")
    assert isinstance(family, TaskFamily)
    a, b, c = family.generate(20, 3), family.generate(20, 3), family.generate(20, 4)
    assert [(x.id, x.prompt, x.meta) for x in a] == [(x.id, x.prompt, x.meta) for x in b]
    assert [x.prompt for x in a] != [x.prompt for x in c]
    assert family.generate(5, 3)[4].prompt == a[4].prompt  # instance i does not depend on n
    assert {x.meta["reversed"] for x in a} == {True, False}  # both notations are demonstrated
    for x in a:
        ops = [int(v) for v in x.prompt.split("+")]
        assert len(ops) == 4 and all(1 <= v <= 9 for v in ops) and x.answer == sum(ops)


def test_knobs_and_typos() -> None:
    family = get_task("convention")
    easy = family.generate(3, 0, steps=1, max_operand=2)
    assert all(len(x.meta["operands"]) == 2 and max(x.meta["operands"]) <= 2 for x in easy)
    with pytest.raises(ValueError, match="unknown difficulty knob"):
        family.generate(1, 0, stpes=2)
    with pytest.raises(ValueError):
        ConventionChain(steps=0)


def test_messages_by_hand() -> None:
    ops = [3, 7, 9, 5]
    assert partial_sums(ops) == [10, 19, 24]
    assert [ConventionChain.message(ops, i, False) for i in range(3)] == ["10:9+5", "10,19:5", "10,19,24"]
    assert [ConventionChain.message(ops, i, True) for i in range(3)] == ["01:9+5", "01,91:5", "01,91,42"]


def test_verifier_accepts_either_notation_only_if_used_consistently() -> None:
    family, inst = ConventionChain(), instance([3, 7, 9, 5])
    assert family.verify(inst, "10,19,24") == 1.0
    assert family.verify(inst, "01,91,42") == 1.0
    assert family.verify(inst, "earlier line\n01,91,42\n") == 1.0
    for wrong in ("01,19,24", "10,91,42", "10,19,42", "24", "10,19", "10,19,25", "10,19,24,", "10:19,24", ""):
        assert family.verify(inst, wrong) == 0.0, wrong
    assert family.extract_answer("01,91,42") == "24"
    assert family.extract_answer("10,19,24") == "24"
    assert family.extract_answer("10,19:5") is None


def test_one_digit_sums_read_the_same_in_both_notations() -> None:
    family, inst = ConventionChain(), instance([3, 4, 2, 8])  # sums 7, 9, 17
    assert ConventionChain.message([3, 4, 2, 8], 1, True) == ConventionChain.message([3, 4, 2, 8], 1, False)
    assert family.verify(inst, "7,9,17") == family.verify(inst, "7,9,71") == 1.0
    assert family.verify(inst, "7,9,18") == 0.0


def test_demonstrations_verify_and_the_warm_team_checks_messages() -> None:
    family, team = warm_team(warm_config_for("convention"))
    assert isinstance(team, ConventionTeam) and family.name == "convention" and len(team.roles) == 3
    for inst in family.generate(40, 9):
        last = len(team.roles) - 1
        assert family.verify(inst, team.demonstration(inst, last)) == 1.0
        assert family.verify(inst, ConventionChain.alternative(inst, last)) == 1.0
        for i in range(len(team.roles)):
            assert team.message_ok(inst, i, team.demonstration(inst, i))
            assert not team.message_ok(inst, i, team.demonstration(inst, i) + "1")
        assert team.message_ok(inst, 0, ConventionChain.alternative(inst, 0))  # the first role may choose
    inst = instance([3, 7, 9, 5], reversed_digits=True)  # 01 written: the notation is visible
    assert not team.message_ok(inst, 1, "10,19:5")
    assert team.message_ok(inst, 1, "01,91:5")
    inst = instance([3, 4, 2, 8], reversed_digits=True)  # 7 written: still undecided for role 2
    assert team.message_ok(inst, 1, "7,9:8") and team.message_ok(inst, 2, "7,9,17")
