"""core.allocator: the production processes' malloc thresholds (the pages of a request's big arrays stay
mapped from one request to the next)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core.allocator import malloc_tune

ROOT = Path(__file__).resolve().parents[2]

# In a fresh process: allocate, write and free a 4 MiB block twice, and print the page faults of the second
# time. glibc's defaults serve the first from a fresh mmap (given back when freed, which raises the mmap
# threshold) and the second from newly grown heap: faulted in again. Tuned, both come from the heap and the
# second reuses the first one's pages.
_PROBE = textwrap.dedent(
    """
    import ctypes, resource, sys
    from core.allocator import malloc_tune

    applied = malloc_tune() if sys.argv[1] == "tune" else None
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 4 << 20

    def faults() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        libc.free(block)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    faults()
    print(applied, faults())
    """
)


def _glibc() -> bool:
    try:
        ctypes.CDLL(None).gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError):
        return False
    return sys.platform.startswith("linux")


def _probe(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k not in {"GLIBC_TUNABLES", "CARDHOUR_MALLOC_TUNING"}}
    environ.update(env)
    out = subprocess.run(  # noqa: S603  # this interpreter on a fixed probe
        [sys.executable, "-c", _PROBE, mode],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not _glibc(), reason="glibc's mallopt")
def test_a_freed_block_is_reused_without_faulting_its_pages_in_again() -> None:
    applied, tuned = _probe("tune")
    _, untuned = _probe("leave")
    assert applied == "True"
    pages = (4 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert untuned >= pages // 2  # glibc's defaults: the block's pages faulted in again
    assert tuned < 16


@pytest.mark.skipif(not _glibc(), reason="glibc's mallopt")
def test_the_operator_can_turn_it_off_or_choose_the_tunables() -> None:
    assert _probe("tune", CARDHOUR_MALLOC_TUNING="0")[0] == "False"
    assert _probe("tune", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1048576")[0] == "False"
    assert malloc_tune(environ={"CARDHOUR_MALLOC_TUNING": "off"}) is False
    assert malloc_tune(environ={"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}) is False


@pytest.mark.skipif(not _glibc(), reason="glibc's mallopt")
def test_a_threshold_that_is_no_c_int_is_refused() -> None:
    with pytest.raises(ValueError, match="C int"):
        malloc_tune(mmap_threshold=1 << 40, environ={})
    with pytest.raises(ValueError, match="C int"):
        malloc_tune(trim_threshold=-1, environ={})
