"""AR-Bench test sets: GN (guessing numbers, exact oracle) and DC (detective cases, final pick only).

GN: each item is a secret of 4 distinct digits; the instances are `arbench` task instances with no hints
(digits=4, pool=10, hints=0), so `Arbench.oracle` answers the team's guesses with bulls-and-cows
feedback exactly as AR-Bench does; solved iff the final message states the secret (AR-Bench allows 25
questions: a team graph enforces that with its max-turn guard).
DC: the player sees time, place, victim and five suspects (A-E) and must name the murderer; AR-Bench
answers the player's questions with an LLM that holds the whole case, which has no exact counterpart here,
so only the final pick is verified (`label`, the 0-based index of the murderer).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from teamtr.graphs.task import TaskInstance
from teamtr.tasks._text import last_line
from teamtr.tasks.arbench import Arbench
from teamtr.tasks.datasets.paths import benchmarks_dir, require_file

LETTERS = "ABCDE"


def load_arbench_gn(root: str | Path | None = None) -> tuple[Arbench, list[TaskInstance]]:
    path = require_file(benchmarks_dir(root) / "arbench" / "gn" / "test.json", "AR-Bench GN")
    secrets = json.loads(path.read_text())
    instances = []
    for i, secret in enumerate(secrets):
        if not (len(secret) == 4 and secret.isdigit() and len(set(secret)) == 4):
            raise ValueError(f"{path}: item {i} {secret!r} is not 4 distinct digits")
        instances.append(
            TaskInstance(
                id=f"arbench-gn-{i}",
                prompt="code 4 of 0-9.",
                answer=secret,
                difficulty="gn",
                meta={"digits": 4, "pool": 10, "hints": []},
            )
        )
    return Arbench(digits=4, pool=10, hints=0), instances


class DetectiveCase:
    name = "arbench-dc"
    description = "AR-Bench detective cases: name the murderer (A-E)"

    def generate(self, n: int, seed: int, **difficulty):
        raise NotImplementedError("arbench-dc is a benchmark file; use load_arbench_dc")

    def extract_answer(self, response: str) -> str | None:
        line = last_line(response) or ""
        letters = re.findall(r"\b([A-E])\b", line)
        return letters[-1] if letters else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        return float(self.extract_answer(response) == instance.answer)


def load_arbench_dc(root: str | Path | None = None) -> tuple[DetectiveCase, list[TaskInstance]]:
    path = require_file(benchmarks_dir(root) / "arbench" / "dc" / "test.json", "AR-Bench DC")
    instances = []
    for case in json.loads(path.read_text()):
        info = case["initial_information"]
        suspects = "\n".join(
            f"{LETTERS[i]}. {s['name']}: {s['introduction']}" for i, s in enumerate(info["suspect"])
        )
        victim = info["victim"]
        prompt = (
            f"Time: {info['time']}. Location: {info['location']}.\n"
            f"Victim: {victim['name']}. {victim.get('introduction', '')}\n"
            f"Cause of death: {victim.get('cause_of_death', '')}. Weapon: {victim.get('murder_weapon', '')}.\n"
            f"Suspects:\n{suspects}\nWho is the murderer? End with the letter (A-E)."
        )
        instances.append(
            TaskInstance(
                id=f"arbench-dc-{case['index']}",
                prompt=prompt,
                answer=LETTERS[int(case["label"])],
                difficulty="dc",
                meta={"suspects": [s["name"] for s in info["suspect"]]},
            )
        )
    return DetectiveCase(), instances
