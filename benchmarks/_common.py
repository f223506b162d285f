"""What every benchmark needs: a throwaway PostgreSQL database, Django configured against it, the
project's WSGI application behind real HTTP servers, closed-loop HTTP clients, percentiles, a timer,
result tables and peak memory.

Nothing in the application imports this module. ``python -m benchmarks._common serve HOST PORT`` is the
entry point of one server process (see WsgiServers).
"""

from __future__ import annotations

import http.client
import math
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER_URL = "postgres://postgres@127.0.0.1:5432/postgres"
DEFAULT_BENCH_DATABASE = "cardhour_bench"
SETTINGS_MODULE = "config.settings.test"


# --- Database ---------------------------------------------------------------------------------------


def database_url_with_name(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@dataclass
class BenchDatabase:
    """A PostgreSQL database for one benchmark run: created fresh (and dropped by ``drop``), or one the
    caller passed in, which is used as it is and never dropped."""

    url: str
    owned: bool

    @classmethod
    def create(
        cls, *, server_url: str = DEFAULT_SERVER_URL, name: str = DEFAULT_BENCH_DATABASE
    ) -> BenchDatabase:
        import psycopg
        from psycopg import sql

        # A database left by an earlier run with --keep (or a crash) carries the same throwaway name.
        with psycopg.connect(database_url_with_name(server_url, "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return cls(url=database_url_with_name(server_url, name), owned=True)

    @classmethod
    def existing(cls, url: str) -> BenchDatabase:
        return cls(url=url, owned=False)

    @property
    def name(self) -> str:
        return urlsplit(self.url).path.lstrip("/")

    def drop(self) -> None:
        if not self.owned:
            return
        import psycopg
        from psycopg import sql

        close_django_connections()
        with psycopg.connect(database_url_with_name(self.url, "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))

    def server_version(self) -> str:
        import psycopg

        with psycopg.connect(self.url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"


def run_on_database(database: BenchDatabase, run: Callable[[BenchDatabase], list[str]], *, keep: bool) -> int:
    """Run a benchmark on ``database``, drop it afterwards unless ``keep`` or it was given, print the first
    errors; the exit status (1 on any error)."""
    try:
        errors = run(database)
    finally:
        if keep or not database.owned:
            print(f"\ndatabase kept: {database.url}")
        else:
            database.drop()
    if errors:
        print(f"\nFAILED: {len(errors)} error(s); first ones:")
        for message in errors[:10]:
            print(f"  {message}")
        return 1
    return 0


def django_environment(*, database_url: str, conn_max_age: int) -> dict[str, str]:
    """The environment a benchmark's Django (in this process and in its servers) runs with."""
    return {
        "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
        "DATABASE_URL": database_url,
        "DATABASE_CONN_MAX_AGE": str(conn_max_age),
        # Django's server logs every request at INFO; warnings (4xx) and errors still show.
        "DJANGO_LOG_LEVEL": "WARNING",
    }


def django_setup(*, database_url: str, conn_max_age: int, migrate: bool = True) -> None:
    """Configure Django in this process against ``database_url`` (before anything imports settings)."""
    os.environ.update(django_environment(database_url=database_url, conn_max_age=conn_max_age))
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)


def django_setup_production(*, database_url: str) -> None:
    """Configure Django in this process as the benchmarks' production servers run (benchmarks.prodserver's
    environment, production settings), with connections kept: a profile of the path they serve."""
    import tempfile

    from benchmarks.prodserver import production_env

    os.environ.update(production_env(database_url=database_url, port=0))
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="cardhour-metrics-"))
    os.environ["DATABASE_CONN_MAX_AGE"] = "600"
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    import django

    django.setup()


def close_django_connections() -> None:
    if "django.db" in sys.modules:
        from django.db import connections

        connections.close_all()


# --- Measuring -------------------------------------------------------------------------------------


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds`` (perf_counter)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Timer:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.started


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); ``sorted_values`` must be sorted."""
    if not sorted_values:
        return math.nan
    rank = (len(sorted_values) - 1) * pct / 100
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


@dataclass(frozen=True)
class Summary:
    """Latency summary in seconds."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        ordered = sorted(values)
        if not ordered:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(
            n=len(ordered),
            mean=sum(ordered) / len(ordered),
            p50=percentile(ordered, 50),
            p90=percentile(ordered, 90),
            p99=percentile(ordered, 99),
            max=ordered[-1],
        )

    def ms_cells(self) -> list[str]:
        return [str(self.n), *(ms(v) for v in (self.p50, self.p90, self.p99, self.max, self.mean))]


SUMMARY_MS_HEADERS = ["n", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms"]


def ms(seconds: float, digits: int = 2) -> str:
    return "—" if math.isnan(seconds) else f"{seconds * 1000:.{digits}f}"


def spread(values: Sequence[float]) -> str:
    """min / median / max of repeated figures, e.g. per-round p99s."""
    if not values:
        return "—"
    ordered = sorted(values)
    return f"{ordered[0]:.2f} / {percentile(ordered, 50):.2f} / {ordered[-1]:.2f}"


def peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def process_peak_rss_mb(pid: int) -> float:
    """Peak resident memory (VmHWM) of a live process, or NaN when /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (from /proc), or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def postgres_backend_pids(database: str) -> list[int]:
    """PIDs of PostgreSQL backends connected to ``database`` on this machine, found by their process
    title (``postgres: <cluster>: <user> <database> <host>(<port>) <state>``), so no query is needed."""
    pids = []
    marker = f" {database} "
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            title = (
                Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except OSError:
            continue
        if title.startswith("postgres: ") and marker in title:
            pids.append(int(entry.name))
    return pids


class CpuSampler:
    """CPU seconds spent during a ``with`` block by the server processes, by the PostgreSQL backends of
    one database, and by this process.

    Wall-clock latency on a shared, busy machine mostly measures the run queue; CPU per request is the
    figure that stays put. Backends come and go (CONN_MAX_AGE), so a thread reads the known processes'
    CPU every ``interval_s`` (a backend that exits loses at most that much of its CPU time from the
    count) and looks for new backends every ``discover_s``: scanning /proc holds this process's GIL for
    a millisecond or two, which would otherwise show in the latencies its client threads measure.

    ``server_pids`` may be a function giving the server's processes now (a server that replaces its
    workers: ``GUNICORN_MAX_REQUESTS``); it is asked again every ``discover_s``, and a process that appears
    during the block counts from zero (its start-up is work the replacement cost). A process that exits
    loses at most ``interval_s`` of its CPU time from the count, as a backend does.
    """

    def __init__(
        self,
        *,
        server_pids: Sequence[int] | Callable[[], Sequence[int]] = (),
        database: str | None = None,
        interval_s: float = 0.5,
        discover_s: float = 2.0,
    ):
        self._servers = server_pids if callable(server_pids) else None
        self.server_pids = list(server_pids()) if callable(server_pids) else list(server_pids)
        self.database = database
        self.interval_s = interval_s
        self.discover_s = discover_s
        self._backends: list[int] = []
        self._discovered_at = -math.inf
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._group: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._own_start = 0.0
        self.own_seconds = 0.0

    def _sample(self, *, initial: bool = False, discover: bool = False) -> None:
        now = time.monotonic()
        if discover or now - self._discovered_at >= self.discover_s:
            if self.database:
                self._backends = postgres_backend_pids(self.database)
            if self._servers is not None:
                self.server_pids = list(self._servers())
            self._discovered_at = now
        pids = [(pid, "server") for pid in self.server_pids] + [(pid, "postgres") for pid in self._backends]
        for pid, group in pids:
            cpu = process_cpu_seconds(pid)
            if cpu is None:
                continue
            if pid not in self._first:
                # A backend that appears during the block counts from zero (its start-up is real work).
                self._first[pid] = cpu if initial or (group == "server" and self._servers is None) else 0.0
                self._group[pid] = group
            self._last[pid] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> CpuSampler:
        self._sample(initial=True, discover=True)
        self._own_start = time.process_time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.own_seconds = time.process_time() - self._own_start
        self._stop.set()
        self._thread.join()
        self._sample(discover=True)

    def seconds(self, group: str) -> float:
        return sum(self._last[pid] - self._first[pid] for pid, g in self._group.items() if g == group)


def machine_description() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} CPUs, load average {load}; Python {platform.python_version()} "
        f"on {platform.system()} {platform.release()}"
    )


def print_table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[object]], *, left_columns: int = 1
) -> None:
    """A plain-text table; the first ``left_columns`` columns are left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(widths[i]) if i < left_columns else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()

    print(f"\n{title}")
    print(line(cells[0]))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print(line(row))


# --- HTTP servers and clients ---------------------------------------------------------------------------


def env_pair(text: str) -> tuple[str, str]:
    """An argparse type: ``NAME=VALUE`` as (name, value)."""
    import argparse

    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def add_server_env_argument(parser: Any) -> None:
    """``--server-env NAME=VALUE`` (repeatable): variables for a benchmark's production server
    (``args.server_env``, a list of pairs)."""
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        type=env_pair,
        metavar="NAME=VALUE",
        help="an environment variable for the web server (repeatable), e.g. GUNICORN_MAX_REQUESTS=20000 to "
        "recycle workers as production does (the benchmark's servers recycle none by default; the CPU counts "
        "follow the replaced workers but for each one's last half-second) or CARDHOUR_PRELOAD_MARKET=0",
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class WsgiServers:
    """``workers`` processes, each serving config.wsgi.application with Django's own WSGI server (the
    one behind ``runserver``: threaded, HTTP/1.1 keep-alive) on a port of its own. Clients spread over
    the ports round-robin, as a load balancer in front of web workers would.

    gunicorn is not a project dependency; Django's server parses HTTP in pure Python, so its cost per
    request is close to gunicorn's sync worker and the application dominates.
    """

    host: str
    ports: list[int]
    processes: list[subprocess.Popen[bytes]]
    log_path: Path
    peak_rss_mb: list[float] = field(default_factory=list)

    DESCRIPTION = (
        "{workers} process(es) × Django's WSGI server (django.core.servers.basehttp, as runserver; threaded, "
        "HTTP/1.1 keep-alive), one port each, clients round-robin over the ports"
    )

    @classmethod
    def start(
        cls,
        *,
        workers: int,
        environment: dict[str, str],
        host: str = "127.0.0.1",
        timeout_s: float = 60,
        module: str = "benchmarks._common",
    ) -> WsgiServers:
        """Start the servers; each runs ``python -m <module> serve HOST PORT``. A benchmark that must
        prepare its server processes (a clock, a setting) passes its own module, whose ``serve`` does that
        and then calls ``serve_wsgi``."""
        log = tempfile.NamedTemporaryFile(prefix="cardhour-bench-server-", suffix=".log", delete=False)  # noqa: SIM115
        env = {**os.environ, **environment}
        ports = [free_port(host) for _ in range(workers)]
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", module, "serve", host, str(port)],
                cwd=PROJECT_ROOT,
                env=env,
                stdout=log,
                stderr=log,
            )
            for port in ports
        ]
        servers = cls(host=host, ports=ports, processes=processes, log_path=Path(log.name))
        log.close()
        deadline = time.monotonic() + timeout_s
        for port, process in zip(ports, processes, strict=True):
            while True:
                if process.poll() is not None:
                    servers.stop(keep_log=True)
                    raise RuntimeError(f"server on port {port} exited; see {servers.log_path}")
                try:
                    conn = http.client.HTTPConnection(host, port, timeout=5)
                    conn.request("GET", "/healthz")
                    if conn.getresponse().status < 500:
                        conn.close()
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    servers.stop(keep_log=True)
                    raise RuntimeError(f"server on port {port} did not answer in {timeout_s:.0f} s")
                time.sleep(0.2)
        return servers

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, *, keep_log: bool = False) -> None:
        """Stop the servers (recording their peak RSS first); their log is removed unless ``keep_log``."""
        self.peak_rss_mb = [process_peak_rss_mb(p.pid) for p in self.processes]
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if not keep_log:
            self.log_path.unlink(missing_ok=True)


