"""Start the production server exactly as the README runs it (gunicorn -c config/gunicorn.conf.py
config.asgi:application, production settings from environment variables) on a free loopback port."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The production server's default number of workers (config/gunicorn.conf.py, WEB_CONCURRENCY unset).
PRODUCTION_WORKERS = (os.cpu_count() or 1) + 1
GUNICORN = Path(sys.executable).with_name("gunicorn")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def production_env(*, database_url: str, port: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a production server process: every required variable set, nothing from
    development (the variables of the README's production table)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CARDHOUR_", "DATABASE_"))}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.production",
            "DJANGO_SECRET_KEY": "server-test-" + "k" * 60,
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DJANGO_SECURE_SSL_REDIRECT": "false",
            "DATABASE_URL": database_url,
            "CELERY_BROKER_URL": os.environ.get("CELERY_BROKER_URL", "memory://"),
            "CACHE_URL": "locmemcache://server-test",
            "STRIPE_SECRET_KEY": "sk_test_server",
            "STRIPE_PUBLISHABLE_KEY": "pk_test_server",
            "STRIPE_WEBHOOK_SECRET": "whsec_server_test",
            "GUNICORN_BIND": f"127.0.0.1:{port}",
            "GUNICORN_ACCESSLOG": "",
            "GUNICORN_LOGLEVEL": "warning",
            "WEB_CONCURRENCY": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
            sent = {"Host": "127.0.0.1", **({"Content-Type": "application/json"} if body is not None else {})}
            conn.request(method, path, body=data, headers={**sent, **(headers or {})})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()


def _port_free_or_fail(port: int) -> None:
    """Refuse a port something already listens on. A server left running by an earlier run (its benchmark
    killed before it could stop it: the server runs in a session of its own) would answer the readiness check
    and every request, while the new one failed to bind and exited: the run would measure the old code and
    report no server CPU at all."""
    with socket.socket() as sock:
        # As gunicorn binds: the connections of a server that has stopped (TIME_WAIT) do not hold the port,
        # a socket listening on it does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise RuntimeError(
                f"port {port} is in use (a production server left by an earlier run? `ss -ltnp` names it): {exc}"
            ) from exc


@contextlib.contextmanager
def production_server(
    env: Mapping[str, str], *, ready_path: str = "/healthz", root: Path = ROOT
) -> Iterator[Server]:
    """The production server of the checkout at ``root`` (this one by default; another worktree's, to compare
    two versions of the code on the same database)."""
    port = int(env["GUNICORN_BIND"].rsplit(":", 1)[1])
    _port_free_or_fail(port)
    # A file, not a pipe, never fills; closed in finally. CARDHOUR_BENCH_SERVER_LOG keeps it (a path).
    kept = env.get("CARDHOUR_BENCH_SERVER_LOG")
    log = open(kept, "w+b") if kept else tempfile.TemporaryFile()  # noqa: SIM115
    process = subprocess.Popen(
        [str(GUNICORN), "-c", "config/gunicorn.conf.py", "config.asgi:application"],
        cwd=root,
        env={**env, "PYTHONPATH": str(root)} if root != ROOT else dict(env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = Server(port=port, process=process)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                log.seek(0)
                output = log.read().decode(errors="replace")
                raise RuntimeError(f"the production server exited with {process.returncode}:\n{output}")
            with contextlib.suppress(OSError):
                if server.request("GET", ready_path, timeout=5)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the production server did not answer within 60 s")
            time.sleep(0.2)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()


@dataclass
class _Pid:
    pid: int


class ProductionServers:
    """The production server for a benchmark, with the interface of benchmarks._common.WsgiServers
    (``host``, ``ports``, ``processes``, ``peak_rss_mb``, ``stop``): gunicorn as the README runs it, with
    ``workers`` uvicorn workers behind one port, production settings from the environment, rate limits
    lifted (a benchmark's clients are not the callers the limits are for) and no worker recycling
    (``GUNICORN_MAX_REQUESTS=0``: a recycled worker's CPU would leave the count)."""

    DESCRIPTION = (
        "the production server (gunicorn -c config/gunicorn.conf.py config.asgi:application, {workers} uvicorn "
        "worker(s), production settings from the environment)"
    )

    def __init__(
        self,
        *,
        workers: int,
        database_url: str,
        extra: Mapping[str, str] | None = None,
        port: int | None = None,
        root: Path = ROOT,
    ) -> None:
        self.host = "127.0.0.1"
        # CARDHOUR_BENCH_PORT pins the port (a shared machine where each user keeps to a range of ports).
        port = port or int(os.environ.get("CARDHOUR_BENCH_PORT") or 0) or free_port()
        self.ports = [port]
        self.env = production_env(
            database_url=database_url,
            port=port,
            extra={
                "WEB_CONCURRENCY": str(workers),
                "CACHE_URL": os.environ.get("CARDHOUR_BENCH_CACHE_URL", "redis://127.0.0.1:6379/10"),
                "API_THROTTLE_CREDENTIAL": "100000000/min",
                "API_THROTTLE_HEARTBEAT": "100000000/min",
                "API_THROTTLE_USAGE": "100000000/min",
                "GUNICORN_MAX_REQUESTS": "0",
                **(extra or {}),
            },
        )
        self._context = production_server(self.env, root=root)
        self.server = self._context.__enter__()
        self.peak_rss_mb: list[float] = []
        self.log_path = Path("(the production server's log is printed when it fails to start)")

    @property
    def processes(self) -> list[_Pid]:
        """The gunicorn master and its workers."""
        children = subprocess.run(
            ["pgrep", "-P", str(self.server.process.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [_Pid(self.server.process.pid), *(_Pid(int(pid)) for pid in children)]

    def stop(self, *, keep_log: bool = False) -> None:
        from benchmarks._common import process_peak_rss_mb

        self.peak_rss_mb = [
            mb for mb in (process_peak_rss_mb(p.pid) for p in self.processes) if mb == mb
        ]  # not NaN
        self._context.__exit__(None, None, None)
