"""The team and task of the `teamtr improve` tests (importable by a `teamtr improve` subprocess through
PYTHONPATH): the chain team's three roles with short messages on a tiny random model, and a verifier
family whose answers a random model gets right about half the time, so TeamTR raises it within a few
updates (the final message starts with a character before "P": a digit, punctuation or A-O), with
`answer_for` so served prompts can be scored."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from teamtr.evals.tasks import register, task_names
from teamtr.graphs.chain_team import chain_roles
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.task import TaskInstance
from teamtr.serving.embedded import EmbeddedEngine, LoraSettings

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


if TASK not in task_names():
    register(LowStart)


def roles():
    return chain_roles(sampling=SamplingParams(temperature=1.0, max_new_tokens=2, stop=("\n",)))


def served_run(model_dir: Path, run_dir: Path, weaken: float = 0.5) -> Path:
    """A served run: adder1 and adder3 at v1 = the base model, adder2 at v1 = a damaged version."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "task": {"name": TASK},
        "team": {
            "roles": "improve_fixtures:roles",
            "model": str(model_dir),
            "lora_rank": 4,
            "lora_alpha": 64,
        },
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    lora = LoraSettings(r=4, alpha=64)  # every linear layer, as the run's team.lora_targets: null
    engine = EmbeddedEngine(model_dir, adapters={r: None for r in ROLES}, threads=1, lora=lora)
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in engine.adapter_parameters("adder2").items():
            if "lora_B" in name:
                p.normal_(0, weaken)
    for r in ROLES:
        engine.save_adapter(r, run_dir / "adapters" / r / "v1")
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
