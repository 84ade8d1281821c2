"""A circuit breaker per model endpoint, with its state shared by every worker process.

States and transitions (docs/model-client.md "The circuit breaker"):

- ``closed``: calls go through. When a call exhausts its retries the breaker *trips*: ``open``
  with the base cooldown (default 60 s).
- ``open``: calls are refused (the client goes straight to failover) until the cooldown has
  passed since ``opened_at``. The first caller after that claims the single *probe*.
- ``half_open``: exactly one probe is in flight; everyone else is still refused. A successful
  probe resets to ``closed`` with the base cooldown; a failed one re-opens the breaker with the
  cooldown doubled, capped at 10 minutes. A probe whose holder vanished (crash, cancellation)
  can be taken over once its lease has run out.

The decisions are a pure function (:func:`decide`) of a :class:`BreakerSnapshot` and ``now``.
Stores only provide atomic compare-and-set transitions, so every process reaches the same
answer: the database store uses conditional ``UPDATE``\\s (``orchestrator.agents``), the Redis
store below uses Lua scripts, which Redis runs atomically. Time comes from an injectable
``now`` callable (epoch seconds) so tests can drive cooldowns without sleeping.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

MAX_COOLDOWN_SECONDS = 600.0
#: How long a process trusts a closed breaker it read, without asking the store again (the
#: production breaker; 0 = ask every time). Any failure this process sees forgets it at once;
#: a breaker another process opened is seen here at most this much later.
CLOSED_CACHE_SECONDS = 0.25
#: Consecutive failed requests (all callers, all processes) that open a closed breaker even
#: before one call has exhausted its retries (docs/reliability.md P5: "opens after <= 5").
FAILURE_THRESHOLD = 5
T = TypeVar("T")
logger = logging.getLogger(__name__)


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerSnapshot:
    """One read of a breaker. ``stamp`` identifies the current episode for compare-and-set."""

    state: BreakerState = BreakerState.CLOSED
    #: open: when it (re)opened; half_open: when the current probe began. Epoch seconds.
    opened_at: float | None = None
    cooldown: float = 60.0
    failures: int = 0
    probe_owner: str = ""
    #: The stored form of ``opened_at``, compared verbatim by ``claim_probe``.
    stamp: str = ""


class Verdict(enum.StrEnum):
    ALLOW = "allow"  # closed: call normally, with retries
    PROBE = "probe"  # this caller holds the single half-open probe (one attempt, no retries)
    DENY = "deny"  # open or someone else is probing: skip this endpoint


@dataclass(frozen=True)
class CircuitAdmission:
    key: str
    verdict: Verdict
    token: str = ""
    #: For DENY: seconds until a probe may be attempted.
    retry_in: float = 0.0
    #: For DENY: refused because a probe is in flight (half-open, or another caller just won
    #: the probe). ``retry_in`` is then the probe's lease, which only matters when its holder
    #: vanished: a live probe ends within one request, closing or re-opening the breaker.
    probing: bool = False
    #: For ALLOW: consecutive failures counted when admitted (a success then resets them).
    failures: int = 0

    @property
    def allowed(self) -> bool:
        return self.verdict is not Verdict.DENY


def decide(snapshot: BreakerSnapshot, now: float, probe_lease: float) -> tuple[bool, float]:
    """(may this caller try to claim or use the endpoint?, seconds until it may).

    Closed → (True, 0). Open → claimable once the cooldown has passed. Half-open → claimable
    only when the current probe's lease has run out (its holder is presumed dead).
    """
    if snapshot.state is BreakerState.CLOSED:
        return True, 0.0
    started = snapshot.opened_at or 0.0
    due = started + (snapshot.cooldown if snapshot.state is BreakerState.OPEN else probe_lease)
    return (True, 0.0) if now >= due else (False, due - now)


class BreakerStore(Protocol):
    """Atomic transitions of shared breaker state. Methods block; ``run`` offloads them."""

    def read(self, key: str) -> BreakerSnapshot: ...

    def claim_probe(self, key: str, *, expected: BreakerSnapshot, token: str, now: float) -> bool:
        """open/half_open (exactly as in ``expected``) → half_open owned by ``token``."""
        ...

    def trip(self, key: str, *, now: float, cooldown: float) -> bool:
        """closed → open with ``cooldown``; False (no change) when not closed."""
        ...

    def probe_failed(self, key: str, *, token: str, now: float, max_cooldown: float) -> bool:
        """half_open owned by ``token`` → open with the cooldown doubled (capped)."""
        ...

    def probe_succeeded(self, key: str, *, token: str, cooldown: float) -> bool:
        """half_open owned by ``token`` → closed with the base ``cooldown``."""
        ...

    def count_failure(self, key: str, *, now: float, cooldown: float, threshold: int) -> bool:
        """One failed request while closed: count it, and at ``threshold`` consecutive ones
        open with ``cooldown``. True when the breaker is not closed afterwards."""
        ...

    def reset_failures(self, key: str) -> None:
        """A request succeeded while closed: the consecutive count starts again."""
        ...

    async def run(self, fn: Callable[[], T]) -> T:
        """Run a blocking store call from async code (how depends on the store)."""
        ...


class CircuitBreaker:
    """Policy over a shared :class:`BreakerStore`. Safe to share between tasks and threads."""

    def __init__(
        self,
        store: BreakerStore,
        *,
        now: Callable[[], float] = time.time,
        max_cooldown: float = MAX_COOLDOWN_SECONDS,
        closed_cache_seconds: float = 0.0,
    ) -> None:
        self.store = store
        self.now = now
        self.max_cooldown = max_cooldown
        self.closed_cache_seconds = closed_cache_seconds
        #: key → monotonic time until which a closed, failure-free read is trusted.
        self._closed_until: dict[str, float] = {}
        #: key → failures seen here so far: a read that started before one is not trusted.
        self._seen_failures: dict[str, int] = {}
        self._refreshing: set[str] = set()
        self._refreshes: set[asyncio.Task[None]] = set()

    # --- blocking API (one store round trip each; also used from plain threads) ---------------

    def admit_sync(self, key: str, *, probe_lease: float) -> CircuitAdmission:
        """Closed → ALLOW; open past its cooldown → PROBE for exactly one caller; else DENY."""
        snapshot = self.store.read(key)
        now = self.now()
        claimable, wait = decide(snapshot, now, probe_lease)
        if snapshot.state is BreakerState.CLOSED:
            return CircuitAdmission(key, Verdict.ALLOW, failures=snapshot.failures)
        if not claimable:
            probing = snapshot.state is BreakerState.HALF_OPEN
            return CircuitAdmission(key, Verdict.DENY, retry_in=wait, probing=probing)
        token = uuid.uuid4().hex
        if self.store.claim_probe(key, expected=snapshot, token=token, now=now):
            return CircuitAdmission(key, Verdict.PROBE, token=token)
        # Another caller won the claim between our read and our write.
        return CircuitAdmission(key, Verdict.DENY, retry_in=probe_lease, probing=True)

    def record_failure_sync(self, admission: CircuitAdmission, *, cooldown: float) -> None:
        """The endpoint is unavailable (retries exhausted, or the probe failed)."""
        if admission.verdict is Verdict.PROBE:
            cap = max(self.max_cooldown, cooldown)
            self.store.probe_failed(
                admission.key, token=admission.token, now=self.now(), max_cooldown=cap
            )
        elif admission.verdict is Verdict.ALLOW:
            self.store.trip(admission.key, now=self.now(), cooldown=cooldown)

    def record_success_sync(self, admission: CircuitAdmission, *, cooldown: float) -> None:
        """The endpoint answered. Only a probe changes state: it closes the breaker."""
        if admission.verdict is Verdict.PROBE:
            self.store.probe_succeeded(admission.key, token=admission.token, cooldown=cooldown)

    def count_failure_sync(self, admission: CircuitAdmission, *, cooldown: float) -> bool:
        """One failed attempt of an admitted (closed) call; True when the breaker is open now
        (this failure reached the threshold, or another caller opened it): stop retrying."""
        if admission.verdict is not Verdict.ALLOW:
            return False
        return self.store.count_failure(
            admission.key, now=self.now(), cooldown=cooldown, threshold=FAILURE_THRESHOLD
        )

    def snapshot(self, key: str) -> BreakerSnapshot:
        return self.store.read(key)

    def next_probe_in_sync(self, key: str) -> float | None:
        """Seconds until an open breaker admits its next probe (0 when due); None when it is
        not open (closed, or a probe is in flight)."""
        snapshot = self.store.read(key)
        if snapshot.state is not BreakerState.OPEN:
            return None
        return max((snapshot.opened_at or 0.0) + snapshot.cooldown - self.now(), 0.0)

    # --- async API (what the model client uses) -------------------------------------------------
    #
    # A breaker protects endpoints; it must not become the outage itself. When its store is
    # unreachable (Redis down) calls are admitted as if closed and state changes are dropped.

    async def admit(self, key: str, *, probe_lease: float) -> CircuitAdmission:
        if self._closed_until.get(key, 0.0) > time.monotonic():
            return CircuitAdmission(key, Verdict.ALLOW)  # closed, no failures, read moments ago
        seen = self._seen_failures.get(key, 0)
        try:
            fn = functools.partial(self.admit_sync, key, probe_lease=probe_lease)
            admission = await self.store.run(fn)
        except Exception:
            logger.warning("breaker store unavailable; admitting %s as closed", key, exc_info=True)
            return CircuitAdmission(key, Verdict.ALLOW)
        if admission.verdict is Verdict.ALLOW and admission.failures == 0:
            self._trust(key, seen)
        return admission

    def _trust(self, key: str, seen: int) -> None:
        """Trust a closed, failure-free read (begun when ``seen`` failures were seen here) for
        the cache's window, unless a failure was seen here since it began."""
        if self.closed_cache_seconds and self._seen_failures.get(key, 0) == seen:
            self._closed_until[key] = time.monotonic() + self.closed_cache_seconds

    def _forget(self, key: str) -> None:
        """A failure was seen: the next admission asks the store."""
        self._seen_failures[key] = self._seen_failures.get(key, 0) + 1
        self._closed_until.pop(key, None)

    def _refresh_ahead(self, key: str) -> None:
        """After a successful call, with less than half of the trust left: re-read the store in
        the background, so the next call finds a fresh trust instead of waiting for the store.
        Trust still never outlives the window after the read it rests on."""
        left = self._closed_until.get(key, 0.0) - time.monotonic()
        if not 0 < left < self.closed_cache_seconds / 2 or key in self._refreshing:
            return
        self._refreshing.add(key)
        task = asyncio.get_running_loop().create_task(self._refresh(key))
        self._refreshes.add(task)
        task.add_done_callback(self._refreshes.discard)

    async def _refresh(self, key: str) -> None:
        seen = self._seen_failures.get(key, 0)
        try:
            snapshot = await self.store.run(functools.partial(self.store.read, key))
        except Exception:
            return  # the next admission past the window asks again
        finally:
            self._refreshing.discard(key)
        if snapshot.state is BreakerState.CLOSED and snapshot.failures == 0:
            self._trust(key, seen)

    async def record_failure(self, admission: CircuitAdmission, *, cooldown: float) -> None:
        self._forget(admission.key)
        if admission.verdict is not Verdict.DENY:
            fn = functools.partial(self.record_failure_sync, admission, cooldown=cooldown)
            await self._run_quietly(fn, admission.key)

    async def record_success(
        self, admission: CircuitAdmission, *, cooldown: float, failed_attempts: int = 0
    ) -> None:
        if admission.verdict is Verdict.PROBE:
            fn = functools.partial(self.record_success_sync, admission, cooldown=cooldown)
            await self._run_quietly(fn, admission.key)
        elif admission.verdict is Verdict.ALLOW and (admission.failures or failed_attempts):
            # Only then: a healthy endpoint costs no store write per call.
            await self._run_quietly(
                functools.partial(self.store.reset_failures, admission.key), admission.key
            )
        elif admission.verdict is Verdict.ALLOW:
            self._refresh_ahead(admission.key)

    async def next_probe_in(self, key: str) -> float | None:
        """:meth:`next_probe_in_sync`; None as well when the store is unreachable."""
        try:
            return await self.store.run(functools.partial(self.next_probe_in_sync, key))
        except Exception:
            logger.warning("breaker store unavailable; next probe of %s not known", key)
            return None

    async def count_failure(self, admission: CircuitAdmission, *, cooldown: float) -> bool:
        self._forget(admission.key)
        try:
            fn = functools.partial(self.count_failure_sync, admission, cooldown=cooldown)
            return await self.store.run(fn)
        except Exception:
            logger.warning("breaker store unavailable; failure of %s not counted", admission.key)
            return False

    async def _run_quietly(self, fn: Callable[[], None], key: str) -> None:
        try:
            await self.store.run(fn)
        except Exception:
            logger.warning("breaker store unavailable; state of %s not updated", key, exc_info=True)


