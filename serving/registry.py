"""Versioned per-role LoRA adapters, hot-loaded into a live engine without dropping a request.

Layout a training run writes (and `teamtr adapters push RUN_DIR` reads):

    RUN_DIR/adapters/<adapter>/v<version>/adapter_config.json
    RUN_DIR/adapters/<adapter>/v<version>/adapter_model.safetensors

`<adapter>` is the role's adapter name (`Role.adapter`, usually the role's name); one directory per
accepted update, in peft's standard format. Each version is loaded into the engine under its own
engine name, `<adapter>@v<version>`, so promoting is one assignment and an episode that pinned
`adder1@v4` keeps sampling from it while new episodes start on `adder1@v5`. A version that is neither
current nor pinned by an in-flight episode is unloaded.

`AdapterRegistry` is built in layers, one job each:

    serving/adapter_slots.py        the versions and slots, loading and unloading one version, log records
    serving/registry_log.py         the promotion log replayed at start and followed across replicas
    serving/registry_candidates.py  a candidate team: load, canary share, promote, roll back, abandon
    serving/registry.py             (here) push and roll back one adapter, restore a promoted team, and
                                    pin the versions an episode runs on (a canary's shadow included)

With a promotion log (serving/promotion_log.py, `RUN/promotions.jsonl`) every change is written and
fsynced in the same event-loop step as the switch it records, before it, so the log never lags what
served; `attach_log` replays it at start and `restore_team` returns to any earlier promoted team in one
step. Validation before a version goes live: serving/adapter_checks.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from teamtr.graphs.engine import DEFAULT_BASE
from teamtr.serving.adapter_checks import AdapterError
from teamtr.serving.adapter_slots import AdapterSlot, AdapterVersion, Pins
from teamtr.serving.registry_candidates import RegistryCandidates

__all__ = ["AdapterRegistry", "AdapterVersion", "Pins"]


class AdapterRegistry(RegistryCandidates):
    """Promotes, pins, rolls back and unloads adapter versions on one engine.

    Switching is a single assignment on the event loop, so every episode sees either the old or the
    new version of each adapter, never a mix within one adapter; `pin()` holds the versions an episode
    started with until it ends.
    """

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

    async def _push(
        self, adapter: str, path: Path, version: int | None, base: str, lineage: dict[str, Any]
    ) -> AdapterVersion:
        async with self._admin_step():
            if self.candidate is not None and adapter in self.candidate.versions:
                raise AdapterError(
                    f"adapter {adapter!r} has a candidate version under canary; promote or abandon it first"
                )
            entry, signature = await self._load(adapter, path, version, base, lineage)
            slot = self._slots.get(adapter)
            if slot is None:
                slot = self._slots[adapter] = AdapterSlot(signature=signature)
            previous = slot.current if slot.promoted else None
            slot.versions[entry.version] = entry
            self._record_change("pushed", {adapter: entry.version}, adapter=adapter, version=entry.version)
            slot.promoted.append(entry.version)  # the switch: new episodes pin this version from now on
            self._note_team()
            if previous is not None:
                self.version_promotions[adapter] += 1
                await self._unload_if_idle(previous)
            return entry

    async def rollback(self, adapter: str) -> AdapterVersion:
        """Retire the current version; the previously promoted one serves new episodes again."""
        async with self._admin_step():
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
            self._record_change("rolled_back_role", {}, pop=[adapter], retired={adapter: retired.version})
            retired.status = "rolled_back"
            slot.promoted.pop()  # the switch back
            self.rollbacks[adapter] += 1
            await self._unload_if_idle(retired)
            return previous

    async def restore_team(self, index: int) -> dict[str, int]:
        """Serve the promoted team `self.teams[index]` again, every adapter in one step (versions reloaded
        first where unloaded); the versions it replaces are listed as rolled back."""
        async with self._admin_step():
            if self.candidate is not None:
                raise AdapterError("a candidate is loaded; promote or abandon it first")
            if not 0 <= index < len(self.teams):
                raise AdapterError(
                    f"no promoted team {index}; there are {len(self.teams)} (0..{len(self.teams) - 1})"
                )
            team = {a: v for a, v in self.teams[index].items() if a in self._slots}
            changes = {a: v for a, v in team.items() if self._slots[a].current.version != v}
            for adapter, version in changes.items():  # load first: the switch below must not await
                entry = self._slots[adapter].versions.get(version)
                if entry is None:
                    raise AdapterError(f"adapter {adapter!r}: version {version} is not known to this server")
                await self._make_live(entry)
            retired = {a: self._slots[a].current.version for a in changes}
            self._record_change("restored", changes, team=index, retired=retired)
            self.decisions["restored"] += 1
            for adapter, version in changes.items():  # the switch: one event-loop step
                slot = self._slots[adapter]
                slot.current.status = "rolled_back"
                slot.promoted.append(version)
                slot.versions[version].status = "promoted"
                self.rollbacks[adapter] += 1
            for adapter, version in retired.items():
                await self._unload_if_idle(self._slots[adapter].versions[version])
            return self.current_versions()

    @asynccontextmanager
    async def pin(self, adapters: list[str] | None = None) -> AsyncIterator[Pins]:
        """The current version of each adapter, held until the episode ends."""
        await self.follow()  # a change made through another replica serves from this episode on
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
            await self.release(held)

    def hold_shadow(self, pinned: Pins) -> tuple[Pins, list[AdapterVersion]] | None:
        """For an episode that pinned the candidate, when the candidate asks for shadows: the pins of its
        shadow run (the incumbent's version of every adapter the candidate covers, the rest as pinned),
        held until `release(held)`; None for any other episode. No await: call it in the step `pin`
        yielded in, while the incumbent's versions are certainly loaded."""
        c = self.candidate
        covered = [a for a in pinned if c is not None and a in c.versions]
        if c is None or not c.shadow or not covered or any(pinned[a][1] != c.versions[a] for a in covered):
            return None
        held = [
            self._slots[a].versions[c.incumbent[a] if a in c.versions else version]
            for a, (_, version) in pinned.items()
        ]
        for v in held:
            v.in_flight += 1
        return {v.adapter: (v.engine_name, v.version) for v in held}, held

    async def release(self, held: list[AdapterVersion]) -> None:
        """An episode that held these versions ended: unload those no longer needed."""
        for v in held:
            v.in_flight -= 1
        for v in held:
            await self._unload_if_idle(v)
