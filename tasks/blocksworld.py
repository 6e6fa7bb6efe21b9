"""Blocksworld planning in the style of PlanBench (plan generation), validated by STRIPS semantics.

The domain is the 4-operator Blocksworld PlanBench uses (pick-up, put-down, stack, unstack). Plans are
validated by pyperplan: the PDDL domain and problem are parsed and grounded by pyperplan, and each
action of a plan must be one of the grounded operators, applicable in the current state; the plan is
correct iff the goal holds at the end (like VAL in PlanBench; optimality is not required). The
reference plan is pyperplan's breadth-first search (optimal in the number of actions).

Compact format (one character per token for the small models): stacks listed bottom to top.

    have ab,c want ca
    unstack b a,put b,pick c,stack c a

`have ab,c`: b is on a, a and c are on the table; `want ca`: a on c (blocks not in a want-stack are free).
The final line of the team's last message is the plan, actions separated by commas.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass

from teamtr.graphs.task import TaskInstance
from teamtr.tasks._knobs import KnobbedFamily
from teamtr.tasks._text import last_line
from teamtr.tasks.family_settings import WarmStart

DOMAIN_PDDL = """
(define (domain blocksworld-4ops)
  (:requirements :strips)
  (:predicates (clear ?x) (ontable ?x) (handempty) (holding ?x) (on ?x ?y))
  (:action pick-up
    :parameters (?ob)
    :precondition (and (clear ?ob) (ontable ?ob) (handempty))
    :effect (and (holding ?ob) (not (clear ?ob)) (not (ontable ?ob)) (not (handempty))))
  (:action put-down
    :parameters (?ob)
    :precondition (holding ?ob)
    :effect (and (clear ?ob) (handempty) (ontable ?ob) (not (holding ?ob))))
  (:action stack
    :parameters (?ob ?underob)
    :precondition (and (clear ?underob) (holding ?ob))
    :effect (and (handempty) (clear ?ob) (on ?ob ?underob) (not (clear ?underob)) (not (holding ?ob))))
  (:action unstack
    :parameters (?ob ?underob)
    :precondition (and (on ?ob ?underob) (clear ?ob) (handempty))
    :effect (and (holding ?ob) (clear ?underob) (not (on ?ob ?underob)) (not (clear ?ob)) (not (handempty)))))
"""

# compact verb -> PDDL action name
VERBS = {"pick": "pick-up", "put": "put-down", "stack": "stack", "unstack": "unstack"}
_ARITY = {"pick-up": 1, "put-down": 1, "stack": 2, "unstack": 2}
_ACTION = re.compile(r"^\(?\s*([a-z-]+)((?:\s+[a-z0-9_-]+)+)\s*\)?$")


@dataclass(frozen=True)
class BlocksworldDifficulty:
    """Defaults: 3 blocks. 2 blocks is very easy; PlanBench uses 4-5 (plans of 2-16 actions)."""

    blocks: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.blocks <= 8:
            raise ValueError("blocksworld: blocks must be in 1..8")


def problem_pddl(init_stacks: list[str], goal_on: list[tuple[str, str]], name: str = "p") -> str:
    """A PDDL problem: stacks are strings of block letters bottom to top; goal_on are (top, under)."""
    blocks = sorted("".join(init_stacks))
    init = ["(handempty)"]
    for stack in init_stacks:
        init.append(f"(ontable {stack[0]})")
        init += [f"(on {top} {under})" for under, top in itertools.pairwise(stack)]
        init.append(f"(clear {stack[-1]})")
    goal = " ".join(f"(on {top} {under})" for top, under in goal_on)
    return (
        f"(define (problem {name}) (:domain blocksworld-4ops) (:objects {' '.join(blocks)})\n"
        f"  (:init {' '.join(init)})\n  (:goal (and {goal})))"
    )


@functools.lru_cache(maxsize=4096)
def ground(domain: str, problem: str):
    """pyperplan's grounded STRIPS task (all operators kept, so legal but useless moves stay legal)."""
    from pyperplan.grounding import ground as pyperplan_ground
    from pyperplan.pddl.parser import Parser

    parser = Parser(None)
    parser.domInput, parser.probInput = domain, problem
    parsed = parser.parse_problem(parser.parse_domain(read_from_file=False), read_from_file=False)
    return pyperplan_ground(
        parsed, remove_statics_from_initial_state=False, remove_irrelevant_operators=False
    )


