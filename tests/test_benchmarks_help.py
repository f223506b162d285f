"""Every benchmark answers ``--help``: argparse formats help lazily, so a bad help string (a bare ``%``)
only breaks when someone asks for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(
    path.stem
    for path in (ROOT / "benchmarks").glob("*.py")
    if not path.stem.startswith("_") and "__main__" in path.read_text()
)


def test_the_benchmarks_are_found() -> None:
    assert {"broker", "metering", "soak", "federation"} <= set(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_help(name: str) -> None:
    done = subprocess.run(  # noqa: S603  # our own interpreter and a module found in benchmarks/
        [sys.executable, "-m", f"benchmarks.{name}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
