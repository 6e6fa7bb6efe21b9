"""`rollout.engine: vllm`: the training team's rollouts sampled by vLLM, the trainer's adapters pushed to it.

The trainer keeps its `EmbeddedEngine`: it holds the trainable LoRA parameters and computes every
log-prob of the update (training/policy.py). The team it rolls out through talks to `VLLMRollouts`
instead, a `VLLMEngine` (serving/vllm_engine.py) over a server attached at `rollout.vllm_url` or launched
here for each base model (serving/vllm_server.py; `close()` stops what was launched).

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

from teamtr.graphs.engine import DEFAULT_BASE, Generation, SamplingParams
from teamtr.serving.vllm_engine import VLLMEngine
from teamtr.serving.vllm_replicas import VLLMReplicaEngine, open_replica_engine
from teamtr.serving.vllm_server import (
    VLLMServer,
    VLLMServerConfig,
    attach_vllm_server,
    launch,
)

# LoRA ranks vLLM accepts for --max-lora-rank
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


class RolloutEngineError(ValueError):
    """A `rollout.engine: vllm` setting that cannot work (an attach URL for a team on several bases)."""


@dataclass
class VLLMRollouts:
    """The Engine the training team samples through in vLLM mode (tokenizer, generate, versions)."""

    engine: VLLMEngine | VLLMReplicaEngine  # one server per base, or several (serving/vllm_replicas.py)
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
        self.engine.close()
        for server in self.servers:
            server.stop()


def serving_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds adapters of `rank` (at least 16)."""
    return next((r for r in VLLM_LORA_RANKS if r >= max(rank, 16)), rank)


def open_vllm_rollouts(
    bases: Mapping[str, str],
    *,
    url: str | None,
    dtype: str,
    lora_rank: int,
    adapters: int,
    args: list[str] | tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    urls: list[str] | tuple[str, ...] = (),
    replicas: int = 1,
    parallel: tuple[int, int] = (1, 1),
    devices: list[str] | tuple[str, ...] = (),
) -> VLLMRollouts:
    """Attach to the server at `url` (a team on one base), or launch one server per base model with
    LoRA slots for `adapters` role adapters (+1 for the null adapter the base policy is served through),
    ranks up to `lora_rank`, the trainer's `dtype` (float32 both sides: log-probs agree to ~1e-5).
    Several servers (`urls` attached, or `replicas` per base launched, each over (tensor, pipeline)
    `parallel` GPUs) are spread over by a `VLLMReplicaEngine`; a push then reaches every replica before
    the next rollout (serving/vllm_replicas.py)."""
    if urls or replicas > 1 or parallel != (1, 1):
        if url is not None:
            raise RolloutEngineError("give rollout.vllm_url (one server) or rollout.vllm_urls (replicas), not both")
        try:
            engine, launched = open_replica_engine(
                bases,
                urls=urls,
                replicas=replicas,
                tensor_parallel_size=parallel[0],
                pipeline_parallel_size=parallel[1],
                max_lora_rank=serving_lora_rank(lora_rank),
                max_loras=max(8, adapters + 1),
                dtype=dtype,
                extra_args=args,
                extra_env=env,
                devices=devices,
            )
        except ValueError as e:
            raise RolloutEngineError(str(e)) from None
        return VLLMRollouts(engine, servers=launched)
    if url is not None:
        if len(bases) != 1:
            raise RolloutEngineError(
                f"rollout.vllm_url attaches one server, but the team sits on {len(bases)} bases "
                f"{sorted(bases)}; leave rollout.vllm_url unset to launch one server per base"
            )
        ((name, path),) = bases.items()
        return VLLMRollouts(VLLMEngine({name: attach_vllm_server(url, model_dir=path)}))
    servers: dict[str, VLLMServer] = {}
    try:
        for name, path in bases.items():
            servers[name] = launch(
                VLLMServerConfig(
                    model_dir=path,
                    dtype=dtype,
                    max_lora_rank=serving_lora_rank(lora_rank),
                    max_loras=max(8, adapters + 1),
                    extra_args=tuple(args),
                    extra_env=dict(env or {}),
                )
            )
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return VLLMRollouts(VLLMEngine(servers), servers=list(servers.values()))
