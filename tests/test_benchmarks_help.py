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


def test_a_benchmark_refuses_a_port_another_server_listens_on() -> None:
    """A server left by an earlier run would answer in the new one's place (benchmarks.prodserver): the new
    run stops at once, naming the port, without starting its own."""
    import socket

    from benchmarks.prodserver import production_env, production_server

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        env = production_env(database_url="postgres://nobody@127.0.0.1:1/none", port=port)
        with pytest.raises(RuntimeError, match=f"port {port} is in use"), production_server(env):
            raise AssertionError("a server was started")
