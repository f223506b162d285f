"""``manage.py simulate_lease_agents``: the demo operators' lease agents, over the REST API.

Every tick, for each operator in the token file ``seed_demo`` writes, the agent does what a real one does
with its leases through the operator API (``/api/v1/operator/...``) and that operator's token:

1. It lists the operator's leases in ``reserved``, ``running`` and ``stop_requested`` (every page).
2. It starts each reserved lease whose ``start_at`` has come: ``at`` is ``start_at`` when the agent is
   within ``LEASE_START_GRACE`` (5 minutes) of it, else now (the job started late). A reserved lease whose
   whole window has passed unstarted (the simulator was not running) is reported ``failed``.
3. It reports usage of every lease that runs, from where its last report ended (``last_usage_end_at``, or
   when the lease started) up to now, or up to ``end_at`` once that has passed, or up to
   ``stop_requested_at`` when the platform asked the lease to stop: whole-second records of at most an
   hour, all of an operator's records in one ``POST /operator/usage`` (batches of at most
   ``CARDHOUR_USAGE_BATCH_MAX``). A record's idempotency key is derived from its lease and its start second,
   so a tick retried after a lost answer is a ``duplicate``, never a second charge.
4. It stops (``completed``) each lease whose ``end_at`` has passed, at ``end_at``, and each lease asked to
   stop, at ``stop_requested_at`` (never before the end of usage already reported) — once its usage is in.

Like ``simulate_agents`` it uses only the standard library's urllib (it must talk HTTP like an outside
agent), waits for the web server to come up, survives a server that goes away (logs, retries next tick:
everything is re-derived from the lease list, so nothing is lost or doubled), logs HTTP errors with their
status and error code, and stops cleanly on SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from broker.services.dispatch import LEASE_START_GRACE
from federation.management.commands.seed_demo import default_tokens_file, read_tokens_file
from federation.management.commands.simulate_agents import (
    ServerUnreachableError,
    server_is_up,
    stop_on_signals,
)

logger = logging.getLogger("cardhour.simulate_lease_agents")

DEFAULT_INTERVAL_SECONDS = 15.0
REQUEST_TIMEOUT_SECONDS = 30
USER_AGENT = "cardhour-demo-lease-agent/1.0 (urllib)"
LEASES_PATH = "/api/v1/operator/leases"
USAGE_PATH = "/api/v1/operator/usage"
ACTIVE_STATES = ("reserved", "running", "stop_requested")
PAGE_SIZE = 500
# The longest usage record the agent reports: a backlog (the simulator was down) goes in hour-long slices.
RECORD_MAX_SECONDS = 3600
KEY_PREFIX = "sim"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


# --- HTTP ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiResult:
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def code(self) -> str:
        return str(self.body.get("code", "")) if isinstance(self.body, dict) else ""

    def describe(self) -> str:
        """``HTTP 409 lease_invalid_transition: <message>``: what an error answer says, for the log."""
        if isinstance(self.body, dict) and "code" in self.body:
            return f"HTTP {self.status} {self.body.get('code')}: {self.body.get('message')}"
        return f"HTTP {self.status} {str(self.body)[:200]}"


class OperatorClient:
    """One operator's agent talking to the operator API with its token. An answer with any status is a
    result; no answer at all (refused, reset, timed out) raises ServerUnreachableError."""

    def __init__(self, *, base_url: str, token: str, operator: str):
        self.base_url = base_url
        self.token = token
        self.operator = operator

    def call(
        self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None
    ) -> ApiResult:
        url = f"{self.base_url}{path}"
        if query:
            url = f"{url}?{urllib.parse.urlencode(query)}"
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
        try:
            # The URL is built from --base-url, whose scheme is checked to be http(s) in handle().
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_SECONDS) as response:  # noqa: S310
                status, payload = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise ServerUnreachableError(str(getattr(exc, "reason", exc))) from exc
        try:
            parsed = json.loads(payload) if payload else None
        except ValueError:
            parsed = payload[:200].decode(errors="replace")
        return ApiResult(status=status, body=parsed)

    def active_leases(self) -> ApiResult | list[dict[str, Any]]:
        """Every lease of the operator that is reserved, running or asked to stop (all pages), or the
        error answer."""
        leases: list[dict[str, Any]] = []
        page = 1
        while True:
            result = self.call(
                "GET",
                LEASES_PATH,
                query={"state": ",".join(ACTIVE_STATES), "page": page, "page_size": PAGE_SIZE},
            )
            if not result.ok:
                return result
            leases.extend(result.body["results"])
            # Page numbers rather than the `next` link: that link carries whatever host the server saw.
            if not result.body.get("next"):
                return leases
            page += 1


# --- Time ---------------------------------------------------------------------------------------------


def parse_instant(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value).astimezone(UTC)


def iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def floor_second(value: datetime) -> datetime:
    return value.replace(microsecond=0)


def ceil_second(value: datetime) -> datetime:
    return value if not value.microsecond else value.replace(microsecond=0) + _SECOND


def epoch_seconds(value: datetime) -> int:
    return (value - _EPOCH) // _SECOND


# --- What to do with one lease --------------------------------------------------------------------------


def idempotency_key(*, lease_id: int, start: datetime) -> str:
    """The key of the usage record of ``lease_id`` starting at ``start``: the same record reported twice
    (a retried tick) carries the same key and is stored once."""
    return f"{KEY_PREFIX}:lease:{lease_id}:{epoch_seconds(start)}"


@dataclass(frozen=True)
class UsagePlan:
    """What the agent reports for one running (or asked-to-stop) lease this tick."""

    lease_id: int
    cards: int
    records: list[dict[str, Any]]
    # When the lease stops (completed) once its usage is in; None while it keeps running.
    stop_at: datetime | None
    why: str = ""


def usage_plan(lease: dict[str, Any], *, now: datetime) -> UsagePlan:
    """The usage records and the stop due for a running or stop_requested lease (a lease document as the
    operator API renders it) at ``now``.

    Usage runs from where the last report ended (or the lease's start: ``start_at``, or ``started_at`` if
    the job started late) up to the first of now, ``end_at`` and ``stop_requested_at``, in whole seconds,
    sliced into records of at most an hour. The lease stops when ``end_at`` or the stop request has come,
    at that instant, or at the end of usage already reported if that is later (a stop may not precede it).
    """
    lease_id, cards = int(lease["id"]), int(lease["cards"])
    start_at = parse_instant(lease["start_at"])
    end_at = parse_instant(lease["end_at"])
    assert start_at is not None and end_at is not None
    started_at = parse_instant(lease.get("started_at")) or start_at
    last_end = parse_instant(lease.get("last_usage_end_at"))
    stop_requested_at = parse_instant(lease.get("stop_requested_at"))

    begin = ceil_second(last_end or max(start_at, started_at))
    limit, stop_at, why = now, None, ""
    if lease["state"] == "stop_requested" and stop_requested_at is not None:
        limit = min(stop_requested_at, end_at)
        why = "asked to stop"
    elif end_at <= now:
        limit = end_at
        why = "reached its end"
    if why and limit <= now:
        stop_at = max(limit, last_end or limit)
    until = floor_second(min(limit, now))

    records: list[dict[str, Any]] = []
    cursor = begin
    while cursor < until:
        end = min(cursor + timedelta(seconds=RECORD_MAX_SECONDS), until)
        records.append(
            {
                "lease": lease_id,
                "idempotency_key": idempotency_key(lease_id=lease_id, start=cursor),
                "start_at": iso(cursor),
                "end_at": iso(end),
                "cards": cards,
            }
        )
        cursor = end
    return UsagePlan(lease_id=lease_id, cards=cards, records=records, stop_at=stop_at, why=why)


# --- One tick -----------------------------------------------------------------------------------------


@dataclass
class TickReport:
    """What one tick did, over every operator."""

    started: int = 0
    stopped: int = 0
    failed: int = 0
    records_created: int = 0
    records_duplicate: int = 0
    errors: list[str] = field(default_factory=list)
    unreachable: bool = False


def _error(report: TickReport, operator: str, what: str, result: ApiResult) -> None:
    message = f"{operator}: {what} failed: {result.describe()}"
    logger.warning(message)
    report.errors.append(message)


def _start_due(
    client: OperatorClient, leases: list[dict[str, Any]], *, now: datetime, report: TickReport
) -> list[dict[str, Any]]:
    """Start (or fail) the reserved leases whose start has come; return the leases that now run."""
    running: list[dict[str, Any]] = []
    for lease in leases:
        if lease["state"] != "reserved":
            running.append(lease)
            continue
        start_at = parse_instant(lease["start_at"])
        end_at = parse_instant(lease["end_at"])
        assert start_at is not None and end_at is not None
        if start_at > now:
            continue
        path = f"{LEASES_PATH}/{lease['id']}"
        if end_at <= now:
            # Its whole window passed before the agent saw it: the job never ran.
            reason = "the window passed before the agent could start it"
            result = client.call(
                "POST",
                f"{path}/stop",
                body={"at": iso(floor_second(now)), "outcome": "failed", "reason": reason},
            )
            if result.ok:
                report.failed += 1
                logger.info("%s: lease %s failed: %s", client.operator, lease["id"], reason)
            else:
                _error(report, client.operator, f"failing lease {lease['id']}", result)
            continue
        at = start_at if now - start_at <= LEASE_START_GRACE else floor_second(now)
        result = client.call("POST", f"{path}/start", body={"at": iso(at)})
        if not result.ok:
            _error(report, client.operator, f"starting lease {lease['id']}", result)
            continue
        report.started += 1
        late = "" if at == start_at else f", {int((at - start_at).total_seconds())} s late"
        logger.info(
            "%s: lease %s started at %s (%s cards on %s%s)",
            client.operator,
            lease["id"],
            iso(at),
            lease["cards"],
            lease["cluster"],
            late,
        )
        running.append(result.body)
    return running


def _faulty_leases(result: ApiResult, batch: Sequence[dict[str, Any]]) -> set[int]:
    """The leases of the records a 400 ``lease_usage_invalid`` names (only its first 100 faults)."""
    extra = result.body.get("extra") if isinstance(result.body, dict) else None
    errors = extra.get("errors") if isinstance(extra, dict) else None
    if result.code != "lease_usage_invalid" or not isinstance(errors, list):
        return set()
    return {
        int(batch[e["index"]]["lease"])
        for e in errors
        if isinstance(e, dict) and isinstance(e.get("index"), int) and 0 <= e["index"] < len(batch)
    }


def _post_usage(client: OperatorClient, records: list[dict[str, Any]], *, report: TickReport) -> set[int]:
    """POST the records in batches; return the leases whose usage did not get in. A batch rejected for
    some leases' records is sent once more without them, so one bad lease does not hold up the rest."""
    refused: set[int] = set()
    limit = int(settings.CARDHOUR_USAGE_BATCH_MAX)
    for offset in range(0, len(records), limit):
        batch = records[offset : offset + limit]
        for attempt in range(2):
            result = client.call("POST", USAGE_PATH, body={"records": batch})
            body = result.body if isinstance(result.body, dict) else {}
            counts = body.get("extra", {}) if result.code == "usage_conflict" else body
            if result.ok or result.code == "usage_conflict":
                created, duplicates = int(counts.get("created", 0)), int(counts.get("duplicates", 0))
                report.records_created += created
                report.records_duplicate += duplicates
                leases = {int(r["lease"]) for r in batch}
                card_seconds = sum(
                    int(r["cards"])
                    * (
                        epoch_seconds(parse_instant(r["end_at"]) or _EPOCH)
                        - epoch_seconds(parse_instant(r["start_at"]) or _EPOCH)
                    )
                    for r in batch
                )
                logger.info(
                    "%s: usage reported: %d record(s) for %d lease(s), %d card-seconds: %d created, "
                    "%d duplicate(s)",
                    client.operator,
                    len(batch),
                    len(leases),
                    card_seconds,
                    created,
                    duplicates,
                )
                if result.code == "usage_conflict":
                    conflicted = {
                        int(batch[o["index"]]["lease"])
                        for o in counts.get("records", [])
                        if isinstance(o, dict) and o.get("status") == "conflict"
                    }
                    refused |= conflicted
                    _error(report, client.operator, "reporting usage", result)
                break
            faulty = _faulty_leases(result, batch) if attempt == 0 else set()
            _error(report, client.operator, "reporting usage", result)
            if not faulty:
                refused |= {int(r["lease"]) for r in batch}
                break
            refused |= faulty
            batch = [r for r in batch if int(r["lease"]) not in faulty]
            if not batch:
                break
    return refused


