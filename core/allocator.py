"""The C allocator's thresholds for the long-lived server and worker processes (glibc's ``mallopt``).

A quote allocates a few megabytes of short-lived numpy arrays (the holds in its window, the matcher's
selections and ranges: tens of thousands of rows each). glibc serves an allocation above its mmap threshold
(128 KiB at start, raised to the largest block freed so far) with a fresh ``mmap`` and gives it back with
``munmap`` when it is freed, and it returns free memory at the top of a heap to the kernel once it passes
the trim threshold. Either way the next quote's arrays land on pages the kernel must fault in and zero
again: at design load ~280 page faults per quote, ~0.5 ms of system CPU of a ~5.5 ms quote (measured in one
process on the soak's market, ``resource.getrusage`` around 1,000 quotes).

``malloc_tune`` fixes the mmap threshold at 32 MiB (the largest mallopt(3) documents on 64-bit) and the
trim threshold at 128 MiB, so that those arrays come from the heap (a request thread's arena) and their
pages stay mapped from one request to the next: ~1 page fault per quote, and the system CPU per quote
falls to ~0.2 ms. The cost is memory: each arena keeps up to the trim threshold of free memory at its top
instead of returning it (in practice what its busiest requests used at once): in the design-load soak a
web worker of 8 request threads held 432–455 MB against 359–374 MB untuned (~70 MB more each, the
catalogue and hold book being most of the rest); Celery's processes held the same.

Called by the production web server's master before it forks its workers (config/gunicorn.conf.py) and by
Celery's processes (config/celery_app.py); the settings are inherited across ``fork``. It changes nothing
when ``CARDHOUR_MALLOC_TUNING`` is ``0``, when ``GLIBC_TUNABLES`` already sets a ``glibc.malloc`` tunable
(the operator's choice stands), and on a C library without glibc's ``mallopt``; it reports whether it
applied.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 * 1024 * 1024  # the largest mallopt(3) documents on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 128 * 1024 * 1024


def malloc_tune(
    *,
    mmap_threshold: int = MMAP_THRESHOLD,
    trim_threshold: int = TRIM_THRESHOLD,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Set glibc's mmap and trim thresholds for this process (and the processes it forks from now on);
    True when both were applied."""
    env = os.environ if environ is None else environ
    if env.get("CARDHOUR_MALLOC_TUNING", "1").strip().lower() in {"0", "false", "no", "off"}:
        return False
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  # glibc only: musl's mallopt accepts nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    for value in (mmap_threshold, trim_threshold):
        if not 0 <= value < 2**31:  # mallopt takes a C int
            raise ValueError(f"a malloc threshold must be a C int's non-negative value, not {value}")
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 when it took the value, 0 when it refused it
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
