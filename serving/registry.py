"""Versioned per-role LoRA adapters, hot-swapped into a live engine without dropping a request.

Layout a training run writes (and `teamtr adapters push RUN_DIR` reads):

    RUN_DIR/adapters/<adapter>/v<version>/adapter_config.json
    RUN_DIR/adapters/<adapter>/v<version>/adapter_model.safetensors

`<adapter>` is the role's adapter name (`Role.adapter`, usually the role's name); one directory per
accepted update, in peft's standard format. Each version is loaded into the engine under its own
engine name, `<adapter>@v<version>`, so switching is one assignment and an episode that pinned
`adder1@v4` keeps sampling from it while new episodes start on `adder1@v5`. A version that is neither
current nor pinned by an in-flight episode is unloaded.

A candidate team (serving/canary.py) is a set of versions staged beside the current ones, never current:
`stage_candidate` validates and loads them, `set_canary_share` sends that share of new episodes to them
(drawn once per episode, for every adapter it covers), `promote_candidate` makes all of them current in
one assignment step, `abandon_candidate` drops them. Each version keeps its lineage (which run, data and
incumbent it came from) for `teamtr adapters list`.

Over ~400 lines because candidates share the slots, the admin lock and the pins of promoted versions.

Validation before a version goes live (a refused version never replaces the serving one):
- safetensors only: a directory holding pickle-based weights (.bin, .pt, .pth, .pkl, .ckpt) is refused;
- adapter_config.json is a LoRA config whose rank, target modules and base model match the role's
  first version;
- every tensor parses, is finite, and has exactly the names and shapes of the role's first version.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from teamtr.graphs.engine import DEFAULT_BASE, Engine
from teamtr.serving.canary import Candidate

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_VERSION_DIR = re.compile(r"^v(\d+)$")


class AdapterError(ValueError):
    """An adapter was refused; the message says why. The serving version is unchanged."""


class UnknownAdapterError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


def engine_name(adapter: str, version: int) -> str:
    return f"{adapter}@v{version}"


def version_dirs(run_dir: str | Path, adapter: str) -> list[tuple[int, Path]]:
    """(version, directory) of every saved version of `adapter` in a run directory, oldest first."""
    root = Path(run_dir) / "adapters" / adapter
    found = []
    if root.is_dir():
        for d in root.iterdir():
            m = _VERSION_DIR.match(d.name)
            if m and d.is_dir():
                found.append((int(m.group(1)), d))
    return sorted(found)


def adapters_in_run(run_dir: str | Path) -> list[str]:
    root = Path(run_dir) / "adapters"
    return sorted(d.name for d in root.iterdir() if d.is_dir()) if root.is_dir() else []


@dataclass(frozen=True)
class AdapterSignature:
    """What must stay the same across versions of one role's adapter."""

    rank: int
    target_modules: tuple[str, ...]
    base_model: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]


