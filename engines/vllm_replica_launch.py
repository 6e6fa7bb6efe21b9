"""Start the vLLM servers of a replica engine (engines/vllm_replicas.py), or attach running ones:
one config per replica on its own port and GPUs, launched together, all or none."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from teamtr.engines.vllm_replicas import VLLMReplicaEngine
from teamtr.engines.vllm_server import VLLMServer, VLLMServerConfig, attach_vllm_server, launch


def replica_configs(
    config: VLLMServerConfig, count: int, devices: Sequence[str] = ()
) -> list[VLLMServerConfig]:
    """`count` copies of `config`, each on a free port; with `devices`, replica i sees only the GPUs
    `devices[i]` (its CUDA_VISIBLE_DEVICES, e.g. "0" or "2,3" for tensor parallel 2)."""
    if devices and len(devices) != count:
        raise ValueError(f"{count} replicas need {count} device sets, got {len(devices)}: {list(devices)}")
    return [
        dataclasses.replace(
            config,
            port=None,
            extra_env={**config.extra_env, **({"CUDA_VISIBLE_DEVICES": devices[i]} if devices else {})},
        )
        for i in range(count)
    ]


def launch_replicas(config: VLLMServerConfig, count: int, devices: Sequence[str] = ()) -> list[VLLMServer]:
    """Start `count` servers of `config` at once (`replica_configs`); all or none."""
    configs = replica_configs(config, count, devices)
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(launch, c) for c in configs]
    servers, errors = [], []
    for future in futures:
        try:
            servers.append(future.result())
        except Exception as e:
            errors.append(e)
    if errors:
        for server in servers:
            server.stop()
        raise errors[0]
    return servers


def open_replica_engine(
    bases: Mapping[str, str | Path],
    *,
    urls: Sequence[str] = (),
    replicas: int = 1,
    devices: Sequence[str] = (),
    server_config: Callable[[str], VLLMServerConfig] = lambda model_dir: VLLMServerConfig(
        model_dir=model_dir
    ),
    probe_interval_s: float = 2.0,
) -> tuple[VLLMReplicaEngine, list[VLLMServer]]:
    """(engine, the servers launched for it): attach the servers at `urls` (a team on one base model),
    or launch `replicas` servers per base of `server_config(model_dir)` (engines/open.py decides
    it for every command: rank, slots, dtype, tensor x pipeline parallelism), replica i on the GPUs
    `devices[i]` (CUDA_VISIBLE_DEVICES; empty: every replica sees what this process sees)."""
    if urls:
        if len(bases) != 1:
            raise ValueError(
                f"vllm_urls attach replicas of one base model, but the team sits on {len(bases)} bases "
                f"{sorted(bases)}; leave them unset to launch replicas per base"
            )
        ((name, path),) = bases.items()
        attached = [attach_vllm_server(url, model_dir=str(path)) for url in urls]
        return VLLMReplicaEngine({name: attached}, probe_interval_s=probe_interval_s), []
    launched: dict[str, list[VLLMServer]] = {}
    try:
        for name, path in bases.items():
            launched[name] = launch_replicas(server_config(str(path)), replicas, devices)
    except BaseException:
        for servers in launched.values():
            for server in servers:
                server.stop()
        raise
    engine = VLLMReplicaEngine(launched, probe_interval_s=probe_interval_s)
    return engine, [s for servers in launched.values() for s in servers]
