"""Backpressure: a bounded admission queue per team and an optional per-API-key rate limit.

`AdmissionGate`: at most `max_in_flight` episodes of a team run at once; up to `max_waiting` more wait
in a first-come-first-served queue; a request that would go past that is refused at once with a 429
whose Retry-After estimates when a place frees (from the recent episode latency). A request of `n`
choices takes `n` places. `RateLimiter`: a token bucket per key, `rpm` requests a minute.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from teamtr.serving.errors import APIError, too_many_requests


@dataclass
class _Waiter:
    places: int
    granted: asyncio.Future


class AdmissionGate:
    def __init__(self, team: str, max_in_flight: int, max_waiting: int) -> None:
        if max_in_flight < 1 or max_waiting < 0:
            raise ValueError(f"team {team!r}: max_in_flight must be >= 1 and max_waiting >= 0")
        self.team, self.max_in_flight, self.max_waiting = team, max_in_flight, max_waiting
        self.in_flight = 0  # episodes admitted and not yet released
        self.waiting = 0  # episodes queued
        self._queue: deque[_Waiter] = deque()
        self.episode_seconds = 1.0  # running mean of an episode's latency, for Retry-After

    def check(self, places: int) -> None:
        """400 for a request that could never be admitted (more choices than the team runs at once)."""
        if places > self.max_in_flight:
            raise APIError(
                400,
                f"n = {places} is more than team {self.team!r} runs at once ({self.max_in_flight})",
                param="n",
                code="n_too_large",
            )

    async def acquire(self, places: int) -> None:
        """Wait for `places` in-flight places (cancellable); 429 when the queue is full."""
        self.check(places)
        if not self._queue and self.in_flight + places <= self.max_in_flight:
            self.in_flight += places
            return
        if self.waiting + places > self.max_waiting:
            backlog = self.in_flight + self.waiting + places - self.max_in_flight
            raise too_many_requests(
                f"team {self.team!r} is at capacity ({self.in_flight} episodes running, "
                f"{self.waiting} waiting)",
                self.episode_seconds * max(1, backlog) / self.max_in_flight,
                "queue_full",
            )
        waiter = _Waiter(places, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        self.waiting += places
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self.release(places)  # granted just as it was cancelled: hand the places on
            else:
                self._queue.remove(waiter)
                self.waiting -= places
                self._wake()
            raise

    def release(self, places: int) -> None:
        self.in_flight -= places
        self._wake()

    def _wake(self) -> None:
        while self._queue and self.in_flight + self._queue[0].places <= self.max_in_flight:
            waiter = self._queue.popleft()
            self.waiting -= waiter.places
            self.in_flight += waiter.places
            waiter.granted.set_result(None)

    def observe_episode(self, seconds: float) -> None:
        self.episode_seconds += 0.2 * (seconds - self.episode_seconds)


class RateLimiter:
    """A token bucket per key: `burst` requests at once, refilled at `rpm` a minute."""

    def __init__(self, rpm: float, burst: int | None = None, max_keys: int = 100_000) -> None:
        if rpm <= 0:
            raise ValueError("rate_limit_rpm must be > 0")
        self.rate = rpm / 60.0
        self.burst = float(burst if burst is not None else max(1, int(rpm)))
        self.max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    def take(self, key: str) -> None:
        now = time.monotonic()
        tokens, at = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            raise too_many_requests(
                f"rate limit of {self.rate * 60:g} requests per minute reached for this key",
                (1 - tokens) / self.rate,
                "rate_limit_exceeded",
            )
        if key not in self._buckets and len(self._buckets) >= self.max_keys:
            self._buckets.pop(next(iter(self._buckets)))  # forget the oldest key: bounded memory
        self._buckets[key] = (tokens - 1, now)
