"""An adapter registry's versions and slots: what each role adapter has, what is loaded in the engine,
and the promotion-log records every change writes (the registry itself: serving/registry.py).

Each version is loaded into the engine under its own engine name, `<adapter>@v<version>`; a slot keeps
every version of one adapter and the stack of promoted ones (top = current). A version that is neither
current, a candidate, nor pinned by an in-flight episode is unloaded (`_unload_if_idle`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from teamtr.graphs.engine import Engine
from teamtr.graphs.run_layout import version_of
from teamtr.serving.adapter_checks import (
    AdapterError,
    AdapterSignature,
    UnknownAdapterError,
    check_compatible,
    engine_name,
    inspect_adapter,
)
from teamtr.serving.canary import Candidate
from teamtr.serving.promotion_log import PromotionLog


@dataclass
class AdapterVersion:
    adapter: str
    version: int
    path: Path
    base: str
    live: bool = True  # loaded in the engine
    in_flight: int = 0  # episodes pinned to this version
    lineage: dict[str, Any] = field(default_factory=dict)  # run, data window, incumbent it came from
    status: str = "promoted"  # promoted | candidate | rolled_back | abandoned (current: serving)

    @property
    def engine_name(self) -> str:
        return engine_name(self.adapter, self.version)


@dataclass
class AdapterSlot:
    """One role adapter: every version it had, and the stack of promoted ones (top = current)."""

    signature: AdapterSignature
    versions: dict[int, AdapterVersion] = field(default_factory=dict)
    promoted: list[int] = field(default_factory=list)

    @property
    def current(self) -> AdapterVersion:
        return self.versions[self.promoted[-1]]


Pins = dict[str, tuple[str, int]]  # adapter -> (engine adapter name, version)


class AdapterSlots:
    """The state an `AdapterRegistry` changes: its slots, counters, candidate and promoted teams; reading
    it; loading, recording and unloading single versions. Every change to it is made by the registry
    (serving/registry.py) under its admin step."""

    def __init__(self, engine: Engine, log: PromotionLog | None = None) -> None:
        self.engine = engine
        self.log = log  # None: changes live in memory only (attach_log to make them durable)
        self._slots: dict[str, AdapterSlot] = {}
        self._admin = asyncio.Lock()  # one promotion / rollback at a time
        # per adapter, for /metrics (serving/metrics.py): versions promoted over a live one, pushes
        # refused, rollbacks done
        self.version_promotions: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.rollbacks: Counter[str] = Counter()
        self.decisions: Counter[str] = Counter()  # on candidates: promoted | rolled_back | abandoned | ...
        self.candidate: Candidate | None = None  # a loaded candidate team (serving/canary.py)
        self.improve_reports: dict[str, Any] = {}  # team -> the last ImproveReport a `--watch` sent
        self.promotions: list[dict[str, int]] = []  # candidate teams promoted (not undone), oldest first
        self.teams: list[dict[str, int]] = []  # every promoted team (adapter -> version), oldest first
        # a shared log (several replicas): the newest event applied here; `follow` applies the rest
        self._applied = 0
        self._following = asyncio.Lock()

    def adapters(self) -> list[str]:
        return sorted(self._slots)

    def current_versions(self) -> dict[str, int]:
        return {name: slot.current.version for name, slot in self._slots.items()}

    def current(self, adapter: str) -> AdapterVersion:
        return self._slot(adapter).current

    def versions(self, adapter: str) -> list[AdapterVersion]:
        return [v for _, v in sorted(self._slot(adapter).versions.items())]

    def state(self, v: AdapterVersion) -> str:
        """serving | candidate | promoted (earlier) | rolled_back | abandoned."""
        if self._slots[v.adapter].promoted and self.current(v.adapter).version == v.version:
            return "serving"
        return "candidate" if self.is_candidate(v.adapter, v.version) else v.status

    def is_candidate(self, adapter: str, version: int) -> bool:
        return self.candidate is not None and self.candidate.versions.get(adapter) == version

    def in_flight(self) -> int:
        return sum(v.in_flight for s in self._slots.values() for v in s.versions.values())

    def _slot(self, adapter: str) -> AdapterSlot:
        if adapter not in self._slots:
            known = ", ".join(sorted(self._slots)) or "none"
            raise UnknownAdapterError(f"unknown adapter {adapter!r}; registered: {known}")
        return self._slots[adapter]

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
        self._register(entry)
        return entry, signature

    def _choose_version(self, slot: AdapterSlot | None, path: Path, version: int | None) -> int:
        known = set(slot.versions) if slot else set()
        if version is None:
            version = version_of(path)
            version = max(known, default=0) + 1 if version is None else version
        if version in known:
            raise AdapterError(f"version {version} is already registered; push a new version or roll back")
        return version

    async def _make_live(self, entry: AdapterVersion) -> None:
        if not entry.live:
            await self.engine.load_adapter(entry.engine_name, str(entry.path), base=entry.base)
            entry.live = True

    async def _drop(self, entry: AdapterVersion) -> None:
        """Forget a version that never served (a refused candidate's other versions)."""
        self._slots[entry.adapter].versions.pop(entry.version, None)
        if entry.live:
            entry.live = False
            await self.engine.unload_adapter(entry.engine_name, base=entry.base)

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

    def _require_candidate(self) -> Candidate:
        if self.candidate is None:
            raise AdapterError("no candidate is loaded")
        return self.candidate

    def _stacks(
        self, append: dict[str, int] | None = None, pop: list[str] | None = None
    ) -> dict[str, list[int]]:
        stacks = {a: list(s.promoted) for a, s in self._slots.items()}
        for adapter, version in (append or {}).items():
            stacks.setdefault(adapter, []).append(version)
        for adapter in pop or []:
            stacks[adapter].pop()
        return stacks

    def _record(self, event: str, **fields: Any) -> None:
        """Append to the promotion log (synchronously: no episode can start between it and the switch)."""
        if self.log is not None:
            self.log.append(event, **fields)

    def _record_change(
        self, event: str, append: dict[str, int], pop: list[str] | None = None, **fields: Any
    ) -> None:
        stacks = self._stacks(append, pop)
        current = {a: vs[-1] for a, vs in stacks.items() if vs}
        self._record(event, stacks=stacks, current=current, **fields)

    def _register(self, entry: AdapterVersion) -> None:
        self._record(
            "registered",
            adapter=entry.adapter,
            version=entry.version,
            dir=str(entry.path),
            base=entry.base,
            lineage=entry.lineage,
        )

    def _note_team(self) -> None:
        current = self.current_versions()
        if not self.teams or self.teams[-1] != current:
            self.teams.append(current)