def operator_tick(client: OperatorClient, *, now: datetime | None = None, report: TickReport) -> None:
    """One tick of one operator's agent. Raises ServerUnreachableError if the server stops answering."""
    now = now or timezone.now()
    listed = client.active_leases()
    if isinstance(listed, ApiResult):
        _error(report, client.operator, "listing leases", listed)
        return
    running = _start_due(client, listed, now=now, report=report)
    plans = [usage_plan(lease, now=now) for lease in running]
    records = [record for plan in plans for record in plan.records]
    refused = _post_usage(client, records, report=report) if records else set()
    for plan in plans:
        if plan.stop_at is None or plan.lease_id in refused:
            continue
        result = client.call(
            "POST",
            f"{LEASES_PATH}/{plan.lease_id}/stop",
            body={"at": iso(plan.stop_at), "outcome": "completed"},
        )
        if not result.ok:
            _error(report, client.operator, f"stopping lease {plan.lease_id}", result)
            continue
        report.stopped += 1
        logger.info(
            "%s: lease %s completed at %s (%s)", client.operator, plan.lease_id, iso(plan.stop_at), plan.why
        )


def tick(
    *,
    base_url: str,
    tokens: dict[str, str],
    now: datetime | None = None,
    stop: threading.Event | None = None,
) -> TickReport:
    """One tick of every operator's agent. A server that stops answering ends the tick (logged, and
    ``report.unreachable`` set): the next tick picks up from the lease list, so nothing is lost."""
    report = TickReport()
    for operator, token in sorted(tokens.items()):
        if stop is not None and stop.is_set():
            break
        client = OperatorClient(base_url=base_url, token=token, operator=operator)
        try:
            operator_tick(client, now=now, report=report)
        except ServerUnreachableError as exc:
            logger.warning("web server unreachable (%s); retrying next tick", exc)
            report.unreachable = True
            break
    return report


