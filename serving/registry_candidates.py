"""An adapter registry's candidate team (serving/canary.py `Candidate`): a set of versions loaded beside
the current ones, never current. `load_candidate` validates and loads them, `set_canary_share` sends that
share of new episodes to them (drawn once per episode, for every adapter it covers; with `shadow`,
serving/registry.py `hold_shadow` gives a canary episode the incumbent's versions for its shadow run),
`promote_candidate` makes all of them current in one event-loop step, `rollback_promotion` undoes that,
`abandon_candidate` drops them. Each version keeps its lineage (which run, data and incumbent it came
from) for `teamtr adapters list`.

Candidates live in the registry, beside the current versions, because they share the slots, the admin
lock and the pins of promoted versions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from teamtr.serving.adapter_checks import AdapterError, UnknownAdapterError
from teamtr.serving.adapter_slots import AdapterVersion
from teamtr.serving.canary import Candidate
from teamtr.serving.registry_log import RegistryLog


class RegistryCandidates(RegistryLog):
    """Loads, shares, promotes, rolls back and abandons a candidate team (the module's doc)."""

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
                self.version_promotions[adapter] += 1
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