def serve_wsgi(host: str, port: int) -> None:
    """Serve config.wsgi.application on ``host:port`` until killed (the body of one server process)."""
    _serve(host, port)


def _serve(host: str, port: int) -> None:
    sys.path.insert(0, str(PROJECT_ROOT))
    import django

    django.setup()
    import socketserver

    from django.core.servers.basehttp import WSGIRequestHandler, WSGIServer

    from config.wsgi import application

    class Handler(WSGIRequestHandler):
        # The server writes the status line and headers, then the body, in separate sends: without
        # TCP_NODELAY, Nagle's algorithm meets the client's delayed ACK and adds ~40 ms to a response.
        disable_nagle_algorithm = True

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

    httpd = Server((host, port), Handler)
    httpd.set_app(application)
    httpd.serve_forever()


class LeanConnection:
    """A keep-alive HTTP/1.1 client connection for load generators that share the server's machine: the
    request written as one buffer, the answer read by its ``Content-Length`` (or chunk by chunk), and the
    status, ``Content-Length``, ``Transfer-Encoding`` and ``Connection`` headers the only ones looked at.

    ``http.client`` parses every header of every answer into an ``email`` message and reads the body
    through a buffered file: 0.12–0.14 ms of CPU per POST and its 20 KB answer on this project's 2-core
    machine, against 0.045–0.05 ms here (a loopback server replaying one canned answer, 5,000 requests,
    thread CPU time), CPU the generator takes from the 2 cores it shares with the server under test. A connection the server closes (an answer with ``Connection: close``, or a
    keep-alive that timed out) is reopened by the next request; an end of stream before the status line
    raises ``http.client.RemoteDisconnected``, as ``http.client`` does, so that a caller retries a request
    exactly where it would have."""

    def __init__(self, host: str, port: int, *, timeout: float = 120.0) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buffer = bytearray()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.buffer.clear()

    def request(
        self, method: str, path: str, *, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """Send one request and read its whole answer: (status, body)."""
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            self.sock.sendall(head + body if body else head)
            return self._answer()
        except BaseException:
            self.close()  # a half-sent request or half-read answer leaves the stream unusable
            raise

    def _fill(self, *, started: bool) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(262_144)
        if not chunk:
            if not started:
                raise http.client.RemoteDisconnected("the server closed the connection without answering")
            raise http.client.IncompleteRead(bytes(self.buffer))
        self.buffer += chunk

    def _answer(self) -> tuple[int, bytes]:
        buffer = self.buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            self._fill(started=bool(buffer))
        head = bytes(buffer[:end]).split(b"\r\n")
        del buffer[: end + 4]
        status = int(head[0].split(b" ", 2)[1])
        length: int | None = None
        chunked = close = False
        for line in head[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        if chunked:
            body = self._chunked()
        elif length is not None:
            while len(buffer) < length:
                self._fill(started=True)
            body = bytes(buffer[:length])
            del buffer[:length]
        elif status in (204, 304) or 100 <= status < 200:
            body = b""
        else:  # no length: the body runs to the end of the stream
            assert self.sock is not None
            while chunk := self.sock.recv(262_144):
                buffer += chunk
            body, close = bytes(buffer), True
        if close:
            self.close()
        return status, body

    def _chunked(self) -> bytes:
        buffer, parts = self.buffer, list[bytes]()
        while True:
            while (end := buffer.find(b"\r\n")) < 0:
                self._fill(started=True)
            size = int(bytes(buffer[:end]).split(b";", 1)[0], 16)
            del buffer[: end + 2]
            if size == 0:  # the trailer: header lines up to an empty one
                while (end := buffer.find(b"\r\n")) != 0:
                    if end < 0:
                        self._fill(started=True)
                    else:
                        del buffer[: end + 2]
                del buffer[:2]
                return b"".join(parts)
            while len(buffer) < size + 2:
                self._fill(started=True)
            parts.append(bytes(buffer[:size]))
            del buffer[: size + 2]


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes | None = None


@dataclass
class LoadResult:
    """Per request, in request order: status (0 for a transport error), latency and completion time
    (seconds since the run started); ``errors`` holds one message per failed or rejected request."""

    status: list[int]
    latency_s: list[float]
    done_at_s: list[float]
    wall_s: float
    errors: list[str]


def run_closed_loop(
    *,
    requests: Sequence[HttpRequest],
    host: str,
    ports: Sequence[int],
    concurrency: int,
    check: Callable[[int, int, bytes], str | None] | None = None,
) -> LoadResult:
    """Send ``requests`` from ``concurrency`` client threads, each on one keep-alive connection to
    ``ports[thread % len(ports)]``, each sending its next request as soon as the last one is answered.

    Latency is from sending the request to reading the whole body. ``check(index, status, body)`` runs
    after timing and returns an error message or None; without it any status >= 400 is an error.
    """
    n = len(requests)
    status = [0] * n
    latency = [math.nan] * n
    done_at = [math.nan] * n
    errors: list[str] = []
    lock = threading.Lock()
    next_index = iter(range(n))
    started = time.perf_counter()

    def worker(thread: int) -> None:
        port = ports[thread % len(ports)]
        conn = http.client.HTTPConnection(host, port, timeout=120)
        try:
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                req = requests[i]
                t0 = time.perf_counter()
                try:
                    conn.request(req.method, req.path, body=req.body, headers=req.headers)
                    response = conn.getresponse()
                    body = response.read()
                    code = response.status
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    code, body = 0, repr(exc).encode()
                t1 = time.perf_counter()
                status[i], latency[i], done_at[i] = code, t1 - t0, t1 - started
                message = check(i, code, body) if check is not None else None
                if check is None and not 200 <= code < 400:
                    message = f"{req.method} {req.path}: HTTP {code} {body[:300]!r}"
                if message is not None:
                    with lock:
                        errors.append(message)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return LoadResult(
        status=status,
        latency_s=latency,
        done_at_s=done_at,
        wall_s=time.perf_counter() - started,
        errors=errors,
    )


def windowed_rates(done_at_s: Sequence[float], windows: int = 10) -> list[float]:
    """Completions per second in ``windows`` equal slices of the completions (by count), to show drift
    and noise inside one run."""
    ordered = sorted(t for t in done_at_s if not math.isnan(t))
    if len(ordered) < windows * 2:
        return []
    size = len(ordered) // windows
    rates = []
    previous = 0.0
    for w in range(windows):
        end = ordered[(w + 1) * size - 1]
        rates.append(size / max(end - previous, 1e-9))
        previous = end
    return rates


def parse_args_serve(argv: Sequence[str]) -> tuple[str, int]:
    if len(argv) != 3 or argv[0] != "serve":
        raise SystemExit("usage: python -m benchmarks._common serve HOST PORT")
    return argv[1], int(argv[2])


def main(argv: Sequence[str]) -> Any:
    host, port = parse_args_serve(argv)
    _serve(host, port)


if __name__ == "__main__":
    main(sys.argv[1:])


# --- A JSON client for benchmark drivers ------------------------------------------------------------------


class JsonClient:
    """Blocking JSON-over-HTTP calls for a benchmark's driver threads: one keep-alive connection per
    thread, threads spread round-robin over the server ports (as ``run_closed_loop`` does). Every call's
    latency is kept per ``label`` (see ``latencies``).

    A connection the server closed between two requests is reopened and the request sent once more; that
    is the only retry (so a POST is never repeated after the server may have seen it)."""

    def __init__(self, *, host: str, ports: Sequence[int], timeout_s: float = 300):
        self.host = host
        self.ports = list(ports)
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._next_port = 0
        self.latencies: dict[str, list[float]] = {}

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            with self._lock:
                port = self.ports[self._next_port % len(self.ports)]
                self._next_port += 1
            conn = http.client.HTTPConnection(self.host, port, timeout=self.timeout_s)
            self._local.conn = conn
        return conn

    def call(
        self,
        method: str,
        path: str,
        *,
        token: str,
        body: Any = None,
        raw: bytes | None = None,
        content_type: str = "application/json",
        label: str | None = None,
    ) -> tuple[int, Any]:
        """Send one request; returns (status, parsed JSON body or None)."""
        import json

        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in range(2):
            conn = self._connection()
            t0 = time.perf_counter()
            try:
                conn.request(method, path, body=data, headers=headers)
            except (ConnectionError, http.client.CannotSendRequest, BrokenPipeError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
                continue
            try:
                response = conn.getresponse()
                payload = response.read()
            except http.client.RemoteDisconnected:
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
                continue
            elapsed = time.perf_counter() - t0
            if label is not None:
                with self._lock:
                    self.latencies.setdefault(label, []).append(elapsed)
            if response.getheader("Connection", "").lower() == "close":
                conn.close()
                self._local.conn = None
            return response.status, (json.loads(payload) if payload else None)
        raise RuntimeError("unreachable")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
