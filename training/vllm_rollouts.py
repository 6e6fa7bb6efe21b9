"""`rollout.engine: vllm`: the training team's rollouts sampled by vLLM, the trainer's adapters pushed to it.

The trainer keeps its `EmbeddedEngine`: it holds the trainable LoRA parameters and computes every
log-prob of the update (training/policy.py). The team it rolls out through talks to `VLLMRollouts`
instead, a `VLLMEngine` (engines/vllm_engine.py) over a server attached at `rollout.vllm_url` or launched
here for each base model (engines/open.py `open_engine`; `close()` stops what was launched).

Versions: `VLLMEngine` counts its own loads (0 at the first, +1 per in-place reload), which is not the
trainer's version after a resume, nor on a server that loaded the adapter before. So every push says
which trainer version the directory holds (`push(adapter, adapters/<adapter>/v<N>, N)`) and every
Generation records that version: a turn's `adapter_version` is the trainer's version whichever engine
sampled it. Rollouts of an adapter never pushed are refused (they would be of some other policy).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from teamtr.engines.open import OpenedEngine
from teamtr.engines.vllm_engine import VLLMEngine
from teamtr.engines.vllm_replicas import VLLMReplicaEngine
from teamtr.engines.vllm_server import VLLMServer
from teamtr.graphs.engine import DEFAULT_BASE, Generation, SamplingParams


@dataclass
class VLLMRollouts:
    """The Engine the training team samples through in vLLM mode (tokenizer, generate, versions)."""

    engine: VLLMEngine | VLLMReplicaEngine  # one server per base, or several (engines/vllm_replicas.py)
    servers: list[VLLMServer] = field(default_factory=list)  # launched here: stopped by close()
    pushed: dict[tuple[str, str], int] = field(default_factory=dict)  # (base, adapter) -> trainer version
    push_seconds: float = 0.0  # wall time of every push so far

    # ---- the Engine protocol, as the team's chat models use it ------------------------------------
    def tokenizer(self, base: str = DEFAULT_BASE) -> Any:
        return self.engine.tokenizer(base)

    def base_models(self) -> list[str]:
        return self.engine.base_models()

    def adapters(self, base: str = DEFAULT_BASE) -> list[str]:
        return [a for b, a in self.pushed if b == base]

    def adapter_version(self, adapter: str | None, base: str = DEFAULT_BASE) -> int:
        """The trainer's version last pushed for `adapter` (0 for the base policy)."""
        if adapter is None:
            return 0
        try:
            return self.pushed[(base, adapter)]
        except KeyError:
            raise KeyError(
                f"adapter {adapter!r} on base {base!r} was never pushed to vLLM; have {self.adapters(base)}"
            ) from None

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        adapter: str | None,
        sampling: SamplingParams,
        base: str = DEFAULT_BASE,
    ) -> Generation:
        version = self.adapter_version(adapter, base)  # read before the request: the version it runs on
        gen = await self.engine.generate(prompt_ids, adapter=adapter, sampling=sampling, base=base)
        return dataclasses.replace(gen, adapter_version=version, extra={**gen.extra, "engine": "vllm"})

    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None,
        base: str = DEFAULT_BASE,
    ) -> list[list[float]]:
        return self.engine.score(prompts, completions, adapter, base)

    # ---- adapters ---------------------------------------------------------------------------------
    def push(self, adapter: str, path: str | Path, version: int, base: str = DEFAULT_BASE) -> float:
        """Load the saved adapter directory `path` (the trainer's `version` of it) into vLLM under the
        adapter's name, replacing the served one in place; returns the seconds it took."""

        async def load() -> None:
            try:
                await self.engine.load_adapter(adapter, str(path), base)
            finally:  # the client belongs to this call's event loop
                await self.engine.aclose()

        t0 = time.perf_counter()
        asyncio.run(load())
        self.pushed[(base, adapter)] = version
        seconds = time.perf_counter() - t0
        self.push_seconds += seconds
        return seconds

    def sync(self, current: Mapping[tuple[str, str], tuple[int, Path]]) -> list[str]:
        """Push every (base, adapter) -> (version, directory) whose version vLLM does not serve yet (the
        start of a run, a resume); returns the adapters pushed."""
        stale = [(key, v) for key, v in current.items() if self.pushed.get(key) != v[0]]
        for (base, adapter), (version, path) in stale:
            self.push(adapter, path, version, base)
        return [adapter for (_, adapter), _ in stale]

    def close(self) -> None:
        """Stop the servers launched for this run (an attached server keeps running)."""
        OpenedEngine(self.engine, self.servers).close()
