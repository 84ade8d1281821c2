"""Live text: what a streaming model call of a run has said so far, for the run page.

While a model step streams, the text the client releases (``on_text``; preambles before tool
calls are never released) is kept as one small entry per invocation of the run — the latest
tail of at most :data:`MAX_CHARS` characters — in a shared store, written at most every
:data:`WRITE_INTERVAL_SECONDS` and removed when the call returns (its step is persisted right
after). Nothing of it is a record: the persisted step is the truth, the entry only bridges the
seconds before it exists. The store is Redis when ``REDIS_URL`` is set (one hash per run, with a
TTL) and files under ``VAR_DIR/live-text/<run>/`` otherwise (the embedded default, where worker
and web are separate processes); an entry older than :data:`TTL_SECONDS` (a worker that died
mid-stream) is ignored. A failing store never fails the model call nor the page: live text is
then simply not shown.

Writer: :class:`LiveTextClient` wraps a model client for one invocation. Reader:
:func:`read` (the run page's live feed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings

from runtime.invocation import InvocationRequest
from runtime.streaming import TextCallback
from runtime.types import ChatRequest, ChatResponse

logger = logging.getLogger(__name__)

#: The tail of the text an entry keeps (the page shows the latest words, not a transcript).
MAX_CHARS = 4000
#: At most one store write per call in this interval (the last text is written at its end).
WRITE_INTERVAL_SECONDS = 0.25
#: An entry not refreshed for this long is left over by a worker that died mid-stream.
TTL_SECONDS = 600.0
_REDIS_PREFIX = "loopwright:live-text:"


@dataclass(frozen=True)
class LiveText:
    """The text one invocation's model call in flight has released so far (its tail)."""

    invocation: str
    role: str
    text: str
    #: How many characters were released in all (more than ``len(text)`` when cut).
    chars: int
    #: Epoch seconds of the write.
    at: float

    @property
    def truncated(self) -> bool:
        return self.chars > len(self.text)

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str | bytes) -> LiveText | None:
        try:
            data = json.loads(raw)
            return cls(
                invocation=str(data["invocation"]),
                role=str(data["role"]),
                text=str(data["text"]),
                chars=int(data["chars"]),
                at=float(data["at"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


class Store(Protocol):
    def put(self, run_id: uuid.UUID, entry: LiveText) -> None: ...

    def clear(self, run_id: uuid.UUID, invocation: str) -> None: ...

    def entries(self, run_id: uuid.UUID) -> list[LiveText]: ...


class RedisStore:
    """One hash per run (field: invocation), expiring :data:`TTL_SECONDS` after its last write."""

    def __init__(self, client: Any) -> None:
        self.client = client

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        import redis

        return cls(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2))

    def put(self, run_id: uuid.UUID, entry: LiveText) -> None:
        key = _REDIS_PREFIX + str(run_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(key, entry.invocation, entry.encode())
        pipe.expire(key, int(TTL_SECONDS))
        pipe.execute()

    def clear(self, run_id: uuid.UUID, invocation: str) -> None:
        self.client.hdel(_REDIS_PREFIX + str(run_id), invocation)

    def entries(self, run_id: uuid.UUID) -> list[LiveText]:
        raw = self.client.hgetall(_REDIS_PREFIX + str(run_id))
        return [entry for value in raw.values() if (entry := LiveText.decode(value)) is not None]


class FileStore:
    """A directory per run, a file per invocation, each written whole by an atomic rename."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, run_id: uuid.UUID) -> Path:
        return self.root / str(run_id)

    @staticmethod
    def _name(invocation: str) -> str:
        return hashlib.sha256(invocation.encode()).hexdigest()[:24] + ".json"

    def put(self, run_id: uuid.UUID, entry: LiveText) -> None:
        folder = self._dir(run_id)
        path = folder / self._name(entry.invocation)
        temporary = folder / f".{path.name}.{os.getpid()}.{id(entry)}"
        for _ in range(2):  # a concurrent clear() may remove the (empty) folder in between
            folder.mkdir(parents=True, exist_ok=True)
            try:
                temporary.write_text(entry.encode(), encoding="utf-8")
            except FileNotFoundError:
                continue
            os.replace(temporary, path)
            return

    def clear(self, run_id: uuid.UUID, invocation: str) -> None:
        folder = self._dir(run_id)
        (folder / self._name(invocation)).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty (another invocation streams) or gone
            folder.rmdir()

    def entries(self, run_id: uuid.UUID) -> list[LiveText]:
        try:
            paths = list(self._dir(run_id).glob("*.json"))
        except OSError:
            return []
        found = []
        for path in paths:
            with contextlib.suppress(OSError):
                entry = LiveText.decode(path.read_text(encoding="utf-8"))
                if entry is not None:
                    found.append(entry)
        return found


@functools.cache
def store() -> Store:
    """The process's store: Redis when ``REDIS_URL`` is set, else files under ``VAR_DIR``."""
    if settings.REDIS_URL:
        return RedisStore.from_url(settings.REDIS_URL)
    return FileStore(Path(settings.VAR_DIR) / "live-text")


def read(run_id: uuid.UUID, *, now: float | None = None) -> list[LiveText]:
    """The live text of the run's model calls in flight, by invocation (a stale entry is
    removed); [] when the store cannot be read."""
    now = time.time() if now is None else now
    try:
        found = store().entries(run_id)
        for stale in (entry for entry in found if now - entry.at >= TTL_SECONDS):
            store().clear(run_id, stale.invocation)
    except Exception:
        logger.warning("live text of run %s could not be read", run_id, exc_info=True)
        return []
    fresh = [entry for entry in found if now - entry.at < TTL_SECONDS]
    return sorted(fresh, key=lambda entry: entry.invocation)


# --- The writer -------------------------------------------------------------------------------


class StreamingClient(Protocol):
    """A model client that takes a per-call text callback (both production clients do)."""

    async def complete(
        self, request: ChatRequest, *, on_text: TextCallback | None = None
    ) -> ChatResponse: ...


class LiveTextClient:
    """``inner`` for one invocation: every streamed call's released text goes to the store,
    throttled, and is removed when the call returns or fails."""

    def __init__(
        self,
        inner: StreamingClient,
        request: InvocationRequest,
        *,
        store: Store | None = None,
        interval: float = WRITE_INTERVAL_SECONDS,
    ) -> None:
        self.inner = inner
        self.run_id = request.run_id
        self.invocation = request.invocation
        self.role = str(request.role)
        self.store = store
        self.interval = interval

    async def complete(self, request: ChatRequest) -> ChatResponse:
        if not request.stream:
            return await self.inner.complete(request)
        sink = _Sink(self, self.store or store())
        try:
            return await self.inner.complete(request, on_text=sink)
        finally:
            await sink.close()


class _Sink:
    """One call's text, kept in memory; one flush task at a time writes its latest state."""

    def __init__(
        self, owner: LiveTextClient, target: Store, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.owner = owner
        self.target = target
        self.clock = clock
        self.tail = ""
        self.chars = 0
        self.written_at = float("-inf")
        self.flush: asyncio.Task[None] | None = None
        self.writing = False
        self.closed = False
        #: A write was attempted: the entry may exist and is removed at the end.
        self.wrote = False

    def __call__(self, delta: str) -> None:
        self.tail = (self.tail + delta)[-MAX_CHARS:]
        self.chars += len(delta)
        if self.flush is None or self.flush.done():
            self.flush = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        """Write the latest text once the interval since the last write is over, again while
        more arrived during a write; cancelled (by close) only while waiting."""
        while True:
            wait = self.written_at + self.owner.interval - self.clock()
            if wait > 0:
                await asyncio.sleep(wait)
            self.writing = True
            chars = self.chars
            entry = LiveText(self.owner.invocation, self.owner.role, self.tail, chars, time.time())
            self.written_at = self.clock()
            self.wrote = True
            try:
                await self._io(self.target.put, self.owner.run_id, entry)
            finally:
                self.writing = False
            if self.chars == chars or self.closed:
                return

    async def close(self) -> None:
        """Stop writing (a write in progress finishes first), then remove the entry."""
        self.closed = True
        task = self.flush
        if task is not None and not task.done():
            if not self.writing:
                task.cancel()
            await asyncio.wait([task])
        if self.wrote:
            await self._io(self.target.clear, self.owner.run_id, self.owner.invocation)

    async def _io(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            await asyncio.to_thread(fn, *args)
        except Exception:
            logger.warning("live text of run %s: store failed", self.owner.run_id, exc_info=True)