def inspect_adapter(path: str | Path) -> AdapterSignature:
    """Validate one peft LoRA directory on its own; raise AdapterError with the reason."""
    d = Path(path)
    if not d.is_dir():
        raise AdapterError(f"{d}: not a directory")
    pickled = sorted(p.name for p in d.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickled:
        raise AdapterError(
            f"{d}: refusing pickle-based weight files {pickled}; save adapters with safetensors "
            "(peft's save_pretrained(safe_serialization=True))"
        )
    cfg_path, weights = d / CONFIG_FILE, d / WEIGHTS_FILE
    if not cfg_path.is_file():
        raise AdapterError(f"{d}: missing {CONFIG_FILE}")
    if not weights.is_file():
        raise AdapterError(f"{d}: missing {WEIGHTS_FILE}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        raise AdapterError(f"{cfg_path}: not a LoRA adapter config (peft_type must be 'LORA')")
    rank = cfg.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"{cfg_path}: rank r must be a positive integer, got {rank!r}")
    targets = cfg.get("target_modules")
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets or ()))
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        with safe_open(str(weights), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensor = f.get_tensor(key)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    raise AdapterError(f"{weights}: tensor {key} has NaN or infinite values")
                shapes[key] = tuple(tensor.shape)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise AdapterError(f"{weights}: cannot be read as safetensors ({e})") from None
    if not shapes:
        raise AdapterError(f"{weights}: holds no tensors")
    for key, shape in shapes.items():
        if "lora_A" in key and shape[0] != rank or "lora_B" in key and shape[-1] != rank:
            raise AdapterError(f"{weights}: tensor {key} has shape {shape}, not rank {rank}")
    return AdapterSignature(
        rank=rank,
        target_modules=targets,
        base_model=str(cfg.get("base_model_name_or_path") or ""),
        shapes=tuple(sorted(shapes.items())),
    )


def _same_base(a: str, b: str) -> bool:
    """Base model names match when equal, or when both are paths to the same directory name."""
    if not a or not b or a == b:
        return True
    return Path(a).name == Path(b).name


def check_compatible(reference: AdapterSignature, new: AdapterSignature, where: str) -> None:
    if new.rank != reference.rank:
        raise AdapterError(f"{where}: rank {new.rank} does not match the serving rank {reference.rank}")
    if new.target_modules != reference.target_modules:
        raise AdapterError(
            f"{where}: target modules {list(new.target_modules)} do not match "
            f"{list(reference.target_modules)}"
        )
    if not _same_base(reference.base_model, new.base_model):
        raise AdapterError(
            f"{where}: trained on base model {new.base_model!r}, but this role serves on "
            f"{reference.base_model!r}"
        )
    ref_shapes, new_shapes = dict(reference.shapes), dict(new.shapes)
    if ref_shapes.keys() != new_shapes.keys():
        missing = sorted(ref_shapes.keys() - new_shapes.keys())[:3]
        extra = sorted(new_shapes.keys() - ref_shapes.keys())[:3]
        raise AdapterError(f"{where}: tensor names differ (missing {missing}, unexpected {extra})")
    for key, shape in ref_shapes.items():
        if new_shapes[key] != shape:
            raise AdapterError(
                f"{where}: tensor {key} has shape {new_shapes[key]}, the base model needs {shape}"
            )


@dataclass
class AdapterVersion:
    adapter: str
    version: int
    path: Path
    base: str
    live: bool = True  # loaded in the engine
    in_flight: int = 0  # episodes pinned to this version
    lineage: dict[str, Any] = field(default_factory=dict)  # run, data window, incumbent it came from

    @property
    def engine_name(self) -> str:
        return engine_name(self.adapter, self.version)


@dataclass
class _Slot:
    """One role adapter: every version it had, and the stack of promoted ones (top = current)."""

    signature: AdapterSignature
    versions: dict[int, AdapterVersion] = field(default_factory=dict)
    promoted: list[int] = field(default_factory=list)

    @property
    def current(self) -> AdapterVersion:
        return self.versions[self.promoted[-1]]


Pins = dict[str, tuple[str, int]]  # adapter -> (engine adapter name, version)


class AdapterRegistry:
    """Promotes, pins, rolls back and unloads adapter versions on one engine.

    Switching is a single assignment on the event loop, so every episode sees either the old or the
    new version of each adapter, never a mix within one adapter; `pin()` holds the versions an episode
    started with until it ends.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._slots: dict[str, _Slot] = {}
        self._admin = asyncio.Lock()  # one promotion / rollback at a time
        # per adapter, for /metrics (serving/metrics.py): versions promoted over a live one, pushes
        # refused, rollbacks done
        self.swaps: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.rollbacks: Counter[str] = Counter()
        self.candidate: Candidate | None = None  # a staged candidate team (serving/canary.py)
        self.promotions: list[dict[str, int]] = []  # candidate teams promoted, oldest first

    # --- reading -------------------------------------------------------------------------------
    def adapters(self) -> list[str]:
        return sorted(self._slots)

    def current_versions(self) -> dict[str, int]:
        return {name: slot.current.version for name, slot in self._slots.items()}

    def current(self, adapter: str) -> AdapterVersion:
        return self._slot(adapter).current

    def versions(self, adapter: str) -> list[AdapterVersion]:
        return [v for _, v in sorted(self._slot(adapter).versions.items())]

    def is_candidate(self, adapter: str, version: int) -> bool:
        return self.candidate is not None and self.candidate.versions.get(adapter) == version

    def in_flight(self) -> int:
        return sum(v.in_flight for s in self._slots.values() for v in s.versions.values())

    def _slot(self, adapter: str) -> _Slot:
        if adapter not in self._slots:
            known = ", ".join(sorted(self._slots)) or "none"
            raise UnknownAdapterError(f"unknown adapter {adapter!r}; registered: {known}")
        return self._slots[adapter]

    # --- promotion -----------------------------------------------------------------------------
    async def push(
        self,
        adapter: str,
        path: str | Path,
        version: int | None = None,
        base: str = DEFAULT_BASE,
        lineage: dict[str, Any] | None = None,
    ) -> AdapterVersion:
        """Validate, load under `<adapter>@v<version>`, then switch new episodes to it."""
        try:
            return await self._push(adapter, Path(path).resolve(), version, base, lineage or {})
        except AdapterError:
            self.refused[adapter] += 1
            raise

    async def _load(
        self, adapter: str, path: Path, version: int | None, base: str, lineage: dict[str, Any]
    ) -> tuple[AdapterVersion, AdapterSignature]:
        """Validate and load a version into the engine; it serves nothing yet."""
        signature = await asyncio.to_thread(inspect_adapter, path)
        slot = self._slots.get(adapter)
        if slot is not None:
            check_compatible(slot.signature, signature, str(path))
            base = slot.current.base
        version = self._choose_version(slot, path, version)
        entry = AdapterVersion(adapter=adapter, version=version, path=path, base=base, lineage=lineage)
        try:
            await self.engine.load_adapter(entry.engine_name, str(path), base=base)
        except Exception as e:  # the engine refused it: nothing changes
            raise AdapterError(f"{path}: the engine could not load it ({type(e).__name__}: {e})") from e
        return entry, signature

    async def _push(
        self, adapter: str, path: Path, version: int | None, base: str, lineage: dict[str, Any]
    ) -> AdapterVersion:
        async with self._admin:
            if self.candidate is not None and adapter in self.candidate.versions:
                raise AdapterError(
                    f"adapter {adapter!r} has a candidate version under canary; promote or abandon it first"
                )
            entry, signature = await self._load(adapter, path, version, base, lineage)
            slot = self._slots.get(adapter)
            if slot is None:
                slot = self._slots[adapter] = _Slot(signature=signature)
            previous = slot.current if slot.promoted else None
            slot.versions[entry.version] = entry
            slot.promoted.append(entry.version)  # the switch: new episodes pin this version from now on
            if previous is not None:
                self.swaps[adapter] += 1
                await self._unload_if_idle(previous)
            return entry

    async def push_latest(self, run_dir: str | Path, adapter: str) -> AdapterVersion:
        """Promote the newest `RUN_DIR/adapters/<adapter>/v<N>` directory."""
        found = version_dirs(run_dir, adapter)
        if not found:
            raise AdapterError(f"{run_dir}: no saved versions under adapters/{adapter}/v<N>/")
        version, path = found[-1]
        return await self.push(adapter, path, version)

    async def rollback(self, adapter: str) -> AdapterVersion:
        """Retire the current version; the previously promoted one serves new episodes again."""
        async with self._admin:
            slot = self._slot(adapter)
            if self.candidate is not None and adapter in self.candidate.versions:
                raise AdapterError(f"adapter {adapter!r} has a candidate under canary; abandon it first")
            if len(slot.promoted) < 2:
                raise AdapterError(f"adapter {adapter!r}: no previous version to roll back to")
            retired = slot.current
            previous = slot.versions[slot.promoted[-2]]
            if not previous.live:
                await self.engine.load_adapter(previous.engine_name, str(previous.path), base=previous.base)
                previous.live = True
            slot.promoted.pop()  # the switch back
            self.rollbacks[adapter] += 1
            await self._unload_if_idle(retired)
            return previous

    # --- candidates and canary ------------------------------------------------------------------
    async def stage_candidate(
        self, versions: dict[str, tuple[str | Path, int | None]], lineage: dict[str, Any] | None = None
    ) -> Candidate:
        """Validate and load a candidate version of each adapter in `versions` (adapter -> (path,
        version)); none becomes current and no episode pins them until `set_canary_share`. All or
        nothing: one refused version unloads the others."""
        async with self._admin:
            if self.candidate is not None:
                raise AdapterError("a candidate is staged already; promote or abandon it first")
            if not versions:
                raise AdapterError("a candidate needs at least one adapter version")
            loaded: list[AdapterVersion] = []
            try:
                for adapter, (path, version) in sorted(versions.items()):
                    slot = self._slot(adapter)
                    entry, _ = await self._load(
                        adapter, Path(path).resolve(), version, slot.current.base, dict(lineage or {})
                    )
                    entry.lineage["incumbent"] = slot.current.version
                    slot.versions[entry.version] = entry
                    loaded.append(entry)
            except (AdapterError, UnknownAdapterError):
                for entry in loaded:
                    await self._drop(entry)
                for adapter in versions:
                    self.refused[adapter] += 1
                raise
            self.candidate = Candidate(
                versions={v.adapter: v.version for v in loaded},
                incumbent={v.adapter: self._slots[v.adapter].current.version for v in loaded},
                lineage=dict(lineage or {}),
            )
            return self.candidate

    def set_canary_share(self, share: float) -> Candidate:
        """The share of new episodes that pin the candidate (each episode drawn once, for all its
        adapters); 0 stops sending episodes to it."""
        if self.candidate is None:
            raise AdapterError("no candidate is staged")
        try:
            self.candidate.set_share(share)
        except ValueError as e:
            raise AdapterError(str(e)) from None
        return self.candidate

    async def promote_candidate(self) -> dict[str, int]:
        """Make every candidate version current at once: the assignments run with no await between
        them, so no episode pins the new version of one adapter with the old version of another."""
        async with self._admin:
            candidate = self._require_candidate()
            previous = [self._slots[a].current for a in candidate.versions]
            for adapter, version in candidate.versions.items():  # the switch: one event-loop step
                self._slots[adapter].promoted.append(version)
            self.candidate = None
            self.promotions.append(dict(candidate.versions))
            for adapter in candidate.versions:
                self.swaps[adapter] += 1
            for v in previous:
                await self._unload_if_idle(v)
            return dict(candidate.versions)

    async def rollback_promotion(self) -> dict[str, int]:
        """Undo the last candidate promotion for all its roles in one step: each goes back to the version
        it had before (reloaded first where it was unloaded). Refused when a role moved on since."""
        async with self._admin:
            if not self.promotions:
                raise AdapterError("no promoted candidate to roll back")
            last = self.promotions[-1]
            if self.candidate is not None:
                raise AdapterError("a candidate is staged; promote or abandon it first")
            moved = [a for a, v in last.items() if self._slots[a].current.version != v]
            if moved:
                raise AdapterError(f"adapters {moved} changed since the promotion; roll them back one by one")
            previous = {a: self._slots[a].versions[self._slots[a].promoted[-2]] for a in last}
            for v in previous.values():  # load everything first: the switch below must not await
                if not v.live:
                    await self.engine.load_adapter(v.engine_name, str(v.path), base=v.base)
                    v.live = True
            retired = [self._slots[a].current for a in last]
            for adapter in last:  # the switch back: one event-loop step
                self._slots[adapter].promoted.pop()
            self.promotions.pop()
            for adapter in last:
                self.rollbacks[adapter] += 1
            for v in retired:
                await self._unload_if_idle(v)
            return {a: v.version for a, v in previous.items()}

    async def abandon_candidate(self) -> dict[str, int]:
        """Drop the candidate: new episodes pin the incumbent only; its versions unload once the canary
        episodes that pinned them end. Returns the versions dropped."""
        async with self._admin:
            candidate = self._require_candidate()
            self.candidate = None
            for adapter, version in candidate.versions.items():
                entry = self._slots[adapter].versions[version]
                self.rollbacks[adapter] += 1
                await self._unload_if_idle(entry)
            return dict(candidate.versions)

    def _require_candidate(self) -> Candidate:
        if self.candidate is None:
            raise AdapterError("no candidate is staged")
        return self.candidate

    async def _drop(self, entry: AdapterVersion) -> None:
        """Forget a version that never served (a refused candidate's other versions)."""
        self._slots[entry.adapter].versions.pop(entry.version, None)
        if entry.live:
            entry.live = False
            await self.engine.unload_adapter(entry.engine_name, base=entry.base)

    def _choose_version(self, slot: _Slot | None, path: Path, version: int | None) -> int:
        known = set(slot.versions) if slot else set()
        if version is None:
            m = _VERSION_DIR.match(path.name)
            version = int(m.group(1)) if m else max(known, default=0) + 1
        if version in known:
            raise AdapterError(f"version {version} is already registered; push a new version or roll back")
        return version

    # --- pinning -------------------------------------------------------------------------------
    @asynccontextmanager
    async def pin(self, adapters: list[str] | None = None) -> AsyncIterator[Pins]:
        """The current version of each adapter, held until the episode ends."""
        names = self.adapters() if adapters is None else adapters
        # no await between the draw and the reads: one snapshot, all-candidate or all-incumbent
        canary = self.candidate is not None and any(n in self.candidate.versions for n in names)
        if canary and self.candidate.draw():  # type: ignore[union-attr]
            chosen = self.candidate.versions  # type: ignore[union-attr]
            held = [
                self._slots[n].versions[chosen[n]] if n in chosen else self._slot(n).current for n in names
            ]
        else:
            held = [self._slot(name).current for name in names]
        for v in held:
            v.in_flight += 1
        try:
            yield {v.adapter: (v.engine_name, v.version) for v in held}
        finally:
            for v in held:
                v.in_flight -= 1
            for v in held:
                await self._unload_if_idle(v)

    async def _unload_if_idle(self, v: AdapterVersion) -> None:
        slot = self._slots[v.adapter]
        keep = v.version == slot.current.version or self.is_candidate(v.adapter, v.version)
        if v.live and v.in_flight == 0 and not keep:
            v.live = False
            await self.engine.unload_adapter(v.engine_name, base=v.base)

    async def close(self) -> None:
        for slot in self._slots.values():
            for v in slot.versions.values():
                if v.live:
                    v.live = False
                    await self.engine.unload_adapter(v.engine_name, base=v.base)