# --- Redis store --------------------------------------------------------------------------------

# Each script is one atomic step on the breaker's hash (fields: state, opened_at, cooldown,
# failures, probe_owner). A missing hash reads as closed. Redis runs a script without
# interleaving other commands, which is what makes "exactly one probe" hold across processes.
_CLAIM = """
local v = redis.call('HMGET', KEYS[1], 'state', 'opened_at', 'probe_owner')
if (v[1] or 'closed') ~= ARGV[1] or (v[2] or '') ~= ARGV[2] or (v[3] or '') ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'half_open', 'probe_owner', ARGV[4], 'opened_at', ARGV[5])
return 1
"""
_TRIP = """
if (redis.call('HGET', KEYS[1], 'state') or 'closed') ~= 'closed' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', ARGV[1], 'cooldown', ARGV[2],
           'probe_owner', '')
redis.call('HINCRBY', KEYS[1], 'failures', 1)
return 1
"""
_PROBE_FAILED = """
local v = redis.call('HMGET', KEYS[1], 'state', 'probe_owner', 'cooldown')
if v[1] ~= 'half_open' or v[2] ~= ARGV[1] then return 0 end
local cooldown = math.min(tonumber(v[3]) * 2, tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', ARGV[2], 'cooldown',
           tostring(cooldown), 'probe_owner', '')
redis.call('HINCRBY', KEYS[1], 'failures', 1)
return 1
"""
_COUNT_FAILURE = """
if (redis.call('HGET', KEYS[1], 'state') or 'closed') ~= 'closed' then return 1 end
local n = redis.call('HINCRBY', KEYS[1], 'failures', 1)
if n < tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', ARGV[1], 'cooldown', ARGV[2],
           'probe_owner', '')
return 1
"""
_RESET_FAILURES = """
if (redis.call('HGET', KEYS[1], 'state') or 'closed') == 'closed' then
  redis.call('HSET', KEYS[1], 'failures', 0)
end
return 1
"""
_PROBE_SUCCEEDED = """
local v = redis.call('HMGET', KEYS[1], 'state', 'probe_owner')
if v[1] ~= 'half_open' or v[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'closed', 'opened_at', '', 'cooldown', ARGV[2],
           'probe_owner', '', 'failures', 0)
return 1
"""


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


