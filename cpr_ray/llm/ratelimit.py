"""A global request and token rate shared by every LLM actor in the cluster.

Providers limit per key, not per actor: with N actors each throttling alone the key still gets
N times the rate. One named Ray actor holds the buckets; each request reserves its share and
sleeps for the delay it is given, so the cluster as a whole stays under the limits.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import ray
from ray.actor import ActorHandle

from cpr_ray.runs.ray_runtime import on_this_node

LIMITER_NAME = "cpr-llm-rate-limiter"


@dataclass
class Buckets:
    """Reservation-based token buckets: `reserve` returns the wall-clock time the caller may start.

    An absolute start time, not a delay: a delay is stale by however long the reply took to
    travel back, and uneven reply latency would let two reservations land closer than the rate.
    """

    requests_per_second: float | None
    tokens_per_minute: int | None
    _next_request: float = 0.0
    _next_tokens: float = 0.0

    def reserve(self, tokens: int, now: float) -> float:
        start = now
        if self.requests_per_second:
            start = max(start, self._next_request)
            self._next_request = start + 1.0 / self.requests_per_second
        if self.tokens_per_minute:
            start = max(start, self._next_tokens)
            self._next_tokens = start + tokens * 60.0 / self.tokens_per_minute
        return start


@ray.remote(num_cpus=0)
class _LimiterActor:
    def __init__(self, requests_per_second: float | None, tokens_per_minute: int | None):
        self.buckets = Buckets(requests_per_second, tokens_per_minute)
        self.granted: list[float] = []  # every start handed out: what the limiter decided

    def reserve(self, tokens: int) -> float:
        start = self.buckets.reserve(tokens, time.time())
        self.granted.append(start)
        return start

    def starts(self) -> list[float]:
        return list(self.granted)


class ClusterRateLimiter:
    """Client side of the shared limiter (picklable: it finds the actor by name)."""

    def __init__(self, requests_per_second: float | None, tokens_per_minute: int | None):
        self.rps, self.tpm = requests_per_second, tokens_per_minute
        self._actor: ActorHandle | None = None

    @property
    def name(self) -> str:
        return f"{LIMITER_NAME}-{self.rps}-{self.tpm}"

    def start(self) -> ClusterRateLimiter:
        """Create the shared actor once (driver side); later calls reuse it."""
        # mypy does not apply class decorators: ray.remote made _LimiterActor an ActorClass
        self._actor = _LimiterActor.options(  # type: ignore[attr-defined]
            name=self.name, get_if_exists=True, scheduling_strategy=on_this_node()
        ).remote(self.rps, self.tpm)
        return self

    async def acquire(self, tokens: int) -> None:
        if self._actor is None:
            self._actor = ray.get_actor(self.name)
        start = await self._actor.reserve.remote(tokens)
        delay = start - time.time()
        if delay > 0:
            await asyncio.sleep(delay)

    def __getstate__(self) -> dict:
        return {"rps": self.rps, "tpm": self.tpm, "_actor": None}
