"""One way to open an engine: `open_engine(EngineSpec(...))`, used by train (trainer and rollouts), serve,
improve (gate included), eval, swap, demo and the benchmarks.

    opened = open_engine(EngineSpec(bases={"base": "runs/demo/model"}, kind="vllm", lora_rank=32))
    engine = opened.engine          # the Engine protocol (graphs/engine.py)
    ...
    opened.close()                  # stops the vLLM servers launched for it (an attached one keeps running)

`embedded`: transformers + peft in this process. `vllm`: one server per base model launched (or attached
by `url`), or several replicas behind a `VLLMReplicaEngine` (`urls`, `replicas`, tensor / pipeline
parallel sizes). Every vLLM launch goes through `vllm_server_config`, so the server's LoRA rank, slots,
dtype, arguments and environment are decided in one place.

The engine kinds are registered once, in `ENGINE_KINDS` (a kind's name -> how a spec of it is opened);
`EngineKind`, the type of `EngineSpec.kind`, a run's `rollout.engine` and `teamtr serve`'s engine, is
drawn from it. A new engine is its module, an opener and one entry there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from teamtr.graphs.engine import Closable, Engine

# the --max-lora-rank values vLLM accepts
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


class EngineSpecError(ValueError):
    """An engine spec that cannot work (an attach URL for a team on several bases, an unknown kind)."""


def serving_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds adapters of `rank` (at least 16)."""
    return next((r for r in VLLM_LORA_RANKS if r >= max(rank, 16)), rank)


@dataclass(frozen=True)
class VLLMSpec:
    """How the vLLM servers behind an engine are found or launched (docs/vllm.md, docs/scale.md)."""

    url: str | None = None  # attach to this one server (a team on one base); None: launch
    urls: tuple[str, ...] = ()  # attach these replicas (one base)
    replicas: int = 1  # launch this many servers per base ...
    tensor_parallel_size: int = 1  # ... each over tensor x pipeline parallel GPUs
    pipeline_parallel_size: int = 1
    devices: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES per replica
    args: tuple[str, ...] = ()  # extra server arguments, as is
    env: Mapping[str, str] = field(default_factory=dict)  # extra server environment
    setting: str = "vllm_url"  # what the user called `url` (a config key or a flag), for error messages

    @property
    def replicated(self) -> bool:
        return bool(self.urls) or self.replicas * self.tensor_parallel_size * self.pipeline_parallel_size > 1


class VLLMSettings(BaseModel):
    """The vLLM fields of a config (a run's `rollout`, a `ServeConfig`): written once, read by `vllm_spec`."""

    vllm_url: str | None = None  # attach to this server (serving the run's base model); None: launch
    vllm_args: list[str] = Field(default_factory=list)  # launched: extra server arguments, as is
    vllm_env: dict[str, str] = Field(default_factory=dict)  # ... and environment (CUDA_VISIBLE_DEVICES)
    # several servers (engines/vllm_replicas.py, docs/scale.md): attach these replicas (one base),
    # or launch `vllm_replicas` per base, each over tensor x pipeline parallel GPUs
    vllm_urls: list[str] = Field(default_factory=list)
    vllm_replicas: int = Field(1, ge=1)
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    vllm_pipeline_parallel_size: int = Field(1, ge=1)
    vllm_replica_devices: list[str] = Field(default_factory=list)  # CUDA_VISIBLE_DEVICES per replica

    def vllm_spec(self, setting: str) -> VLLMSpec:
        """These settings as an engine's VLLMSpec; `setting` names the url for error messages."""
        return VLLMSpec(
            url=self.vllm_url,
            urls=tuple(self.vllm_urls),
            replicas=self.vllm_replicas,
            tensor_parallel_size=self.vllm_tensor_parallel_size,
            pipeline_parallel_size=self.vllm_pipeline_parallel_size,
            devices=tuple(self.vllm_replica_devices),
            args=tuple(self.vllm_args),
            env=dict(self.vllm_env),
            setting=setting,
        )


