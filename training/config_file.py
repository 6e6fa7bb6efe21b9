"""A training config read from its YAML file, with one line of error naming the file and the field: what
`teamtr train` checks first. Light on purpose (pydantic and yaml only, no torch), so a config error is
reported at once; training/run_dir.py re-exports both names.
"""

from __future__ import annotations

from difflib import get_close_matches
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from teamtr.graphs.run_layout import CONFIG_FILE, RunDirError
from teamtr.training.config import TrainConfig

__all__ = ["CONFIG_FILE", "RunDirError", "read_config"]


def _did_you_mean(field: str, known: list[str]) -> str:
    close = get_close_matches(field, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else " (a config written by another version of teamtr?)"


def _known_keys(loc: tuple) -> list[str]:
    """The keys a config section allows: what an unknown key there may have been meant as."""
    model: Any = TrainConfig
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        model = getattr(field, "annotation", None) if field is not None else None
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def read_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """TrainConfig from a YAML file; a missing, malformed or other-version file is one line of error
    naming the file and the first offending field (with the key it was probably meant as)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        return TrainConfig.from_yaml(path, overrides)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        hint = _did_you_mean(str(first["loc"][-1]), _known_keys(first["loc"])) if first["type"] == "extra_forbidden" else ""
        raise RunDirError(f"{path}: {field}: {first['msg']}{more}{hint}") from None
    except (ValueError, yaml.YAMLError) as e:  # not a mapping, a bad schedule block, a YAML syntax error
        raise RunDirError(f"{path}: {' '.join(str(e).split())}") from None


