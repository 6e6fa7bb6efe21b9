"""`VLLMReplicaEngine`: the Engine interface over SEVERAL vLLM servers per base model (replicas).

Each replica is one vLLM server (launched, or attached by URL; each may itself span GPUs with vLLM's
tensor / pipeline parallelism, engines/vllm_server.py `VLLMServerConfig`), talked to through its own
`VLLMEngine` (engines/vllm_engine.py), so token ids, log-probs, cache salts and the null adapter are
exactly the single-server ones. What this module adds, and why:

- Routing: an episode (graphs/capture.py sets `active_episode` around each) goes to the replica with the
  fewest requests in flight when its first turn is sent, and every later turn goes there too (its
  prefix cache is there). Calls outside an episode (scoring, direct calls) are routed one by one.
- Adapters: `load_adapter` loads on EVERY replica in rotation and returns only then, so a caller that
  flips to the new name afterwards (serving/registry.py promotes `<adapter>@v<N>` this way; the trainer
  pushes between rollout batches, training/vllm_rollouts.py) never sends an episode to a replica
  without it: an episode keeps the versions pinned at its start on whichever replica it runs. A replica
  that fails the load is taken out of rotation (reported in `events` and the log) rather than serve
  another version under the same name; if every replica refuses, the adapter is at fault: the error is
  raised and nothing is taken out.
- Failures: a request that fails for the replica's sake (connection refused or dropped, 5xx, an adapter
  the replica should have but lost in a restart) takes the replica out and is resent to another; a
  streamed request whose first piece went out already is not resent (the caller saw it).
- Rejoin: a background thread probes every replica (`/health`, and `/v1/models` for the adapters it
  should hold). An out-of-rotation replica that answers again first gets every current adapter loaded,
  then rejoins; a replica that restarted unnoticed (its adapters gone) is taken out and rejoins the same
  way.

Routing, adapter loads and the rejoin share one rotation and one lock. docs/scale.md has where replicas
run on one GPU, a node and several nodes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from teamtr.engines.vllm_engine import VLLMEngine
from teamtr.engines.vllm_http import VLLMBase, VLLMRequestError
from teamtr.engines.vllm_server import VLLMServer
from teamtr.graphs.chat_model import active_episode
from teamtr.graphs.engine import DEFAULT_BASE, Generation, SamplingParams

log = logging.getLogger(__name__)

# HTTP statuses that say the replica, not the request, is at fault (0: no HTTP answer at all)
REPLICA_FAILURE_STATUSES = frozenset({0, 500, 502, 503, 504})
# health probes a replica in rotation may fail in a row before it is taken out (a failed request takes it
# out at once); probe timeouts are generous for the same reason: a loaded server answers late
PROBE_MISSES = 2
PROBE_TIMEOUT_S = 10.0


class NoReplicaError(RuntimeError):
    """Every replica of a base model is out of rotation."""


@dataclass(frozen=True)
class ReplicaEvent:
    """A replica leaving or joining the rotation, and why (what `VLLMReplicaEngine.events` reports)."""

    at: float  # time.time()
    url: str
    base: str
    kind: str  # "out" | "in"
    reason: str


@dataclass(eq=False)
class Replica:
    base: str
    spec: VLLMBase
    engine: VLLMEngine
    server: VLLMServer | None = None  # launched by `launch_replicas` (stopped by the engine's close)
    in_rotation: bool = True
    outstanding: int = 0  # requests in flight from this engine
    episodes: int = 0  # episodes routed here so far (breaks ties)
    loaded: set[str] = field(default_factory=set)  # adapters whose load finished here
    misses: int = 0  # health probes failed in a row
    reason: str = ""  # why out of rotation

    @property
    def url(self) -> str:
        return self.spec.url


def as_base(server: VLLMServer | VLLMBase) -> VLLMBase:
    return server if isinstance(server, VLLMBase) else VLLMBase.from_server(server)


class VLLMReplicaEngine:
    """Engine protocol over `bases`: base-model name -> its replicas (servers or `VLLMBase`s).

    `probe_interval_s`: how often the health probe runs (0: no background probe; call `probe()`).
    The remaining keywords go to each replica's `VLLMEngine`.
    """

    streams_tokens = True

    def __init__(
        self,
        bases: Mapping[str, Sequence[VLLMServer | VLLMBase]],
        *,
        probe_interval_s: float = 2.0,
        **engine_kwargs: Any,
    ) -> None:
        if not bases or not all(bases.values()):
            raise ValueError("VLLMReplicaEngine needs at least one replica for each base model")
        self._engine_kwargs = engine_kwargs
        self._replicas: dict[str, list[Replica]] = {}
        for name, servers in bases.items():
            self._replicas[name] = []
            for server in servers:
                spec = as_base(server)
                launched = server if isinstance(server, VLLMServer) and server.process is not None else None
                self._replicas[name].append(Replica(name, spec, self._new_engine(name, spec), launched))
        self._lock = threading.Lock()
        self._desired: dict[tuple[str, str], str] = {}  # (base, adapter) -> path every replica must hold
        self._changes = 0  # bumped by every change of _desired (a rejoin retries when it moved)
        self._versions: dict[tuple[str, str], int] = {}
        # episode -> its replica; weak: an episode's entry goes with its capture
        self._routes: weakref.WeakKeyDictionary[Any, Replica] = weakref.WeakKeyDictionary()
        self.events: list[ReplicaEvent] = []
        self._stop = threading.Event()
        self._probe_thread: threading.Thread | None = None
        if probe_interval_s > 0:
            self._probe_thread = threading.Thread(
                target=_probe_loop,
                args=(weakref.ref(self), self._stop, probe_interval_s),
                name="vllm-replica-probe",
                daemon=True,
            )
            self._probe_thread.start()

    def _new_engine(self, base: str, spec: VLLMBase) -> VLLMEngine:
        # a replica that lost its adapters is taken out and reloaded by the probe, not healed in place
        return VLLMEngine({base: spec}, restore_lost_adapters=False, **self._engine_kwargs)

    # ---- bookkeeping -------------------------------------------------------------------------------

    def replicas(self, base: str = DEFAULT_BASE) -> list[Replica]:
        try:
            return list(self._replicas[base])
        except KeyError:
            raise KeyError(
                f"unknown base model {base!r}; this engine serves {sorted(self._replicas)}"
            ) from None

    def in_rotation(self, base: str = DEFAULT_BASE) -> list[str]:
        return [r.url for r in self.replicas(base) if r.in_rotation]

    def base_models(self) -> list[str]:
        return list(self._replicas)

    def adapters(self, base: str = DEFAULT_BASE) -> list[str]:
        return [name for b, name in self._versions if b == base]

    def adapter_version(self, adapter: str | None, base: str = DEFAULT_BASE) -> int:
        """Counted as `VLLMEngine` counts (0 after the first load, +1 per in-place replacement), over
        loads that reached every replica in rotation."""
        if adapter is None:
            return 0
        self.replicas(base)
        try:
            return self._versions[(base, adapter)]
        except KeyError:
            raise KeyError(
                f"unknown adapter {adapter!r} on base {base!r}; have {self.adapters(base)}"
            ) from None

    def tokenizer(self, base: str = DEFAULT_BASE) -> Any:
        return self.replicas(base)[0].engine.tokenizer(base)

    def _take_out(self, replica: Replica, reason: str) -> None:
        with self._lock:
            if not replica.in_rotation:
                return
            replica.in_rotation = False
            replica.reason = reason
            self.events.append(ReplicaEvent(time.time(), replica.url, replica.base, "out", reason))
        log.warning("vLLM replica %s (base %s) out of rotation: %s", replica.url, replica.base, reason)

    # ---- routing -----------------------------------------------------------------------------------

    def _route(self, base: str, tried: set[int]) -> Replica:
        """The episode's replica while it is in rotation, else the least busy one in rotation."""
        episode = active_episode.get()
        with self._lock:
            if episode is not None:
                sticky = self._routes.get(episode)
                if sticky is not None and sticky.in_rotation and id(sticky) not in tried:
                    return sticky
            candidates = [r for r in self.replicas(base) if r.in_rotation and id(r) not in tried]
            if not candidates:
                reasons = "; ".join(
                    f"{r.url}: {r.reason or 'failed this request'}" for r in self.replicas(base)
                )
                raise NoReplicaError(f"no vLLM replica of base {base!r} in rotation ({reasons})")
            chosen = min(candidates, key=lambda r: (r.outstanding, r.episodes))
            if episode is not None:
                chosen.episodes += 1
                self._routes[episode] = chosen
            return chosen

    @contextmanager
    def _busy(self, replica: Replica):
        with self._lock:
            replica.outstanding += 1
        try:
            yield
        finally:
            with self._lock:
                replica.outstanding -= 1

    def _replica_failed(self, e: VLLMRequestError, adapter: str | None, base: str) -> bool:
        """Whether a refused request says the replica (not the request) is at fault."""
        if e.status_code in REPLICA_FAILURE_STATUSES:
            return True
        # 404 for an adapter every replica should hold: this one lost it (restarted)
        return e.status_code == 404 and (adapter is None or (base, adapter) in self._desired)

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        adapter: str | None,
        sampling: SamplingParams,
        base: str = DEFAULT_BASE,
        on_token: Callable[[str], None] | None = None,
    ) -> Generation:
        # read before the request: the version it runs on; an adapter loaded by someone else counts as 0
        version = self._versions.get((base, adapter), 0) if adapter is not None else 0
        tried: set[int] = set()
        while True:
            replica = self._route(base, tried)
            emitted = False

            def relay(piece: str) -> None:
                nonlocal emitted
                emitted = True
                on_token(piece)  # type: ignore[misc]

            try:
                with self._busy(replica):
                    gen = await replica.engine.generate(
                        prompt_ids,
                        adapter=adapter,
                        sampling=sampling,
                        base=base,
                        on_token=relay if on_token is not None else None,
                    )
            except VLLMRequestError as e:
                if emitted or not self._replica_failed(e, adapter, base):
                    raise
                self._take_out(replica, f"request failed: {e}")
                tried.add(id(replica))
                continue
            return replace(gen, adapter_version=version, extra={**gen.extra, "replica": replica.url})

    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None,
        base: str = DEFAULT_BASE,
    ) -> list[list[float]]:
        tried: set[int] = set()
        while True:
            replica = self._route(base, tried)
            try:
                with self._busy(replica):
                    return replica.engine.score(prompts, completions, adapter, base)
            except VLLMRequestError as e:
                if not self._replica_failed(e, adapter, base):
                    raise
                self._take_out(replica, f"scoring failed: {e}")
                tried.add(id(replica))

    # ---- adapters: load everywhere, then the caller flips -------------------------------------------

    async def load_adapter(self, name: str, path: str, base: str = DEFAULT_BASE) -> None:
        """Load `path` as `name` on every replica in rotation (in place where `name` is loaded); returns
        once all have it. Replicas that fail it are taken out; if all fail, the first error is raised and
        the rotation is unchanged."""
        key = (base, name)
        with self._lock:  # desired first: a replica rejoining meanwhile loads it too
            previous = self._desired.get(key)
            self._desired[key] = str(path)
            self._changes += 1
        done: set[int] = set()
        failed: dict[int, tuple[Replica, BaseException]] = {}
        while True:  # until no replica in rotation lacks it (one may rejoin during the loads)
            todo = [r for r in self.replicas(base) if r.in_rotation and id(r) not in done | set(failed)]
            if not todo:
                break
            results = await asyncio.gather(
                *(r.engine.load_adapter(name, str(path), base) for r in todo), return_exceptions=True
            )
            for replica, result in zip(todo, results, strict=True):
                if isinstance(result, BaseException):
                    failed[id(replica)] = (replica, result)
                else:
                    replica.loaded.add(name)
                    done.add(id(replica))
        if not done:
            with self._lock:
                if previous is None:
                    self._desired.pop(key, None)
                else:
                    self._desired[key] = previous
                self._changes += 1
            if failed:
                raise next(iter(failed.values()))[1]
            raise NoReplicaError(f"no vLLM replica of base {base!r} in rotation to load {name!r} on")
        for replica, error in failed.values():
            self._take_out(replica, f"adapter {name!r} from {path} failed to load: {error}")
        self._versions[key] = self._versions.get(key, -1) + 1

    async def unload_adapter(self, name: str, base: str = DEFAULT_BASE) -> None:
        with self._lock:
            self._desired.pop((base, name), None)
            self._changes += 1
        self._versions.pop((base, name), None)
        for replica in self.replicas(base):
            replica.loaded.discard(name)
            if not replica.in_rotation:
                continue  # a restarted replica does not have it; a stale copy only holds a CPU slot
            try:
                await replica.engine.unload_adapter(name, base)
            except VLLMRequestError as e:
                if not self._replica_failed(e, None, base):
                    raise
                self._take_out(replica, f"unload of {name!r} failed: {e}")

    async def served_models(self, base: str = DEFAULT_BASE) -> list[str]:
        """The names every replica in rotation answers to."""
        names: set[str] | None = None
        for replica in self.replicas(base):
            if replica.in_rotation:
                served = set(await replica.engine.served_models(base))
                names = served if names is None else names & served
        return sorted(names or ())

    # ---- health probe and rejoin ---------------------------------------------------------------------

    def _healthy(self, replica: Replica) -> tuple[bool, str]:
        """(answers and holds every adapter it loaded, why not)."""
        try:
            if httpx.get(f"{replica.url}/health", timeout=PROBE_TIMEOUT_S).status_code != 200:
                return False, "/health not 200"
            if not replica.in_rotation:
                return True, ""
            models = httpx.get(f"{replica.url}/v1/models", timeout=PROBE_TIMEOUT_S).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError) as e:
            return False, f"health probe: {type(e).__name__}: {e}"
        missing = set(replica.loaded) - {m["id"] for m in models}
        return (False, f"lost adapters {sorted(missing)} (restarted?)") if missing else (True, "")

    def probe(self) -> None:
        """One round of the health probe: take out the replicas that stopped answering (PROBE_MISSES
        rounds in a row: a busy server may miss one), bring back those that answer again (after loading
        every current adapter on them)."""
        for replicas in self._replicas.values():
            for replica in replicas:
                ok, why = self._healthy(replica)
                replica.misses = 0 if ok else replica.misses + 1
                if replica.in_rotation and not ok and replica.misses >= PROBE_MISSES:
                    self._take_out(replica, why)
                elif not replica.in_rotation and ok:
                    try:
                        self._rejoin(replica)
                    except Exception as e:  # stays out; the next probe tries again
                        replica.reason = f"rejoin failed: {type(e).__name__}: {e}"

    def _rejoin(self, replica: Replica) -> None:
        """Load every desired adapter into a fresh engine for the replica (it may have restarted; the
        fresh engine loads the null adapter again on the first base request), then put it in rotation,
        unless the desired set changed meanwhile: then again."""
        engine = self._new_engine(replica.base, replica.spec)
        while True:
            with self._lock:
                changes = self._changes
                wanted = {name: path for (b, name), path in self._desired.items() if b == replica.base}

            asyncio.run(self._load_all(engine, wanted, replica.base))
            with self._lock:
                if changes != self._changes:
                    continue
                old, replica.engine = replica.engine, engine
                replica.loaded = set(wanted)
                replica.in_rotation, replica.reason = True, ""
                self.events.append(
                    ReplicaEvent(time.time(), replica.url, replica.base, "in", "healthy again")
                )
            old.close()
            log.warning("vLLM replica %s (base %s) back in rotation", replica.url, replica.base)
            return

    @staticmethod
    async def _load_all(engine: VLLMEngine, adapters: dict[str, str], base: str) -> None:
        try:  # in place, all of them: an out-of-rotation replica may hold an older file under a name
            await engine.restore_adapters(base, adapters, only_missing=False)
        finally:
            await engine.aclose()  # the client belongs to this call's event loop

    # ---- closing -----------------------------------------------------------------------------------

    async def aclose(self) -> None:
        for replicas in self._replicas.values():
            for replica in replicas:
                await replica.engine.aclose()

    def close(self) -> None:
        """Stop the probe, close the clients and stop the servers `launch_replicas` started."""
        self._stop.set()
        if self._probe_thread is not None:
            self._probe_thread.join(timeout=10)
        for replicas in self._replicas.values():
            for replica in replicas:
                replica.engine.close()
                if replica.server is not None:
                    replica.server.stop()


def _probe_loop(engine_ref: weakref.ref[VLLMReplicaEngine], stop: threading.Event, interval_s: float) -> None:
    """The probe thread: until `close()`, or until the engine is garbage (a server closed with `aclose`
    only); it holds the engine only while probing."""
    while not stop.wait(interval_s):
        engine = engine_ref()
        if engine is None:
            return
        try:
            engine.probe()
        except Exception:  # never let the probe thread die
            log.exception("vLLM replica probe failed")
        del engine
