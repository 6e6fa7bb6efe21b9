"""The team and tasks of the `teamtr improve` tests (importable by a `teamtr improve` subprocess through
PYTHONPATH): the chain team's three roles with short messages on a tiny random model, and two verifier
families, with `answer_for` so served prompts can be scored:

- LowStart: the final message starts with a character before "P" (a digit, punctuation or A-O); one
  answer for every prompt, so a team's held-out accuracy there is one bit shared by all its prompts;
- OwnAnswers: every prompt accepts its own set of first characters (digits and punctuation, which
  every prompt accepts, plus a half of the others, drawn by the prompt): the random team's greedy
  answers are right on some prompts and wrong on others, and a candidate's held-out gain is per-prompt
  evidence (0 where the incumbent was right already, +1 where it was wrong and is now right).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import yaml

from teamtr.engines.embedded import EmbeddedEngine, LoraSettings
from teamtr.engines.random_adapters import randomise_adapters, save_adapters
from teamtr.graphs.chain_team import chain_roles
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.task import TaskInstance
from teamtr.tasks import register, task_names

TASK = "improve-low-start"
ROLES = ("adder1", "adder2", "adder3")


class LowStart:
    name = TASK
    description = "test task: the team's final message starts with a character before 'P'"

    def generate(self, n: int, seed: int, **knobs) -> list[TaskInstance]:
        return [TaskInstance(id=f"d-{seed}-{i}", prompt=f"{seed % 97}+{i}", answer=1) for i in range(n)]

    def answer_for(self, prompt: str) -> int:
        return 1

    def extract_answer(self, response: str) -> str | None:
        return response[:1] or None

    def verify(self, instance: TaskInstance, response: str) -> float:
        return float("!" <= response[:1] < "P")


UNVERIFIABLE = "improve-unverifiable"


class Unverifiable:
    """The same task as the loop sees it when no verifier exists: it cannot give a served prompt's
    answer (no `answer_for`), so `teamtr improve` can score nothing itself (tests/improve/test_feedback.py
    computes LowStart's verdict in the client, out of the loop's sight)."""

    name = UNVERIFIABLE
    description = "test task: LowStart's prompts without a verifier the loop can use"
    generate = LowStart.generate
    extract_answer = LowStart.extract_answer

    def verify(self, instance: TaskInstance, response: str) -> float:
        raise AssertionError("the loop must never score with this task")


OWN_TASK = "improve-own-answers"
EVERYWHERE = ("!", "A")  # first characters [!, A) (digits, punctuation) are right on every prompt


class OwnAnswers:
    name = OWN_TASK
    description = (
        "test task: each prompt accepts digits, punctuation and its own half of the other characters"
    )

    def generate(self, n: int, seed: int, **knobs) -> list[TaskInstance]:
        prompts = [f"{seed % 97}*{i}" for i in range(n)]
        return [TaskInstance(id=f"o-{seed}-{i}", prompt=p, answer=p) for i, p in enumerate(prompts)]

    def answer_for(self, prompt: str) -> str:
        return prompt  # the prompt is the key of its own answer set

    def extract_answer(self, response: str) -> str | None:
        return response[:1] or None

    def accepts(self, prompt: str, response: str) -> bool:
        c = first_char(response)
        return EVERYWHERE[0] <= c < EVERYWHERE[1] or zlib.crc32(f"{prompt}|{c}".encode()) % 2 == 0

    def verify(self, instance: TaskInstance, response: str) -> float:
        return float(self.accepts(str(instance.answer), response))


for family in (LowStart, Unverifiable, OwnAnswers):
    if family.name not in task_names():
        register(family)


def proxy(prompt: str, response: str) -> float:
    """A training reward that is not the verifier: 1 when the final message starts with punctuation or a
    digit ("!" to "@", a subset of what LowStart accepts), so raising it raises the verifier's too."""
    return float("!" <= response[:1] < "A")


def roles():
    return chain_roles(sampling=SamplingParams(temperature=1.0, max_new_tokens=2, stop=("\n",)))


def served_run(model_dir: Path, run_dir: Path, weaken: float = 0.5, task: str = TASK) -> Path:
    """A served run: adder1 and adder3 at v1 = the base model, adder2 at v1 = a damaged version."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "task": {"name": task},
        "team": {
            "roles": "tests.support.improve:roles",
            "model": str(model_dir),
            "lora_rank": 4,
            "lora_alpha": 64,
        },
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    lora = LoraSettings(r=4, alpha=64)  # every linear layer, as the run's team.lora_targets: null
    engine = EmbeddedEngine(model_dir, adapters={r: None for r in ROLES}, threads=1, lora=lora)
    randomise_adapters(engine, ["adder2"], std=weaken, seed=7)
    save_adapters(engine, run_dir, ROLES, version=1)
    return run_dir


CHARS_ENV = "TEAMTR_TEST_GOOD_CHARS"  # the characters a good final message starts with (same_start)


EMPTY = "~"  # stands for an empty final message among the good characters


def first_char(response: str) -> str:
    return response[:1] or EMPTY


def same_start(prompt: str, response: str) -> float:
    """Reward `module:function`: 1 when the final message starts with one of the characters the served
    incumbent's greedy answers start with (the test writes them to $TEAMTR_TEST_GOOD_CHARS; `~`: an
    empty message, which the random model's greedy team mostly answers): the incumbent scores high, a
    wrecked candidate (its outputs moved elsewhere) low."""
    import os

    return float(first_char(response) in os.environ[CHARS_ENV])


def poisoned(prompt: str, response: str) -> float:
    """A poisoned training reward: it prefers exactly the answers `same_start` calls wrong (those that do
    not start as the incumbent's do)."""
    return 1.0 - same_start(prompt, response)
