"""Versioned per-role LoRA adapters, hot-swapped into a live engine without dropping a request.

Layout a training run writes (and `teamtr adapters push RUN_DIR` reads):

    RUN_DIR/adapters/<adapter>/v<version>/adapter_config.json
    RUN_DIR/adapters/<adapter>/v<version>/adapter_model.safetensors

`<adapter>` is the role's adapter name (`Role.adapter`, usually the role's name); one directory per
accepted update, in peft's standard format. Each version is loaded into the engine under its own
engine name, `<adapter>@v<version>`, so switching is one assignment and an episode that pinned
`adder1@v4` keeps sampling from it while new episodes start on `adder1@v5`. A version that is neither
current nor pinned by an in-flight episode is unloaded.

A candidate team (serving/canary.py) is a set of versions loaded beside the current ones, never current:
`load_candidate` validates and loads them, `set_canary_share` sends that share of new episodes to them
(drawn once per episode, for every adapter it covers; with `shadow`, `hold_shadow` gives a canary episode
the incumbent's versions for its shadow run), `promote_candidate` makes all of them current in
one assignment step, `abandon_candidate` drops them. Each version keeps its lineage (which run, data and
incumbent it came from) for `teamtr adapters list`.

With a promotion log (serving/promotion_log.py, `RUN/promotions.jsonl`) every change is written and
fsynced in the same event-loop step as the switch it records, before it, so the log never lags what
served; `attach_log` replays it at start (the last promoted team serves again, every version keeps its
state and lineage) and `restore_team` returns to any earlier promoted team in one step.

Candidates live here, beside the current versions, because they share the slots, the admin lock and the
pins of promoted versions.

Validation before a version goes live: serving/adapter_checks.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from teamtr.graphs.engine import DEFAULT_BASE, Engine
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
from teamtr.serving.pg_store import shared_admin_lock
from teamtr.serving.promotion_log import History, PromotionLog, replay


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

    def __init__(self, engine: Engine, log: PromotionLog | None = None) -> None:
        self.engine = engine
        self.log = log  # None: changes live in memory only (attach_log to make them durable)
        self._slots: dict[str, _Slot] = {}
        self._admin = asyncio.Lock()  # one promotion / rollback at a time
        # per adapter, for /metrics (serving/metrics.py): versions promoted over a live one, pushes
        # refused, rollbacks done
        self.swaps: Counter[str] = Counter()
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

    # --- reading -------------------------------------------------------------------------------
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
        self._register(entry)
        return entry, signature

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
                slot = self._slots[adapter] = _Slot(signature=signature)
            previous = slot.current if slot.promoted else None
            slot.versions[entry.version] = entry
            self._record_change("pushed", {adapter: entry.version}, adapter=adapter, version=entry.version)
            slot.promoted.append(entry.version)  # the switch: new episodes pin this version from now on
            self._note_team()
            if previous is not None:
                self.swaps[adapter] += 1
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

    # --- candidates and canary ------------------------------------------------------------------
    async def load_candidate(
        self,
        versions: dict[str, tuple[str | Path, int | None]],
        lineage: dict[str, Any] | None = None,
        shadow: bool = False,
    ) -> Candidate:
        """Validate and load a candidate version of each adapter in `versions` (adapter -> (path,
        version)); none becomes current and no episode pins them until `set_canary_share`. All or
        nothing: one refused version unloads the others. `shadow`: every canary episode is answered
        again by the incumbent (`hold_shadow`)."""
        async with self._admin_step():
            if self.candidate is not None:
                raise AdapterError("a candidate is loaded already; promote or abandon it first")
            if not versions:
                raise AdapterError("a candidate needs at least one adapter version")
            loaded: list[AdapterVersion] = []
            try:
                for adapter, (path, version) in sorted(versions.items()):
                    slot = self._slot(adapter)
                    own = {**(lineage or {}), "incumbent": slot.current.version}
                    entry, _ = await self._load(
                        adapter, Path(path).resolve(), version, slot.current.base, own
                    )
                    entry.status = "candidate"
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
                shadow=shadow,
            )
            self._record(
                "loaded",
                versions=self.candidate.versions,
                incumbent=self.candidate.incumbent,
                lineage=self.candidate.lineage,
                shadow=shadow,
            )
            return self.candidate

    def set_canary_share(self, share: float) -> Candidate:
        """The share of new episodes that pin the candidate (each episode drawn once, for all its
        adapters); 0 stops sending episodes to it."""
        if self.candidate is None:
            raise AdapterError("no candidate is loaded")
        try:
            self.candidate.set_share(share)
        except ValueError as e:
            raise AdapterError(str(e)) from None
        if self.log is not None and self.log.shared:  # the other replicas draw at this share too
            self._record("share", share=share)
        return self.candidate

    async def promote_candidate(self) -> dict[str, int]:
        """Make every candidate version current at once: the assignments run with no await between
        them, so no episode pins the new version of one adapter with the old version of another."""
        async with self._admin_step():
            candidate = self._require_candidate()
            previous = [self._slots[a].current for a in candidate.versions]
            self._record_change("promoted", candidate.versions, versions=candidate.versions)
            for adapter, version in candidate.versions.items():  # the switch: one event-loop step
                self._slots[adapter].promoted.append(version)
                self._slots[adapter].versions[version].status = "promoted"
            self.candidate = None
            self.decisions["promoted"] += 1
            self.promotions.append(dict(candidate.versions))
            self._note_team()
            for adapter in candidate.versions:
                self.swaps[adapter] += 1
            for v in previous:
                await self._unload_if_idle(v)
            return dict(candidate.versions)

    async def rollback_promotion(self) -> dict[str, int]:
        """Undo the last candidate promotion for all its roles in one step: each goes back to the version
        it had before (reloaded first where it was unloaded). Refused when a role moved on since."""
        async with self._admin_step():
            if not self.promotions:
                raise AdapterError("no promoted candidate to roll back")
            last = self.promotions[-1]
            if self.candidate is not None:
                raise AdapterError("a candidate is loaded; promote or abandon it first")
            moved = [a for a, v in last.items() if self._slots[a].current.version != v]
            if moved:
                raise AdapterError(f"adapters {moved} changed since the promotion; roll them back one by one")
            previous = {a: self._slots[a].versions[self._slots[a].promoted[-2]] for a in last}
            for v in previous.values():  # load everything first: the switch below must not await
                if not v.live:
                    await self.engine.load_adapter(v.engine_name, str(v.path), base=v.base)
                    v.live = True
            retired = [self._slots[a].current for a in last]
            self._record_change("promotion_rolled_back", {}, pop=list(last), retired=last)
            for adapter in last:  # the switch back: one event-loop step
                self._slots[adapter].promoted.pop()
                self._slots[adapter].versions[last[adapter]].status = "rolled_back"
            self.promotions.pop()
            self.decisions["promotion_rolled_back"] += 1
            for adapter in last:
                self.rollbacks[adapter] += 1
            for v in retired:
                await self._unload_if_idle(v)
            return {a: v.version for a, v in previous.items()}

    async def abandon_candidate(self, rolled_back: bool = False, reason: str | None = None) -> dict[str, int]:
        """Drop the candidate: new episodes pin the incumbent only; its versions unload once the canary
        episodes that pinned them end. `rolled_back`: its canary decided against it (listed as rolled
        back, not abandoned). Returns the versions dropped."""
        async with self._admin_step():
            candidate = self._require_candidate()
            event = "candidate_rolled_back" if rolled_back else "abandoned"
            self._record(event, versions=candidate.versions, reason=reason)
            self.decisions["rolled_back" if rolled_back else "abandoned"] += 1
            self.candidate = None
            for adapter, version in candidate.versions.items():
                entry = self._slots[adapter].versions[version]
                entry.status = "rolled_back" if rolled_back else "abandoned"
                self.rollbacks[adapter] += 1
                await self._unload_if_idle(entry)
            return dict(candidate.versions)

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

    # --- the promotion log --------------------------------------------------------------------
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

    # --- several replicas: one shared log ----------------------------------------------------------
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

    async def _make_live(self, entry: AdapterVersion) -> None:
        if not entry.live:
            await self.engine.load_adapter(entry.engine_name, str(entry.path), base=entry.base)
            entry.live = True

    def _require_candidate(self) -> Candidate:
        if self.candidate is None:
            raise AdapterError("no candidate is loaded")
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
            version = version_of(path)
            version = max(known, default=0) + 1 if version is None else version
        if version in known:
            raise AdapterError(f"version {version} is already registered; push a new version or roll back")
        return version

    # --- pinning -------------------------------------------------------------------------------
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
