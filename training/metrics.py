"""The run's metrics: one JSON object per line in RUN_DIR/metrics.jsonl, mirrored to TensorBoard.

Each record has a `kind` ("update", "stage", "eval", "run") and a global `step` (the update counter).
On resume, the file is cut back to its length at the checkpoint, so an interrupted and resumed
run writes the same metrics as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from teamtr.graphs.run_layout import METRICS_FILE  # its reader, read_metrics, is there too


class MetricsLog:
    def __init__(self, run_dir: str | Path, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def truncate_to_bytes(self, size: int) -> None:
        """Cut the file back to its length at the checkpoint a run resumes from."""
        if self.path.exists() and self.path.stat().st_size > size:
            with open(self.path, "r+b") as f:
                f.truncate(size)

    def log(self, kind: str, step: int, **values: Any) -> dict[str, Any]:
        record = {"kind": kind, "step": step, **values}
        with open(self.path, "a") as f:
            f.write(json.dumps(record, default=_jsonable) + "\n")
            f.flush()
        if self._tb is not None:
            for key, value in _scalars(values):
                self._tb.add_scalar(f"{kind}/{key}", value, step)
        return record

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()


def _scalars(values: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            yield name, float(value)
        elif isinstance(value, int | float) and math.isfinite(value):
            yield name, float(value)
        elif isinstance(value, dict):
            yield from _scalars(value, prefix=f"{name}/")


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)
