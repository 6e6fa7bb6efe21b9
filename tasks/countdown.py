"""Countdown: combine the given numbers with + - * / into an expression equal to the target.

Instances come from reasoning-gym's Countdown generator (numbers, target, one reference expression);
the prompt is ours and short (`3,5,7->22`), because the small models read one character per token.
The verifier is ours too: reasoning-gym's scorer evaluates answers with `sympy.parse_expr` (which runs
`eval` on the model's text) and gives partial credit for a wrong answer; here an answer is parsed as a
Python AST with only numbers, + - * / and parentheses allowed, and evaluated exactly with fractions.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from teamtr.graphs.task import TaskInstance
from teamtr.tasks._knobs import KnobbedFamily
from teamtr.tasks._text import last_line, seeded_rng
from teamtr.tasks.family_settings import WarmStart

_EXPRESSION = re.compile(r"[\d+\-*/() ]+")
_BINARY_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


@dataclass(frozen=True)
class CountdownDifficulty:
    """Difficulty knobs. Defaults: 3 numbers from 1..9, target 1..30 (2 numbers, max 5 is very easy)."""

    numbers: int = 3  # how many numbers must be combined (>= 2)
    max_value: int = 9  # numbers are drawn from 1..max_value
    max_target: int = 30  # the target lies in 1..max_target

    def __post_init__(self) -> None:
        if self.numbers < 2:
            raise ValueError("countdown: numbers must be >= 2")
        if self.max_value < 1 or self.max_target < 1:
            raise ValueError("countdown: max_value and max_target must be >= 1")


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
    """Exact value of an arithmetic expression and the integer literals it uses (ValueError if not one)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an expression: {text!r}") from e
    used: list[int] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("division by zero")
            return _BINARY_OPS[type(node.op)](left, right)
        raise ValueError(f"only integers, + - * / and parentheses are allowed: {ast.dump(node)}")

    return value(tree.body), used


class Countdown(KnobbedFamily[CountdownDifficulty]):
    name = "countdown"
    description = "combine all given numbers once each with + - * / to reach the target (reasoning-gym)"
    knobs_type = CountdownDifficulty
    system_prompt = "Write an expression."
    warm_start = WarmStart(dict(max_steps=1200))  # reaches its band within it

    def generate(self, n: int, seed: int, **difficulty: int) -> list[TaskInstance]:
        from reasoning_gym.games.countdown import CountdownConfig, CountdownDataset

        knobs = self.knobs(difficulty)
        config = CountdownConfig(
            min_numbers=knobs.numbers,
            max_numbers=knobs.numbers,
            min_value=1,
            max_value=knobs.max_value,
            min_target=1,
            max_target=knobs.max_target,
            seed=seeded_rng(self.name, seed, knobs).randrange(2**31),
            size=n,
        )
        dataset = CountdownDataset(config)
        out = []
        for i in range(n):
            item = _first_valid(dataset, i, n)
            numbers, target = item["metadata"]["numbers"], item["metadata"]["target"]
            out.append(
                TaskInstance(
                    id=self.instance_id(seed, knobs, i),
                    prompt=f"{','.join(map(str, numbers))}->{target}",
                    answer=target,
                    difficulty=f"numbers={knobs.numbers},max={knobs.max_value}",
                    meta={"numbers": numbers, "target": target, "reference": item["answer"]},
                )
            )
        return out

    @staticmethod
    def demonstration(instance: TaskInstance, role_index: int) -> str:
        """Warm-start data: every role of a generic team writes one canonical answer, the first
        expression without parentheses that reaches the target (numbers in the prompt's order first,
        operators tried in the order + - * /), else reasoning-gym's reference. One fixed answer per prompt
        is easier to learn than the reference's arbitrary form (docs/evals.md, "Headroom")."""
        numbers, target = instance.meta["numbers"], instance.meta["target"]
        return _first_flat_expression(numbers, target) or str(instance.meta["reference"]).replace(" ", "")

    def extract_answer(self, response: str) -> str | None:
        """The last line, as an expression; a trailing `=target` is tolerated and dropped."""
        line = last_line(response)
        if line is None:
            return None
        line = line.split("=")[0].strip()
        return line if line and _EXPRESSION.fullmatch(line) else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        expression = self.extract_answer(response)
        if expression is None:
            return 0.0
        try:
            value, used = evaluate_expression(expression)
        except (ValueError, RecursionError):
            return 0.0
        uses_each_once = Counter(used) == Counter(instance.meta["numbers"])
        return float(uses_each_once and value == instance.meta["target"])


def _first_flat_expression(numbers: list[int], target: int) -> str | None:
    for order in dict.fromkeys(itertools.permutations(numbers)):
        for ops in itertools.product("+-*/", repeat=len(numbers) - 1):
            text = "".join(f"{n}{op}" for n, op in zip(order, ops, strict=False)) + str(order[-1])
            try:
                if evaluate_expression(text)[0] == target:
                    return text
            except ValueError:  # division by zero
                continue
    return None


def _first_valid(dataset, index: int, stride: int) -> dict:
    """reasoning-gym gives up on a seed after 100 tries when no target fits the range: try the next."""
    for attempt in range(50):
        try:
            return dataset[index + attempt * stride]
        except ValueError:
            continue
    raise ValueError("countdown: no instance fits these knobs; raise max_target or max_value")
