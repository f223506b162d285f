"""Wake-ups: a request may wait for a change without holding a thread or a database connection.

A writer calls :func:`wake_after_commit` inside its transaction with a topic and a key (for the lease feed:
``"lease_feed"`` and ``"<operator id>:<cluster id>"``). A waiting request, on the ASGI server's event loop,
calls :func:`wait_for` with the topic and the keys it cares about and is resumed when one of them is woken,
or when its timeout passes. Keys are hierarchical: waking ``"7:42"`` also wakes the waiters of ``"7"``.

On PostgreSQL the wake-up is ``pg_notify`` in the writer's own transaction, so it is delivered exactly when the
change becomes visible (never before it commits, never for a rollback) and reaches every server process,
whichever process — web, Celery worker — made the change. Each server process keeps **one** listening
connection per event loop (not one per waiter); the waiters are futures in a dictionary. While that connection
is down every waiter is woken once it is back, so a notification lost in between costs a re-check, not a
missed change.

Elsewhere (SQLite under ``make run``) there is no cross-process signal: a writer in the same process wakes
waiters after commit, and waiters also re-check every ``CARDHOUR_WAKEUP_FALLBACK_POLL_SECONDS``.

Waiters re-check the database themselves after a wake-up: a key is only a hint that something changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, connections, transaction

logger = logging.getLogger(__name__)

_TOPIC = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
_CHANNEL_PREFIX = "cardhour_"
_RECONNECT_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)


def _channel(topic: str) -> str:
    if not _TOPIC.match(topic):
        raise ValueError(f"not a wake-up topic: {topic!r}")
    return _CHANNEL_PREFIX + topic


def _on_postgresql(alias: str = "default") -> bool:
    # From the settings, not ``connections[alias].vendor``: on the event loop every request is a new
    # async context, and asking ``connections`` there builds a new database wrapper each time.
    return "postgresql" in connections.settings[alias]["ENGINE"]


def wake_after_commit(*, topic: str, key: str) -> None:
    """Wake the waiters of ``topic``/``key`` when the current transaction commits (at once outside one).

    On PostgreSQL this is a NOTIFY queued in the transaction (PostgreSQL folds duplicates within one
    transaction); elsewhere a same-process wake-up registered with ``on_commit``.
    """
    channel = _channel(topic)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, key])
    else:
        transaction.on_commit(lambda: _hubs_wake(channel, key))


# --- The per-process hub ---------------------------------------------------------------------------


class _Hub:
    """The waiters of one event loop, and the one connection that listens for them (PostgreSQL)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiters: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        self.channels: set[str] = set()
        self.listener: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        self.conn: Any = None
        # Counts every notification received and every change of the listener's state: a request that
        # marked the hub before its check and finds the count unchanged once subscribed knows nothing
        # it waits for arrived in between (see Mark).
        self.epoch = 0

    # Called on the hub's loop.
    def wake(self, channel: str, key: str) -> None:
        """Wake the waiters of ``key`` and of each of its ``:`` prefixes ("7:42" wakes "7:42" and "7")."""
        self.epoch += 1
        parts = key.split(":")
        for end in range(len(parts), 0, -1):
            for future in self.waiters.get((channel, ":".join(parts[:end])), ()):
                if not future.done():
                    future.set_result(None)

    def wake_all(self) -> None:
        self.epoch += 1
        for futures in self.waiters.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)

    async def ensure_listening(self, channel: str) -> None:
        if channel not in self.channels:
            self.channels.add(channel)
            if self.listener is not None and not self.listener.done():
                # A new channel (once per channel and process): restart the listener to LISTEN to it too.
                self.listener.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self.listener
                self.listener = None
        if self.listener is None or self.listener.done():
            self.listening.clear()
            self.listener = self.loop.create_task(self._listen(), name="cardhour-wakeups")
        # Until the listener is subscribed a NOTIFY could pass unseen: wait for it briefly. (If it never
        # comes up, the waiters are woken when it does, or wait out their time and re-check then.)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.listening.wait(), timeout=2.0)

    async def _listen(self) -> None:
        import psycopg

        attempt = 0
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(**_listen_params(), autocommit=True)
                async with conn:
                    self.conn = conn
                    for channel in sorted(self.channels):
                        await conn.execute(f'LISTEN "{channel}"')
                    attempt = 0
                    self.listening.set()
                    # Whatever happened while not listening: every waiter re-checks.
                    self.wake_all()
                    async for note in conn.notifies():
                        self.wake(note.channel, note.payload)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("wake-up listener lost its connection; reconnecting", exc_info=True)
            finally:
                self.conn = None
                self.listening.clear()
                self.epoch += 1
            self.wake_all()
            await asyncio.sleep(_RECONNECT_SECONDS[min(attempt, len(_RECONNECT_SECONDS) - 1)])
            attempt += 1


