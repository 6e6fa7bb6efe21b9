"""ZebraLogic (grid mode): the puzzle text, and ZeroEval's checking of a JSON solution grid.

The model writes JSON `{"reasoning": ..., "solution": {"House 1": {"Name": ..., ...}, ...}}`; the last
complete JSON object in its output is parsed. A cell is right when it equals the truth after
`.lower().strip()` (the first element if a list is given). A puzzle counts only when every cell is right
(puzzle accuracy, the reward); `cell_accuracy` is the fraction of cells right. Difficulty: ZeroEval's
"easy" sizes 2*2..2*6 and 3*2, 3*3; the rest are "hard".
"""

from __future__ import annotations

import json
from pathlib import Path

from teamtr.graphs.task import TaskInstance
from teamtr.tasks.datasets.paths import benchmarks_dir, require_file

EASY_SIZES = {"2*2", "2*3", "2*4", "2*5", "2*6", "3*2", "3*3"}
OUTPUT_FORMAT = (
    'Answer with JSON: {"reasoning": "...", "solution": {"House 1": {"<feature>": "<value>", ...}, ...}}'
)


def last_json_object(text: str) -> dict | None:
    """The last complete JSON object in a text (objects may nest)."""
    decoder = json.JSONDecoder()
    found = None
    i = text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            found = obj
        i = text.find("{", end)
    return found


def _cell(value) -> str:
    if isinstance(value, list):
        value = value[0] if value else ""
    return str(value).lower().strip()


class ZebraLogicGrid:
    name = "zebralogic"
    description = "ZebraLogic grid puzzles, ZeroEval puzzle accuracy"

    def generate(self, n: int, seed: int, **difficulty):
        raise NotImplementedError("zebralogic is a benchmark file; use load_zebralogic")

    def extract_answer(self, response: str) -> str | None:
        obj = last_json_object(response)
        return json.dumps(obj.get("solution")) if obj and isinstance(obj.get("solution"), dict) else None

    def cells(self, instance: TaskInstance, response: str) -> tuple[int, int]:
        """(cells right, cells total)."""
        header, rows = instance.answer["header"], instance.answer["rows"]
        total = len(rows) * (len(header) - 1)
        obj = last_json_object(response)
        solution = obj.get("solution") if obj else None
        if not isinstance(solution, dict):
            return 0, total
        right = 0
        for row in rows:
            house = solution.get(f"House {row[0]}")
            if not isinstance(house, dict):
                continue
            for feature, truth in zip(header[1:], row[1:], strict=True):
                right += feature in house and _cell(house[feature]) == _cell(truth)
        return right, total

    def cell_accuracy(self, instance: TaskInstance, response: str) -> float:
        right, total = self.cells(instance, response)
        return right / total if total else 0.0

    def verify(self, instance: TaskInstance, response: str) -> float:
        right, total = self.cells(instance, response)
        return float(total > 0 and right == total)


def load_zebralogic(root: str | Path | None = None) -> tuple[ZebraLogicGrid, list[TaskInstance]]:
    import pyarrow.parquet as pq

    path = require_file(
        benchmarks_dir(root) / "zebralogic" / "grid_mode" / "test-00000-of-00001.parquet", "ZebraLogic"
    )
    rows = pq.read_table(path).to_pylist()
    instances = [
        TaskInstance(
            id=row["id"],
            prompt=f"{row['puzzle']}\n\n{OUTPUT_FORMAT}",
            answer={
                "header": list(row["solution"]["header"]),
                "rows": [list(r) for r in row["solution"]["rows"]],
            },
            difficulty="easy" if row["size"] in EASY_SIZES else "hard",
            meta={"size": row["size"]},
        )
        for row in rows
    ]
    return ZebraLogicGrid(), instances
