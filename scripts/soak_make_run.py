"""Soak `make run`: the embedded stack (web, Celery worker and beat on the file transport, the demo agents,
localstripe) for ``--minutes`` with a scripted buyer placing jobs, scraping /metrics as it goes; at the end
every process must still be running.

    python scripts/soak_make_run.py --minutes 30 --port 8770

Prints one line per minute (jobs placed, quotes, accepted, metric figures) and a summary; exits non-zero if
any process exited, the web server stopped answering, or no job could be placed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROCESSES = ("web", "worker", "control", "beat", "agents", "leases", "stripe")


def request(port: int, method: str, path: str, token: str = "", body: object = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Host": "127.0.0.1"}
        data = None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def buyer_token() -> str:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.local"}
    code = (
        "from core.models import Organisation\n"
        "from core.services import api_token_create\n"
        "org = Organisation.objects.get(slug='demo-buyer')\n"
        "print(api_token_create(organisation=org, name='soak buyer', scope='read_write')[1])\n"
    )
    out = subprocess.run(  # noqa: S603
        [str(ROOT / ".venv/bin/python"), "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def honcho_children(pid: int) -> dict[str, bool]:
    """Which of the Procfile's processes are alive under honcho (by their command lines)."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True, check=True).stdout  # noqa: S607
    rows = [line.split(None, 2) for line in out.splitlines()[1:] if line.strip()]
    tree: dict[int, list[tuple[int, str]]] = {}
    for row in rows:
        if len(row) == 3:
            tree.setdefault(int(row[1]), []).append((int(row[0]), row[2]))
    found: list[str] = []
    stack = [pid]
    while stack:
        for child, args in tree.get(stack.pop(), []):
            found.append(args)
            stack.append(child)
    text = "\n".join(found)
    return {
        "web": "runserver" in text,
        "worker": "worker -Q rating,celery" in text,
        "control": "worker -Q control" in text,
        "beat": " beat" in text,
        "agents": "simulate_agents" in text,
        "leases": "simulate_lease_agents" in text,
        "stripe": "run_localstripe" in text,
    }


def metric(text: str, name: str) -> float | None:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--port", type=int, default=8770)
    args = parser.parse_args()

    (ROOT / "var").mkdir(exist_ok=True)  # a fresh clone has none until make run makes it
    log = open(ROOT / "var" / "soak.log", "w")  # noqa: SIM115
    process = subprocess.Popen(  # noqa: S603
        ["make", "run", f"PORT={args.port}"],  # noqa: S607
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    failures: list[str] = []
    placed = quotes = accepted = 0
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if request(args.port, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                print("make run did not come up", file=sys.stderr)
                return 1
            time.sleep(2)
        time.sleep(10)  # let the worker, beat and agents start
        token = buyer_token()
        started = time.monotonic()
        end = started + args.minutes * 60
        next_report = started + 60
        n = 0
        while time.monotonic() < end:
            n += 1
            earliest = datetime.now(UTC) + timedelta(minutes=2)
            job = {
                "name": f"soak-{n}",
                "cards": 1 + n % 4,
                "origin_hub": "yrd",
                "latency_budget_ms": 50,
                "earliest_start_at": earliest.isoformat(),
                "deadline_at": (earliest + timedelta(hours=6)).isoformat(),
                "duration_seconds": 600,
            }
            try:
                status, raw = request(args.port, "POST", "/api/v1/jobs", token, job)
                if status == 201:
                    job_id = json.loads(raw)["id"]
                    status, raw = request(
                        args.port, "POST", f"/api/v1/jobs/{job_id}/quotes", token, {"limit": 3}
                    )
                    quotes += 1
                    offers = json.loads(raw).get("quotes", []) if status in (200, 201) else []
                    if offers:
                        status, raw = request(
                            args.port, "POST", f"/api/v1/quotes/{offers[0]['id']}/accept", token, {}
                        )
                        if status in (200, 201):
                            accepted += 1
                    placed += 1
                else:
                    failures.append(f"POST /jobs: {status} {raw[:200]!r}")
            except OSError as exc:
                failures.append(f"buyer: {exc!r}")
            if time.monotonic() >= next_report:
                next_report += 60
                alive = honcho_children(process.pid)
                status, raw = request(args.port, "GET", "/metrics")
                text = raw.decode() if status == 200 else ""
                minute = round((time.monotonic() - started) / 60)
                print(
                    f"min {minute:>2}: jobs {placed} quotes {quotes} accepted {accepted}; "
                    f"unrated {metric(text, 'cardhour_usage_unrated_records')} "
                    f"(oldest {metric(text, 'cardhour_usage_unrated_oldest_age_seconds')} s), "
                    f"lease events pending {metric(text, 'cardhour_lease_events_pending')}, "
                    f"offline {metric(text, 'cardhour_clusters_offline')}; "
                    f"processes {'all up' if all(alive.values()) else alive}",
                    flush=True,
                )
                if not all(alive.values()):
                    failures.append(f"minute {minute}: a process is down: {alive}")
            time.sleep(15)
        alive = honcho_children(process.pid)
        print(
            f"after {args.minutes:g} min: processes {alive}; make run {'running' if process.poll() is None else 'exited'}"
        )
        if not all(alive.values()) or process.poll() is not None:
            failures.append(f"at the end: {alive}")
        if accepted == 0:
            failures.append("no quote was accepted")
    finally:
        try:
            os.killpg(process.pid, signal.SIGINT)
            process.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGKILL)
        log.close()
    for failure in failures[:20]:
        print("FAIL", failure, file=sys.stderr)
    print(f"soak: {placed} jobs, {quotes} quotes, {accepted} accepted, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
