"""An adapter registry's promotion log read back: replayed at start (`attach_log`, one server) and
followed across replicas sharing one log (`_join`, `follow`, `_admin_step`: serving/promotion_log.py
`SharedPromotionLog`, serving/pg_store.py's advisory admin lock).

Every change is written and fsynced in the same event-loop step as the switch it records, before it
(serving/adapter_slots.py `_record`), so the log never lags what served; replaying it gives the last
promoted team, every version's state and lineage, and abandons a candidate the server died with.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from teamtr.serving.adapter_checks import AdapterError, check_compatible, inspect_adapter
from teamtr.serving.adapter_slots import AdapterSlots, AdapterVersion
from teamtr.serving.canary import Candidate
from teamtr.serving.pg_store import shared_admin_lock
from teamtr.serving.promotion_log import History, PromotionLog, replay


class RegistryLog(AdapterSlots):
    """Replays and follows the promotion log (the module's doc)."""

    async def attach_log(self, log: PromotionLog) -> History:
        """Replay the log over the versions registered so far (the run's newest), then record from now
        on: every logged version is known again with its state and lineage, the last promoted team serves
        (its versions validated and loaded first), a candidate the server died with is abandoned."""
        history = log.history()
        self._know_versions(history)
        self.log = log
        for slot in self._slots.values():  # the run's versions, so a later start knows them
            for entry in slot.versions.values():
                if history.version(entry.adapter, entry.version) is None:
                    self._register(entry)
        for adapter, stack in (history.stacks or {}).items():
            slot = self._slots.get(adapter)
            stack = [v for v in stack if slot is not None and v in slot.versions]
            if slot is None or not stack or stack == slot.promoted:
                continue
            top = slot.versions[stack[-1]]
            try:
                check_compatible(
                    slot.signature, await asyncio.to_thread(inspect_adapter, top.path), str(top.path)
                )
            except AdapterError as e:
                raise AdapterError(
                    f"{log.path}: the last promoted {adapter} v{top.version} cannot serve: {e}"
                ) from None
            await self._make_live(top)
            previous = slot.current
            slot.promoted = stack
            await self._unload_if_idle(previous)
        self.promotions, self.teams = list(history.promotions), list(history.teams)
        if history.pending:
            await self._forget_pending(history.pending)
        self._record("started", stacks=self._stacks(), current=self.current_versions())
        self._note_team()
        return history

    async def _join(self, log: PromotionLog) -> History:
        """Start on a shared log: apply it (under the replicas' admin lock), then record the run's versions
        it lacks and this start."""
        self.log = log
        async with self._admin_step():
            seq, records = await asyncio.to_thread(log.records)  # type: ignore[attr-defined]
            history = replay(records)
            for slot in self._slots.values():
                for entry in slot.versions.values():
                    if history.version(entry.adapter, entry.version) is None:
                        self._register(entry)
            self._record("started", stacks=self._stacks(), current=self.current_versions())
            self._note_team()
        return history

    @asynccontextmanager
    async def _admin_step(self) -> AsyncIterator[None]:
        """One change at a time: in this process (the admin lock) and, with a shared log, across replicas
        (its advisory lock), on the state every replica's changes so far left (`follow` first)."""
        async with self._admin:
            log = self.log
            if log is None or not log.shared:
                yield
                return
            async with shared_admin_lock(log.store), self._following:  # type: ignore[attr-defined]
                await self._follow_locked()
                yield

    async def follow(self) -> None:
        """Apply what other replicas changed in the shared log since this one last looked (one query when
        nothing changed; nothing at all without a shared log)."""
        log = self.log
        if log is None or not log.shared:
            return
        if await asyncio.to_thread(log.head) <= self._applied:  # type: ignore[attr-defined]
            return
        async with self._following:
            await self._follow_locked()

    async def _follow_locked(self) -> None:
        seq, records = await asyncio.to_thread(self.log.records)  # type: ignore[union-attr]
        if seq > self._applied:
            await self._apply(replay(records))
            self._applied = seq

    async def _apply(self, history: History) -> None:
        """Make this registry what the shared log says: every version known, the candidate and its share,
        the promoted stacks. Versions are loaded first; the switch itself has no await, so an episode pins
        the state before or after it, never a mix."""
        self._know_versions(history)
        stacks: dict[str, list[int]] = {}
        for adapter, stack in (history.stacks or {}).items():
            slot = self._slots.get(adapter)
            stack = [v for v in stack if slot is not None and v in slot.versions]
            if slot is not None and stack and stack != slot.promoted:
                await self._make_live(slot.versions[stack[-1]])
                stacks[adapter] = stack
        pending = {a: v for a, v in (history.pending or {}).items() if a in self._slots}
        candidate = self.candidate
        if pending and (candidate is None or candidate.versions != pending):
            for adapter, version in pending.items():
                await self._make_live(self._slots[adapter].versions[version])
            record = history.pending_record or {}
            candidate = Candidate(
                versions=pending,
                incumbent={a: int(v) for a, v in (record.get("incumbent") or {}).items()},
                lineage=dict(record.get("lineage") or {}),
                shadow=bool(record.get("shadow", False)),
            )
        elif not pending:
            candidate = None
        # the switch: one event-loop step
        retired = [self._slots[a].current for a in stacks if self._slots[a].promoted]
        if self.candidate is not None and candidate is not self.candidate:
            retired += [self._slots[a].versions[v] for a, v in self.candidate.versions.items()]
        for adapter, stack in stacks.items():
            self._slots[adapter].promoted = stack
        self.candidate = candidate
        if candidate is not None and candidate.share != history.share:
            candidate.set_share(history.share)
        self.promotions, self.teams = list(history.promotions), list(history.teams)
        for v in retired:
            await self._unload_if_idle(v)

    def _know_versions(self, history: History) -> None:
        """Every version the log names, with its state and lineage (unloaded until it serves)."""
        for adapter, records in history.versions.items():
            slot = self._slots.get(adapter)
            if slot is None:  # an adapter this server no longer serves
                continue
            for version, rec in records.items():
                entry = slot.versions.get(version)
                if entry is None:
                    entry = slot.versions[version] = AdapterVersion(
                        adapter, version, Path(rec.path), rec.base, live=False, lineage=rec.lineage
                    )
                entry.lineage, entry.status = rec.lineage or entry.lineage, rec.status

    async def _forget_pending(self, versions: dict[str, int]) -> None:
        self._record("abandoned", versions=versions, reason="the server restarted during its canary")
        for adapter, version in versions.items():
            slot = self._slots.get(adapter)
            if slot is not None and version in slot.versions:
                slot.versions[version].status = "abandoned"
