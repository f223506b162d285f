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

**By load, when the server is busy.** Equal counts are not equal work: in the design-load soak (issue 14)
each worker held ~22 connections, eight heartbeat agents' and a few usage reporters' (a request every second
or so each) and the four quote clients' (dozens a second each) — and all four quote clients sat on one
worker, which used 94 % of a core while the other used 7 %, so the quotes ran on one core of two. So each
worker also measures every live worker's CPU (``/proc/<pid>/stat``, at most once per ``LOAD_WINDOW_SECONDS``)
and, once any worker is busy (``LOAD_BUSY`` of a core), balances by that instead of by counts: a worker
using ``LOAD_MARGIN`` of a core more than the least loaded other (and ``LOAD_RATIO`` times as much) moves
the connection it is answering — most likely a busy one, since busy connections send most of the
requests — at most once per ``LOAD_MOVE_INTERVAL_SECONDS``, long enough for the loads to be measured
again after the move. Balanced loads move nothing, whatever the counts (moving by count then would undo a
load move: the connection a busy worker answers is usually a busy one). Where ``/proc`` cannot be read,
counts alone decide, as before.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import time
from typing import Any

TOLERANCE = 1
PAUSE_SECONDS = 0.003
MOVE_INTERVAL_SECONDS = 0.1
LOAD_WINDOW_SECONDS = 1.0  # the loads are CPU over at least this long
LOAD_BUSY = 0.25  # of a core: below this on every worker, counts decide
LOAD_MARGIN = 0.3  # of a core: the least a worker must use above the least loaded other to move by load
LOAD_RATIO = 1.5
LOAD_MOVE_INTERVAL_SECONDS = 2.5  # > two windows: the loads after a move are measured before the next

_SLOTS = 64  # more workers than this are not balanced (each past it has no slot)

_open = multiprocessing.RawArray(ctypes.c_int, _SLOTS)  # open connections per slot
_live = multiprocessing.RawArray(ctypes.c_byte, _SLOTS)  # 1: a live worker holds the slot
_pid = multiprocessing.RawArray(ctypes.c_int, _SLOTS)  # the process holding the slot (set by the worker)

_slot = -1  # this worker's slot; -1 in the master and outside gunicorn
_moved_at = -MOVE_INTERVAL_SECONDS  # monotonic time of this worker's last move
_load_moved_at = -LOAD_MOVE_INTERVAL_SECONDS  # and of its last move by load
_busy_at = -LOAD_MOVE_INTERVAL_SECONDS  # when this worker last measured a busy server
# This worker's view of the loads: the last CPU reading of each worker (pid → (monotonic, CPU seconds)) and
# the loads (slot → cores) measured between the last two readings, at most once per window.
_readings: dict[int, tuple[float, float]] = {}
_loads: dict[int, float] = {}
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def assign(worker: Any) -> None:
    """In the master, before ``worker`` forks (gunicorn's ``pre_fork``): give it a free slot."""
    worker.balance_slot = -1
    for slot in range(_SLOTS):
        if not _live[slot]:
            _open[slot] = 0
            _pid[slot] = 0
            _live[slot] = 1
            worker.balance_slot = slot
            return


def release(worker: Any) -> None:
    """In the master, when ``worker`` has exited (gunicorn's ``child_exit``): free its slot."""
    slot = getattr(worker, "balance_slot", -1)
    if slot >= 0:
        _live[slot] = 0
        _open[slot] = 0
        _pid[slot] = 0


def adopt(worker: Any) -> None:
    """In the worker, after the fork (gunicorn's ``post_fork``): count in the slot the master gave it."""
    global _slot
    _slot = getattr(worker, "balance_slot", -1)
    if _slot >= 0:
        _pid[_slot] = os.getpid()


def opened() -> None:
    if _slot >= 0:
        _open[_slot] += 1


def closed() -> None:
    if _slot >= 0:
        _open[_slot] -= 1


def over_share() -> bool:
    """Whether this worker should move a connection now. When some worker is busy (see the module
    docstring): this worker uses ``LOAD_MARGIN`` of a core more than the least loaded other live worker, and
    ``LOAD_RATIO`` times as much, and has moved none by load in the last ``LOAD_MOVE_INTERVAL_SECONDS``.
    Otherwise: it holds more than ``TOLERANCE`` (or an eighth) connections above the least loaded other live
    worker, and has moved none in the last ``MOVE_INTERVAL_SECONDS``. Either way it holds two connections at
    least (moving its only one moves its load whole). True counts as a move."""
    global _moved_at, _load_moved_at, _busy_at
    if _slot < 0:
        return False
    mine = _open[_slot]
    if mine < 2:
        return False
    live = _live[:]
    other_slots = [slot for slot in range(_SLOTS) if live[slot] and slot != _slot]
    if not other_slots:
        return False
    now = time.monotonic()
    loads = _loads_measure(now, [_slot, *other_slots])
    if loads is not None and max(loads.values()) >= LOAD_BUSY:
        _busy_at = now
        mine_load = loads[_slot]
        least_load = min(loads[slot] for slot in other_slots)
        if (
            mine_load - least_load < LOAD_MARGIN
            or mine_load < LOAD_RATIO * least_load
            or now - _load_moved_at < LOAD_MOVE_INTERVAL_SECONDS
        ):
            return False
        _moved_at = _load_moved_at = now
        _readings.clear()  # the next loads are measured after the move only
        _loads.clear()
        return True
    if now - _busy_at < LOAD_MOVE_INTERVAL_SECONDS:
        return False  # busy a moment ago (or measuring again after a move by load): loads decide
    counts = _open[:]
    least = min(counts[slot] for slot in other_slots)
    if mine <= least + max(TOLERANCE, least // 8):
        return False
    if now - _moved_at < MOVE_INTERVAL_SECONDS:
        return False
    _moved_at = now
    return True


def _loads_measure(now: float, slots: list[int]) -> dict[int, float] | None:
    """The CPU (in cores) of the workers in ``slots`` over the last window, read again once a window has
    passed since the last reading; None until one window has been measured for each of them, or when a
    worker's CPU cannot be read."""
    pids = {slot: _pid[slot] for slot in slots}
    last = _readings.get(pids[_slot])
    if last is None or now - last[0] >= LOAD_WINDOW_SECONDS:
        for slot, pid in pids.items():
            seconds = _cpu_seconds(pid)
            if seconds is None:
                _readings.clear()
                _loads.clear()
                return None
            before = _readings.get(pid)
            _readings[pid] = (now, seconds)
            if before is not None and now > before[0]:
                _loads[slot] = (seconds - before[1]) / (now - before[0])
            else:
                _loads.pop(slot, None)
    if any(slot not in _loads for slot in slots):
        return None
    return {slot: _loads[slot] for slot in slots}


def _cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system, all threads) process ``pid`` has used, or None when it cannot be
    read (no such process, no ``/proc``)."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command's closing parenthesis: state is field 3, utime 14 and stime 15 (proc(5)).
    return (int(fields[11]) + int(fields[12])) / _TICK


def pause() -> None:
    """Called on the event loop once the moved connection's response is written: hold the loop still for
    a moment so that another worker accepts the client's new connection."""
    time.sleep(PAUSE_SECONDS)
