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

Selected by settings (``CELERY_BROKER_TRANSPORT``) whenever the broker URL is ``filesystem://``.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from typing import Any

from kombu.transport import filesystem
from kombu.utils.json import dumps

TEMP_PREFIX = ".part-"
STALE_TEMP_SECONDS = 3600


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
