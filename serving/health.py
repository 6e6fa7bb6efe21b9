"""Readiness: the engine answers a one-token probe on every base model, and every adapter version that
new episodes would pin is loaded in the engine (asked of the engine itself, not the registry's records).

A vLLM server that restarted lost its runtime-loaded adapters: the probe has the engine load them again
(engines/vllm_engine.py `restore_adapters`), so readiness comes back once the server answers.

`/health/live` only says the process answers; `/health` (teams, versions, in flight) is unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

from teamtr.graphs.engine import RestoresAdapters, SamplingParams, ServedAdapters
from teamtr.serving.registry import AdapterRegistry

PROBE = SamplingParams(temperature=0.0, max_new_tokens=1)


async def _loaded(engine: Any, base: str) -> set[str]:
    if isinstance(engine, RestoresAdapters):  # vLLM: a restarted server lost its adapters
        await engine.restore_adapters(base)
    if isinstance(engine, ServedAdapters):  # vLLM: ask the server, it may have restarted
        return set(await engine.served_models(base))
    return set(engine.adapters(base))


async def _probe(engine: Any, base: str) -> None:
    tokenizer = engine.tokenizer(base)
    token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    await engine.generate([token if token is not None else 0], adapter=None, sampling=PROBE, base=base)


async def not_ready_reasons(registry: AdapterRegistry, timeout_s: float) -> list[str]:
    """Why the server is not ready; empty when it is."""
    engine = registry.engine
    reasons = []
    loaded: dict[str, set[str]] = {}
    for base in engine.base_models():
        try:
            await asyncio.wait_for(_probe(engine, base), timeout_s)
            loaded[base] = await asyncio.wait_for(_loaded(engine, base), timeout_s)
        except TimeoutError:
            reasons.append(f"base model {base!r}: the engine did not answer within {timeout_s:g} s")
        except Exception as e:
            reasons.append(
                f"base model {base!r}: the engine failed a one-token probe ({type(e).__name__}: {e})"
            )
    for adapter in registry.adapters():
        current = registry.current(adapter)
        if current.base in loaded and current.engine_name not in loaded[current.base]:
            reasons.append(
                f"adapter {adapter!r}: version {current.version} ({current.engine_name}) is not "
                "loaded in the engine"
            )
    return reasons