def to_pddl_action(text: str) -> str | None:
    """`stack c a` / `(stack c a)` / `(pick-up a)` -> `(stack c a)`; None if it is not an action."""
    match = _ACTION.match(text.strip().lower())
    if match is None:
        return None
    verb, args = match.group(1), match.group(2).split()
    verb = VERBS.get(verb, verb)
    if _ARITY.get(verb) != len(args):
        return None
    return f"({verb} {' '.join(args)})"


def validate_plan(task, actions: list[str]) -> tuple[bool, str]:
    """Simulate a plan of PDDL actions on a grounded task: (reaches the goal, why not)."""
    operators = {op.name: op for op in task.operators}
    state = task.initial_state
    for step, action in enumerate(actions, 1):
        op = operators.get(action)
        if op is None:
            return False, f"step {step}: {action} is not an action of this problem"
        if not op.applicable(state):
            return False, f"step {step}: {action} is not applicable"
        state = op.apply(state)
    if not task.goal_reached(state):
        return False, "the goal does not hold at the end"
    return True, "ok"


def optimal_plan(task) -> list[str]:
    from pyperplan.search import breadth_first_search

    plan = breadth_first_search(task)
    if plan is None:
        raise ValueError("blocksworld: unsolvable problem")
    return [op.name for op in plan]


def compact_action(pddl_action: str) -> str:
    verb, *args = pddl_action.strip("()").split()
    short = {v: k for k, v in VERBS.items()}[verb]
    return " ".join([short, *args])


class Blocksworld(KnobbedFamily[BlocksworldDifficulty]):
    name = "blocksworld"
    description = "Blocksworld plan generation (PlanBench style), plans validated with pyperplan"
    knobs_type = BlocksworldDifficulty
    system_prompt = "Write a plan."
    max_new_tokens = 96  # a 3-block plan is up to ~70 characters
    # plans written by every role: long sequences, slow steps and evaluations (not learnt within this budget)
    warm_start = WarmStart(
        dict(
            max_steps=800,
            batch_size=8,
            eval_every=80,
            eval_tasks=64,
            final_eval_tasks=128,
            sampled_eval_tasks=48,
        )
    )

    def generate(self, n: int, seed: int, **difficulty: int) -> list[TaskInstance]:
        knobs = self.knobs(difficulty)
        blocks = [chr(ord("a") + i) for i in range(knobs.blocks)]
        out = []
        for i in range(n):
            rng = self.instance_rng(seed, knobs, i)
            while True:
                init, goal_stacks = _random_stacks(rng, blocks), _random_stacks(rng, blocks)
                goal_on = [(top, under) for s in goal_stacks for under, top in itertools.pairwise(s)]
                problem = problem_pddl(init, goal_on)
                task = ground(DOMAIN_PDDL, problem)
                if goal_on and not task.goal_reached(task.initial_state):
                    break
            reference = [compact_action(a) for a in optimal_plan(task)]
            wanted = [s for s in goal_stacks if len(s) > 1]
            out.append(
                TaskInstance(
                    id=self.instance_id(seed, knobs, i),
                    prompt=f"have {','.join(init)} want {','.join(wanted)}",
                    answer=",".join(reference),  # one optimal plan; any valid plan is correct
                    difficulty=f"blocks={knobs.blocks}",
                    meta={"domain": DOMAIN_PDDL, "problem": problem, "optimal_length": len(reference)},
                )
            )
        return out

    @staticmethod
    def demonstration(instance: TaskInstance, role_index: int) -> str:
        """Warm-start data: every role of a generic team writes the optimal reference plan (the verifier accepts it)."""
        return str(instance.answer)

    def extract_answer(self, response: str) -> str | None:
        return last_line(response)

    def parse_plan(self, response: str) -> list[str] | None:
        """The final line's comma-separated actions as PDDL actions; None if any is not an action."""
        line = self.extract_answer(response)
        if line is None:
            return None
        actions = [to_pddl_action(part) for part in line.split(",") if part.strip()]
        return None if not actions or None in actions else actions  # type: ignore[return-value]

    def verify(self, instance: TaskInstance, response: str) -> float:
        actions = self.parse_plan(response)
        if actions is None:
            return 0.0
        ok, _ = validate_plan(ground(instance.meta["domain"], instance.meta["problem"]), actions)
        return float(ok)


def _random_stacks(rng, blocks: list[str]) -> list[str]:
    """A uniformly shuffled order cut into random stacks (bottom to top)."""
    order = blocks[:]
    rng.shuffle(order)
    stacks, current = [], order[0]
    for block in order[1:]:
        if rng.random() < 0.5:
            current += block
        else:
            stacks.append(current)
            current = block
    stacks.append(current)
    return sorted(stacks)
