"""`teamtr serve` in a process of its own, forked from a forkserver that imported teamtr once
(`PRELOAD`): a server a test can SIGKILL and start again in seconds (tests/serving/test_kill.py)."""

from __future__ import annotations

import asyncio

from teamtr.cli.serve import _serve_forever
from teamtr.serving.server import ServeConfig

# what a start imports, lazily or not; the forkserver imports them by name (it ignores the tests' path)
PRELOAD = [
    "teamtr.cli.serve",
    "teamtr.engines.embedded",
    "transformers.models.llama.modeling_llama",
    "peft",
    "aiosqlite",
    "langgraph.checkpoint.sqlite.aio",
    "uvicorn",
]


def serve(config_json: str) -> None:
    asyncio.run(_serve_forever(ServeConfig.model_validate_json(config_json)))
