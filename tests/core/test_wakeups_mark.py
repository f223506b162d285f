"""core.wakeups.mark: a waiting request skips its second check only when the process's listener was already
listening to the topic and received nothing between the mark and the subscription (PostgreSQL)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from django.db import connection

from core import wakeups

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TOPIC = "mark_test"


def _notify(key: str) -> None:
    """A NOTIFY from another connection, as another process's committed change would send it."""
    params = wakeups._listen_params()
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", [wakeups._channel(TOPIC), key])


async def _until(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_the_first_subscription_of_a_process_rechecks_then_a_quiet_one_does_not() -> None:
    async def scenario() -> tuple[bool, bool]:
        first_mark = wakeups.mark()  # nothing listens to the topic yet
        async with wakeups.subscribe(topic=TOPIC, keys=["7:1"]) as sub:
            first = sub.missed_since(first_mark)
        quiet_mark = wakeups.mark()
        async with wakeups.subscribe(topic=TOPIC, keys=["7:1"]) as sub:
            quiet = sub.missed_since(quiet_mark)
        return first, quiet

    assert connection.vendor == "postgresql"
    assert asyncio.run(scenario()) == (True, False)


def test_a_notification_between_the_mark_and_the_subscription_forces_the_recheck() -> None:
    async def scenario() -> tuple[bool, bool]:
        async with wakeups.subscribe(topic=TOPIC, keys=["9:9"]):
            pass  # the listener now listens to the topic
        marked = wakeups.mark()
        before = wakeups._hub().epoch
        await asyncio.to_thread(_notify, "3:4")  # any key: a notification is only a hint
        await _until(lambda: wakeups._hub().epoch > before)
        async with wakeups.subscribe(topic=TOPIC, keys=["7:1"]) as sub:
            missed = sub.missed_since(marked)
        # Woken after the subscription: the wait itself reports it.
        async with wakeups.subscribe(topic=TOPIC, keys=["7:1"]) as sub:
            await asyncio.to_thread(_notify, "7:1")
            woke = await sub.wait(5.0)
        return missed, woke

    assert asyncio.run(scenario()) == (True, True)


def test_a_lost_listener_forces_the_recheck() -> None:
    async def scenario() -> bool:
        async with wakeups.subscribe(topic=TOPIC, keys=["1"]):
            pass
        hub = wakeups._hub()
        marked = wakeups.mark()
        assert hub.listener is not None
        hub.listener.cancel()  # the listener goes away (its connection lost, say) and is restarted
        await _until(lambda: hub.listener is not None and hub.listener.done())
        async with wakeups.subscribe(topic=TOPIC, keys=["1"]) as sub:
            return sub.missed_since(marked)

    assert asyncio.run(scenario()) is True
