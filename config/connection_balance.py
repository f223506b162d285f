"""Keep-alive connections spread over the production server's worker processes.

gunicorn's workers share one listening socket and each accepts what it can, so a few clients that keep
their connections open (an SDK's pool, operators' agents, a benchmark's four clients) stay wherever the
accept race put them: of four connections opened at once to two workers, 2 : 2 came out 11 times in 30,
3 : 1 13 times and 4 : 0 6 times (a binomial draw). A worker runs its requests under one interpreter lock,
so with 3 : 1 or 4 : 0 one core works while the other idles: the quote benchmark measured 130 quotes/s on
a 3 : 1 draw where 2 : 2 gave 213–218, and a soak's four quote clients once all sat on one of two workers.

Where the connections land cannot be chosen from here, but a connection can be moved: a worker holding
more than its share answers its next response with ``Connection: close`` (every HTTP/1.1 client then
opens a new connection for its next request, transparently). The client reconnects at once, and the
worker that has just written the response, awake on its CPU, would win the accept race again (seen:
nine moves in a row back to the same worker); so after the response is written that worker's event loop
pauses for ``PAUSE_SECONDS`` (its request threads go on) and the other workers, waiting for
connections, take the new one. Its share: at most ``TOLERANCE`` connections (or an eighth, with many)
above the least loaded other worker, which keeps 2 : 1 (three connections on two workers) from flapping;
and at most one move per ``MOVE_INTERVAL_SECONDS`` per worker, which bounds the pauses to a few percent
of a worker's event loop however the connections come and go. A balanced server closes nothing.

Each worker counts its open connections in a slot of an array shared by the gunicorn master and its
workers (allocated here, in the master, before any fork; a slot is given to a worker by the master before
it forks and taken back when it exits). Only the worker writes its own slot; the others read it, and a
stale read at worst moves one connection too many or too few. Outside gunicorn (no slot), nothing is
counted or closed.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import time
from typing import Any

TOLERANCE = 1
PAUSE_SECONDS = 0.003
MOVE_INTERVAL_SECONDS = 0.1

_SLOTS = 64  # more workers than this are not balanced (each past it has no slot)

_open = multiprocessing.RawArray(ctypes.c_int, _SLOTS)  # open connections per slot
_live = multiprocessing.RawArray(ctypes.c_byte, _SLOTS)  # 1: a live worker holds the slot

_slot = -1  # this worker's slot; -1 in the master and outside gunicorn
_moved_at = -MOVE_INTERVAL_SECONDS  # monotonic time of this worker's last move


def assign(worker: Any) -> None:
    """In the master, before ``worker`` forks (gunicorn's ``pre_fork``): give it a free slot."""
    worker.balance_slot = -1
    for slot in range(_SLOTS):
        if not _live[slot]:
            _open[slot] = 0
            _live[slot] = 1
            worker.balance_slot = slot
            return


def release(worker: Any) -> None:
    """In the master, when ``worker`` has exited (gunicorn's ``child_exit``): free its slot."""
    slot = getattr(worker, "balance_slot", -1)
    if slot >= 0:
        _live[slot] = 0
        _open[slot] = 0


def adopt(worker: Any) -> None:
    """In the worker, after the fork (gunicorn's ``post_fork``): count in the slot the master gave it."""
    global _slot
    _slot = getattr(worker, "balance_slot", -1)


def opened() -> None:
    if _slot >= 0:
        _open[_slot] += 1


def closed() -> None:
    if _slot >= 0:
        _open[_slot] -= 1


def over_share() -> bool:
    """Whether this worker should move a connection now: it holds more than ``TOLERANCE`` (or an eighth)
    above the least loaded other live worker, and has moved none in the last ``MOVE_INTERVAL_SECONDS``.
    True counts as a move."""
    global _moved_at
    if _slot < 0:
        return False
    mine = _open[_slot]
    if mine < 2:
        return False
    live = _live[:]
    others = [count for slot, count in enumerate(_open[:]) if live[slot] and slot != _slot]
    if not others:
        return False
    least = min(others)
    if mine <= least + max(TOLERANCE, least // 8):
        return False
    now = time.monotonic()
    if now - _moved_at < MOVE_INTERVAL_SECONDS:
        return False
    _moved_at = now
    return True


def pause() -> None:
    """Called on the event loop once the moved connection's response is written: hold the loop still for
    a moment so that another worker accepts the client's new connection."""
    time.sleep(PAUSE_SECONDS)