class RedisBreakerStore:
    """Breaker state in a Redis hash per key; transitions are Lua scripts (atomic).

    Uses the blocking ``redis`` client in a worker thread: it is thread-safe and, unlike the
    asyncio client, not bound to one event loop, so one store serves every loop in a process.
    """

    def __init__(self, client: Any, *, prefix: str = "loopwright:breaker:") -> None:
        self.client = client
        self.prefix = prefix
        self._claim = client.register_script(_CLAIM)
        self._trip = client.register_script(_TRIP)
        self._probe_failed = client.register_script(_PROBE_FAILED)
        self._probe_succeeded = client.register_script(_PROBE_SUCCEEDED)
        self._count_failure = client.register_script(_COUNT_FAILURE)
        self._reset_failures = client.register_script(_RESET_FAILURES)

    @classmethod
    def from_url(cls, url: str) -> RedisBreakerStore:
        import redis

        return cls(redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5))

    def _key(self, key: str) -> str:
        return self.prefix + key

    def read(self, key: str) -> BreakerSnapshot:
        raw = {_decode(k): _decode(v) for k, v in self.client.hgetall(self._key(key)).items()}
        if not raw:
            return BreakerSnapshot()
        stamp = raw.get("opened_at", "")
        return BreakerSnapshot(
            state=BreakerState(raw.get("state") or "closed"),
            opened_at=float(stamp) if stamp else None,
            cooldown=float(raw.get("cooldown") or 60),
            failures=int(raw.get("failures") or 0),
            probe_owner=raw.get("probe_owner", ""),
            stamp=stamp,
        )

    def claim_probe(self, key: str, *, expected: BreakerSnapshot, token: str, now: float) -> bool:
        args = [expected.state.value, expected.stamp, expected.probe_owner, token, repr(now)]
        return bool(self._claim(keys=[self._key(key)], args=args))

    def trip(self, key: str, *, now: float, cooldown: float) -> bool:
        return bool(self._trip(keys=[self._key(key)], args=[repr(now), repr(cooldown)]))

    def probe_failed(self, key: str, *, token: str, now: float, max_cooldown: float) -> bool:
        args = [token, repr(now), repr(max_cooldown)]
        return bool(self._probe_failed(keys=[self._key(key)], args=args))

    def probe_succeeded(self, key: str, *, token: str, cooldown: float) -> bool:
        return bool(self._probe_succeeded(keys=[self._key(key)], args=[token, repr(cooldown)]))

    def count_failure(self, key: str, *, now: float, cooldown: float, threshold: int) -> bool:
        args = [repr(now), repr(cooldown), str(threshold)]
        return bool(self._count_failure(keys=[self._key(key)], args=args))

    def reset_failures(self, key: str) -> None:
        self._reset_failures(keys=[self._key(key)])

    def clear(self, key: str) -> None:
        """Forget a breaker (operators' reset; also used by tests)."""
        self.client.delete(self._key(key))

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)
