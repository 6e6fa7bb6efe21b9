"""Fixtures of the serving tests: a training-run directory with real saved adapter versions, a served team.

`serve_in_background(config)` is `teamtr serve` (cli/server.py's `build_server`) on a real uvicorn server
in a thread of its own (serving/background.py), on a free localhost port.

The adapters are real peft LoRA directories written by the embedded engine's `save_adapter` (what the
trainer writes after each accepted update), with seeded random non-zero weights so versions differ.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from teamtr.cli.server import ServeConfig, Server, build_server
from teamtr.graphs.trajectory import Trajectory
from teamtr.serving.background import BackgroundServer
from teamtr.serving.embedded import EmbeddedEngine, LoraSettings

ROLES = ("adder1", "adder2", "adder3")
ROLES_FACTORY = "teamtr.graphs.chain_team:chain_roles"


def write_versions(
    model_dir: Path,
    run_dir: Path,
    versions: range,
    roles: tuple[str, ...] = ROLES,
    rank: int = 4,
    target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    scale: float = 0.3,
) -> Path:
    """RUN_DIR/adapters/<role>/v<k>/ for k in `versions` (the layout the trainer writes)."""
    # peft draws the LoRA A matrices from the global generator: seed it, so a test's adapters do not
    # depend on which tests ran before it
    with torch.random.fork_rng():
        torch.manual_seed(0)
        engine = EmbeddedEngine(
            model_dir,
            adapters={r: None for r in roles},
            threads=1,
            lora=LoraSettings(r=rank, alpha=2 * rank, target_modules=target_modules),
        )
    for k in versions:
        torch.manual_seed(1000 * k)
        with torch.no_grad():
            for r in roles:
                for name, p in engine.adapter_parameters(r).items():
                    if "lora_B" in name:
                        p.normal_(0, scale)
                engine.save_adapter(r, run_dir / "adapters" / r / f"v{k}")
    return run_dir


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