@dataclass(frozen=True)
class EngineSpec:
    """Which engine, on which base models, holding what (every field has a default but `bases`)."""

    bases: Mapping[str, str]  # base name -> model reference (folder, hub id or GGUF file)
    kind: EngineKind = "embedded"  # a name in ENGINE_KINDS
    device: str = "auto"  # embedded: auto | cpu | cuda | cuda:K (engines/devices.py)
    dtype: str = "auto"  # auto: bfloat16 on a GPU, else float32; vLLM's auto is the embedded rule's answer
    threads: int | None = None  # embedded: torch threads
    lora: Any = None  # embedded: LoraSettings of fresh adapters (None: the engine's defaults)
    decode_in_thread: bool = False  # embedded: continuous batching in a worker thread (serving)
    lora_rank: int = 16  # the largest adapter rank the engine must hold (vLLM's --max-lora-rank from it)
    adapters: int = 3  # role adapters the engine serves at once (vLLM's --max-loras from it)
    vllm: VLLMSpec = field(default_factory=VLLMSpec)

    def max_loras(self) -> int:
        """vLLM LoRA slots: two versions of every adapter at once (the outgoing one finishes its pinned
        episodes while the new one serves) plus the null adapter the base policy is served through."""
        return max(8, 2 * self.adapters + 1)

    def vllm_dtype(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        from teamtr.engines.devices import resolve_device, resolve_dtype

        return str(resolve_dtype("auto", resolve_device(self.device))).removeprefix("torch.")


@dataclass
class OpenedEngine:
    """An engine and the vLLM servers launched for it (stopped by `close`)."""

    engine: Engine
    servers: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """Stop the servers launched for this engine (attached ones keep running)."""
        if isinstance(self.engine, Closable):
            self.engine.close()
        for server in self.servers:
            server.stop()


def vllm_server_config(spec: EngineSpec, model_dir: str) -> Any:
    """The one place a vLLM server's launch settings are decided, for every command."""
    from teamtr.engines.vllm_server import VLLMServerConfig

    return VLLMServerConfig(
        model_dir=str(model_dir),
        dtype=spec.vllm_dtype(),
        max_lora_rank=serving_lora_rank(spec.lora_rank),
        max_loras=spec.max_loras(),
        tensor_parallel_size=spec.vllm.tensor_parallel_size,
        pipeline_parallel_size=spec.vllm.pipeline_parallel_size,
        extra_args=tuple(spec.vllm.args),
        extra_env=dict(spec.vllm.env),
    )


def open_engine(spec: EngineSpec) -> OpenedEngine:
    """The engine `spec` describes; EngineSpecError for a spec that cannot work."""
    if not spec.bases:
        raise EngineSpecError("an engine needs at least one base model")
    opener = ENGINE_KINDS.get(spec.kind)
    if opener is None:
        raise EngineSpecError(f"unknown engine kind {spec.kind!r}; known: {', '.join(ENGINE_KINDS)}")
    return opener(spec)


def _open_embedded(spec: EngineSpec) -> OpenedEngine:
    from teamtr.engines.embedded import EmbeddedEngine

    return OpenedEngine(
        EmbeddedEngine(
            dict(spec.bases),
            lora=spec.lora,
            threads=spec.threads,
            device=spec.device,
            dtype=spec.dtype,
            decode_in_thread=spec.decode_in_thread,
        )
    )


def _open_vllm(spec: EngineSpec) -> OpenedEngine:
    from teamtr.engines.vllm_engine import VLLMEngine
    from teamtr.engines.vllm_replica_launch import open_replica_engine
    from teamtr.engines.vllm_server import attach_vllm_server, launch

    v = spec.vllm
    if v.replicated:
        if v.url is not None:
            raise EngineSpecError(f"give {v.setting} (one server) or {v.setting}s (replicas), not both")
        try:
            engine, launched = open_replica_engine(
                dict(spec.bases),
                urls=v.urls,
                replicas=v.replicas,
                devices=v.devices,
                server_config=lambda model_dir: vllm_server_config(spec, model_dir),
            )
        except ValueError as e:
            raise EngineSpecError(str(e)) from None
        return OpenedEngine(engine, launched)
    if v.url is not None:
        if len(spec.bases) != 1:
            raise EngineSpecError(
                f"{v.setting} attaches one server, but the team sits on {len(spec.bases)} bases "
                f"{sorted(spec.bases)}; leave {v.setting} unset to launch one server per base"
            )
        ((name, path),) = spec.bases.items()
        return OpenedEngine(VLLMEngine({name: attach_vllm_server(v.url, model_dir=str(path))}))
    servers: dict[str, Any] = {}
    try:
        for name, path in spec.bases.items():
            servers[name] = launch(vllm_server_config(spec, str(path)))
    except BaseException:  # KeyboardInterrupt included: no server outlives a failed start
        for server in servers.values():
            server.stop()
        raise
    return OpenedEngine(VLLMEngine(servers), list(servers.values()))


# Every engine kind, registered once: its name -> how an EngineSpec of that kind is opened
# (`embedded`: transformers + peft in this process; `vllm`: vLLM servers, launched or attached).
ENGINE_KINDS: dict[str, Callable[[EngineSpec], OpenedEngine]] = {
    "embedded": _open_embedded,
    "vllm": _open_vllm,
}
# The kinds as a type, for the configs that name one (pydantic validates a value against it).
EngineKind = Literal[tuple(ENGINE_KINDS)]  # type: ignore[valid-type]
