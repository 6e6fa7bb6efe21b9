"""Fixtures of the serving tests: a training-run directory with real saved adapter versions, a served team.

`serve_in_background(config)` is `teamtr serve` (serving/server.py's `build_server`) on a real uvicorn server
in a thread of its own (tests/support/background_server.py), on a free localhost port.

The adapters are real peft LoRA directories written by the embedded engine's `save_adapter` (what the
trainer writes after each accepted update), with seeded random non-zero weights so versions differ
(teamtr.engines.random_adapters).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from teamtr.engines.random_adapters import CHAIN_ROLES as ROLES
from teamtr.engines.random_adapters import write_versions
from teamtr.graphs.trajectory import Trajectory
from teamtr.serving.server import ServeConfig, Server, build_server
from tests.support.background_server import BackgroundServer

__all__ = ["ROLES", "ROLES_FACTORY", "adapter_config", "make_run_dir", "serve_in_background", "write_versions"]

ROLES_FACTORY = "teamtr.graphs.chain_team:chain_roles"


def make_run_dir(model_dir: Path, run_dir: Path, versions: int = 2) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(
        yaml.safe_dump({"team": {"roles": ROLES_FACTORY, "model": str(model_dir)}})
    )
    return write_versions(model_dir, run_dir, range(1, versions + 1))


def adapter_config(path: Path) -> dict:
    return json.loads((path / "adapter_config.json").read_text())


def serve_in_background(
    config: ServeConfig,
    engine: Any | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
) -> BackgroundServer[Server]:
    return BackgroundServer(lambda: build_server(config, engine=engine, on_trajectory=on_trajectory))
