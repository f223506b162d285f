"""The embedded Celery transport: kombu's file-per-message transport with atomic writes.

`make run` needs a broker that is not a server, and kombu's ``filesystem://`` transport is one: a message is
a file in a folder, a consumer takes it by moving it away. But kombu creates the file under its final name
and only then locks and writes it, so a consumer listing the folder can take a file that is still empty or
half written and die on it (``CRITICAL Unrecoverable error: JSONDecodeError``; seen in 2 of 4 starts of the
embedded stack on a loaded machine). Here a producer writes the whole message under a hidden temporary name
in the same folder, flushes it to disk and then renames it into place: ``os.replace`` is atomic on POSIX, so
a consumer sees either no file or the whole message, never part of one. A temporary name never matches the
``<stamp>_<uuid>.<queue>.msg`` pattern consumers look for; one left by a producer killed mid-write is
ignored, and removed once it is an hour old.

The exchange tables (which queues a fanout or direct exchange reaches, one ``<exchange>.exchange`` file in the
control folder) had the same fault: kombu checks that the file exists, then creates it with a truncating
open and locks it only afterwards, so a second process binding at the same moment could lock the new, still
empty file first and die on it (``JSONDecodeError`` in ``_queue_bind``; seen when four producers started at
once). Here a binder takes an exclusive lock on a separate ``.lock`` file, reads the table, and writes a
changed table under a temporary name renamed into place; a reader reads without a lock and sees the old table
or the new one, never part of one.

Selected by settings (``CELERY_BROKER_TRANSPORT``) whenever the broker URL is ``filesystem://``.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

from kombu.transport import filesystem
from kombu.utils.json import dumps, loads

TEMP_PREFIX = ".part-"
STALE_TEMP_SECONDS = 3600


def transport_options(folder: Path, *, polling_interval: float = 0.1) -> dict[str, object]:
    """The transport options (``CELERY_BROKER_TRANSPORT_OPTIONS``) of a queue kept in ``folder``, whose
    ``out/``, ``processed/`` and ``control/`` are made here if missing. Processed messages are not kept."""
    for sub in ("out", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folder / "out"),
        "data_folder_out": str(folder / "out"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
        "polling_interval": polling_interval,
    }


class Channel(filesystem.Channel):
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put ``payload`` on ``queue``: written whole under a temporary name, then renamed into place."""
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        temporary = os.path.join(self.data_folder_out, f"{TEMP_PREFIX}{name}")
        try:
            with open(temporary, "wb") as f:
                f.write(dumps(payload).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc

    def get_table(self, exchange: Any) -> list[Any]:
        """The queues bound to ``exchange``: the table as last renamed into place, or none."""
        file = self._exchange_file(exchange)
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot open {file}") from exc
        return [filesystem.exchange_queue_t(*q) for q in loads(data.decode())] if data else []

    def _queue_bind(self, exchange: Any, routing_key: Any, pattern: Any, queue: Any) -> None:
        """Add ``queue`` to ``exchange``'s table, once, under the table's lock; the table is replaced whole."""
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            with open(f"{file}.lock", "a+b") as lock_file:
                filesystem.lock(lock_file, filesystem.LOCK_EX)
                try:
                    queues = self.get_table(exchange)
                    if binding in queues:
                        return
                    queues.insert(0, binding)
                    temporary = file.with_name(f"{TEMP_PREFIX}{uuid.uuid4()}-{file.name}")
                    try:
                        with open(temporary, "wb") as f:
                            f.write(dumps(queues).encode())
                            f.flush()
                            os.fsync(f.fileno())
                        os.replace(temporary, file)
                    finally:
                        with contextlib.suppress(OSError):
                            os.unlink(temporary)
                finally:
                    filesystem.unlock(lock_file)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot open {file}") from exc

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        self._sweep_stale_temporaries()
        return super()._get(queue)

    _last_sweep = 0.0

    def _sweep_stale_temporaries(self) -> None:
        now = time.time()
        if now - self._last_sweep < 60:
            return
        self._last_sweep = now
        try:
            names = [n for n in os.listdir(self.data_folder_in) if n.startswith(TEMP_PREFIX)]
        except OSError:
            return
        for name in names:
            path = os.path.join(self.data_folder_in, name)
            try:
                if now - os.stat(path).st_mtime > STALE_TEMP_SECONDS:
                    os.unlink(path)
            except OSError:
                continue


class Transport(filesystem.Transport):
    Channel = Channel