def _listen_params() -> dict[str, Any]:
    """The default database's connection parameters for a plain psycopg connection (no pool, no Django
    cursor factory), for the listening connection."""
    if settings.CARDHOUR_WAKEUP_DATABASE_URL:
        return {"conninfo": settings.CARDHOUR_WAKEUP_DATABASE_URL.replace("postgres://", "postgresql://", 1)}
    params = dict(connections["default"].get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "options"):
        params.pop(django_only, None)
    return params


_hubs: dict[asyncio.AbstractEventLoop, _Hub] = {}
_hubs_lock = threading.Lock()


def _hub() -> _Hub:
    loop = asyncio.get_running_loop()
    with _hubs_lock:
        hub = _hubs.get(loop)
        if hub is None:
            for stale in [other for other in _hubs if other.is_closed()]:
                del _hubs[stale]
            hub = _hubs[loop] = _Hub(loop)
        return hub


def _hubs_wake(channel: str, key: str) -> None:
    """Same-process wake-up (databases without NOTIFY), from any thread."""
    with _hubs_lock:
        hubs = list(_hubs.values())
    for hub in hubs:
        if not hub.loop.is_closed():
            hub.loop.call_soon_threadsafe(hub.wake, channel, key)


@dataclass(frozen=True)
class Mark:
    """What this process's listener had seen when a request was about to make its check."""

    hub: _Hub | None
    epoch: int
    channels: frozenset[str]


def mark() -> Mark:
    """Mark the listener's state before a check that a subscription may follow (on the event loop).

    :meth:`Subscription.missed_since` then tells whether a re-check is needed once subscribed: if the
    listener was already listening to the topic when marked and has received nothing since, a change
    committed after the check has not arrived yet — its notification will wake the subscription — and one
    committed before it was seen by the check. Saves each waiting request its second check."""
    hub = _hub()
    listening = not _fallback_only() and hub.listening.is_set()
    return Mark(hub=hub, epoch=hub.epoch, channels=frozenset(hub.channels) if listening else frozenset())


def _fallback_only() -> bool:
    return not _on_postgresql()


class Subscription:
    """Interest in some keys of a topic, registered before the caller's last check so nothing committed
    after that check can pass unseen. Use with ``async with subscribe(...) as sub``."""

    def __init__(self, *, topic: str, keys: Iterable[str]) -> None:
        self.channel = _channel(topic)
        self.keys = [(self.channel, key) for key in keys]
        self.hub: _Hub | None = None
        self.future: asyncio.Future[None] | None = None
        self.fallback = not _on_postgresql()

    async def __aenter__(self) -> Subscription:
        self.hub = _hub()
        if not self.fallback:
            await self.hub.ensure_listening(self.channel)
        self._arm()
        return self

    def _arm(self) -> None:
        assert self.hub is not None
        self.future = self.hub.loop.create_future()
        for pair in self.keys:
            self.hub.waiters.setdefault(pair, set()).add(self.future)

    def _disarm(self) -> None:
        if self.hub is None or self.future is None:
            return
        for pair in self.keys:
            futures = self.hub.waiters.get(pair)
            if futures is not None:
                futures.discard(self.future)
                if not futures:
                    del self.hub.waiters[pair]
        self.future = None

    async def __aexit__(self, *exc: object) -> None:
        self._disarm()

    def missed_since(self, marked: Mark) -> bool:
        """Whether something may have arrived between ``marked`` and this subscription (see :func:`mark`):
        True unless the same listener was listening to this topic throughout and received nothing."""
        return not (
            marked.hub is self.hub
            and self.channel in marked.channels
            and self.hub is not None
            and self.hub.listening.is_set()
            and self.hub.epoch == marked.epoch
        )

    async def wait(self, timeout: float) -> bool:
        """Wait for a wake-up (True: re-check) or ``timeout`` seconds (False: nothing happened).

        Without PostgreSQL, answers True after at most ``CARDHOUR_WAKEUP_FALLBACK_POLL_SECONDS``, so that
        changes made by other processes are re-checked. Re-arms itself for the next wait."""
        if timeout <= 0:
            return False
        woke = self.future is not None and self.future.done()
        if not woke:
            assert self.future is not None
            limit = timeout
            if self.fallback:
                limit = min(timeout, float(settings.CARDHOUR_WAKEUP_FALLBACK_POLL_SECONDS))
            try:
                await asyncio.wait_for(asyncio.shield(self.future), timeout=limit)
                woke = True
            except TimeoutError:
                woke = self.fallback and limit < timeout
        self._disarm()
        self._arm()
        return woke


def subscribe(*, topic: str, keys: Iterable[str]) -> Subscription:
    """Interest in ``keys`` of ``topic`` for this request (see :class:`Subscription`)."""
    return Subscription(topic=topic, keys=keys)


def waiting_count() -> int:
    """How many requests wait in this process (for metrics)."""
    with _hubs_lock:
        hubs = list(_hubs.values())
    return sum(len({id(f) for fs in hub.waiters.values() for f in fs}) for hub in hubs)