# --- The command --------------------------------------------------------------------------------------


class Command(BaseCommand):
    help = (
        "Simulate the demo operators' lease agents: start leases, report their usage and stop them over "
        "the operator API, every interval."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--base-url",
            default=f"http://127.0.0.1:{os.environ.get('PORT', '8000')}",
            help="The Cardhour web server (default http://127.0.0.1:$PORT, PORT defaulting to 8000).",
        )
        parser.add_argument(
            "--interval",
            type=float,
            default=DEFAULT_INTERVAL_SECONDS,
            help=f"Seconds between ticks (default {DEFAULT_INTERVAL_SECONDS:g}).",
        )
        parser.add_argument(
            "--once", action="store_true", help="Run one tick and exit (non-zero if anything failed)."
        )
        parser.add_argument(
            "--tokens-file", type=Path, default=None, help="Default var/demo-agent-tokens.json."
        )
        parser.add_argument(
            "--startup-timeout",
            type=float,
            default=None,
            help="Give up if the server is not up after this many seconds (default: wait forever; 60 with --once).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        base_url: str = options["base_url"].rstrip("/")
        if urllib.parse.urlsplit(base_url).scheme not in {"http", "https"}:
            raise CommandError(f"--base-url must be an http(s) URL, not {base_url!r}.")
        interval: float = options["interval"]
        if interval <= 0:
            raise CommandError("--interval must be positive.")
        once: bool = options["once"]
        tokens_path: Path = options["tokens_file"] or default_tokens_file()
        startup_timeout = options["startup_timeout"]
        if startup_timeout is None and once:
            startup_timeout = 60.0
        stop = threading.Event()

        with stop_on_signals(stop):
            if not self._wait_for_server(base_url, stop=stop, timeout=startup_timeout):
                if stop.is_set():
                    return
                raise CommandError(f"{base_url} did not come up within {startup_timeout:g} s.")
            logger.info("lease agents working %s every %g s (tokens: %s)", base_url, interval, tokens_path)
            deadline = time.monotonic()
            while not stop.is_set():
                failed = self._tick(base_url=base_url, tokens_path=tokens_path, stop=stop)
                if once:
                    if failed:
                        raise CommandError(f"{failed} lease agent action(s) failed.")
                    return
                deadline = max(deadline + interval, time.monotonic())
                stop.wait(deadline - time.monotonic())
        logger.info("lease agents stopped")

    def _wait_for_server(self, base_url: str, *, stop: threading.Event, timeout: float | None) -> bool:
        started = time.monotonic()
        announced = False
        while not stop.is_set():
            if server_is_up(base_url):
                return True
            if not announced:
                logger.info("waiting for the web server at %s ...", base_url)
                announced = True
            if timeout is not None and time.monotonic() - started >= timeout:
                return False
            stop.wait(1.0)
        return False

    def _tick(self, *, base_url: str, tokens_path: Path, stop: threading.Event) -> int:
        """One tick; returns the number of failures."""
        # Re-read every tick: re-running seed_demo may have issued new tokens.
        tokens = read_tokens_file(tokens_path)
        if not tokens:
            logger.error("no agent tokens in %s; run `manage.py seed_demo` first", tokens_path)
            return 1
        report = tick(base_url=base_url, tokens=tokens, stop=stop)
        return len(report.errors) + int(report.unreachable)
