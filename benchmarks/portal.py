"""The portal's pages: server time and query count of every page, on PostgreSQL with the demo data and a
buyer holding 10,000 rated usage records.

    python -m benchmarks.portal                    # 10,000 records, 20 requests per page
    python -m benchmarks.portal --records 2000 -n 5

What it does, in order:

1. Creates a throwaway database (the one named by ``--database-url``, default ``$DATABASE_URL`` or
   postgres://postgres@127.0.0.1:5432/bench_portal; its name must contain ``bench``: it is dropped and
   created afresh, and dropped again at the end unless ``--keep``), migrates it, and loads the demo
   (``seed_demo``, ``seed_billing_demo``, ``seed_broker_demo``).
2. A heavy buyer (``bench-heavy``, log-in ``heavy``): an A800 pack bought 40 days ago, 20 jobs whose
   leases ran back to back over the last ~26 days on one of China Unicom's demo clusters, their usage
   reported through the operator's service (``lease_usage_report``: ``--records`` records of a few
   minutes each) and rated (``usage_rate_pending``); last month's invoice and settlement issued; one job
   with live quotes; an API token, a viewer and a pending invitation; a private tariff of China Unicom's.
3. Every portal page from the root resolver (the permission sweep's enumeration,
   tests/browser/portal_world.py, so new pages are measured without editing this file), opened by its
   owner with Django's test client in this process: the demo buyer and the heavy buyer (buyer and account
   pages), China Unicom's owner ``cucc-ops`` (operator pages), ``admin`` (staff pages). Per page: a
   warm-up, then ``-n`` requests timed one after the other (p50 / p95 / max wall time, and p50 of this
   process's CPU time, which a busy shared machine disturbs less), and the queries of one more request
   (CaptureQueriesContext).
4. Baselines measured in the same run, the same way: ``/healthz`` (no template, no session) and the
   log-in page (a template, anonymous).

Target: every page's p95 < 300 ms server time. Prints PASS/MISS per page; exits non-zero only when a page
answers an error (not 200), never on a miss.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks._common import (
    BenchDatabase,
    Timer,
    database_url_with_name,
    django_setup,
    machine_description,
    ms,
    percentile,
    print_table,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/bench_portal"
TARGET_MS = 300.0
HEAVY_SLUG = "bench-heavy"
HEAVY_USERNAME = "heavy"
HEAVY_OPERATOR = "cucc"
A800 = "nvidia-a800-sxm4-80gb"
LEASES = 20
LEASE_HOURS = 30
CARDS = 8


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL,
        help="PostgreSQL database to create for the run (its name must contain 'bench')",
    )
    parser.add_argument("--records", type=int, default=10_000, help="usage records of the heavy buyer")
    parser.add_argument("-n", "--requests", type=int, default=20, help="timed requests per page")
    parser.add_argument("--warmup", type=int, default=2, help="untimed requests per page first")
    parser.add_argument("--keep", action="store_true", help="do not drop the database at the end")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    parts = urlsplit(args.database_url)
    name = parts.path.lstrip("/")
    if parts.scheme not in ("postgres", "postgresql") or "bench" not in name:
        print(f"refusing {args.database_url}: a PostgreSQL database whose name contains 'bench' is needed")
        return 2
    database = BenchDatabase.create(
        server_url=database_url_with_name(args.database_url, "postgres"), name=name
    )
    try:
        return run(args, database)
    finally:
        if not args.keep:
            database.drop()


# --- The data ---------------------------------------------------------------------------------------------


def seed_demo() -> None:
    from django.core.management import call_command

    with tempfile.TemporaryDirectory() as tmp:
        call_command("seed_demo", tokens_file=Path(tmp) / "tokens.json", verbosity=0, stdout=_Null())
    call_command("seed_billing_demo", verbosity=0, stdout=_Null())
    call_command("seed_broker_demo", verbosity=0, stdout=_Null())


class _Null:
    def write(self, *args: Any) -> None:
        pass

    def flush(self) -> None:
        pass


def heavy_buyer(*, records: int) -> Any:
    """The heavy buyer's world (see the module docstring); returns a PortalWorld for the URL keywords."""
    from django.contrib.auth.models import User
    from django.db import transaction
    from django.utils import timezone

    from broker.models import Job
    from broker.services.dispatch import LeaseUsageInput, lease_start, lease_stop, lease_usage_report
    from broker.services.leases import lease_create
    from broker.services.quotes import quote_create
    from core.models import Membership, Organisation
    from core.services import api_token_create, invitation_create
    from core.types import Actor
    from federation.models import Accelerator, Cluster, Hub
    from metering.models import PackOrder, PackProduct
    from metering.selectors.tariffs import price_card_current
    from metering.services.billing import invoice_issue, settlement_issue
    from metering.services.packs import pack_issue
    from metering.services.rating import usage_rate_pending
    from metering.services.tariffs import tariff_create
    from metering.tariffs import TariffSpec, WindowSpec
    from tests.browser.portal_world import PortalWorld

    now = timezone.now().replace(microsecond=0)
    buyer = Organisation.objects.create(slug=HEAVY_SLUG, name="Heavy Bench Buyer", is_buyer=True)
    owner = User.objects.create_user(HEAVY_USERNAME, "heavy@example.com", "bench-pass-2026")
    viewer = User.objects.create_user("heavy-viewer", "heavy-viewer@example.com", "bench-pass-2026")
    Membership.objects.create(organisation=buyer, user=owner, role=Membership.Role.OWNER)
    member = Membership.objects.create(organisation=buyer, user=viewer, role=Membership.Role.VIEWER)
    buyer_actor = Actor(organisation=buyer, user=owner, can_write=True)

    a800 = Accelerator.objects.get(slug=A800)
    product, _ = PackProduct.objects.get_or_create(
        code="bench-a800-10000",
        defaults={
            "name": "A800 10,000",
            "accelerator": a800,
            "card_hours": 10_000,
            "price": Decimal("90000"),
        },
    )
    order = PackOrder.objects.create(
        buyer=buyer,
        product=product,
        accelerator=a800,
        card_hours=10_000,
        amount=Decimal("90000"),
        validity_days=365,
        idempotency_key="bench-heavy-a800",
    )
    pack, _ = pack_issue(order=order, paid_at=now - timedelta(days=40), posted_by="bench")

    operator = Organisation.objects.get(slug=HEAVY_OPERATOR)
    cluster = (
        Cluster.objects.filter(operator=operator, accelerator=a800, islands__cards__gte=CARDS)
        .order_by("pk")
        .distinct()
        .first()
    )
    if cluster is None:
        raise RuntimeError(f"no A800 cluster of {HEAVY_OPERATOR} with an island of {CARDS} cards in the demo")
    island = cluster.islands.filter(cards__gte=CARDS).order_by("pk").first()
    assert island is not None
    card = price_card_current(cluster=cluster)
    operator_actor = Actor(organisation=operator, system_label="bench agent")
    hub = Hub.objects.get(code="yrd")

    per_lease = -(-records // LEASES)
    seconds = LEASE_HOURS * 3600 // per_lease
    first_start = now - timedelta(hours=LEASES * LEASE_HOURS + 2)
    leases, jobs = [], []
    reported = 0
    for n in range(LEASES):
        start = first_start + timedelta(hours=n * LEASE_HOURS)
        end = start + timedelta(hours=LEASE_HOURS)
        job = Job.objects.create(
            buyer=buyer,
            name=f"heavy-training-{n:02d}",
            cards=CARDS,
            accelerators=[A800],
            fabrics=[],
            gang="island",
            origin_hub=hub,
            latency_budget_ms=100,
            earliest_start_at=start,
            deadline_at=end + timedelta(hours=1),
            duration_seconds=LEASE_HOURS * 3600,
            checkpointable=False,
            preference="price",
        )
        with transaction.atomic():
            lease = lease_create(
                job=job,
                cluster_id=cluster.pk,
                allocation=[(island.pk, CARDS)],
                start_at=start,
                end_at=end,
                price_card_id=card.pk,
                expected_cost=Decimal("0.00"),
                expected_draw=Decimal("0"),
                draw_class=A800,
                standard_card_factor=None,
                actor=buyer_actor,
                check_balance=False,
            )
        lease_start(operator=operator, lease_id=lease.pk, actor=operator_actor, at=start)
        count = min(per_lease, records - reported)
        batch = [
            LeaseUsageInput(
                lease_id=lease.pk,
                idempotency_key=f"bench:{lease.pk}:{i}",
                start_at=start + timedelta(seconds=i * seconds),
                end_at=start + timedelta(seconds=(i + 1) * seconds),
                cards=CARDS,
            )
            for i in range(count)
        ]
        if batch:
            lease_usage_report(operator=operator, records=batch, actor=operator_actor, now=now)
        reported += count
        last = batch[-1].end_at if batch else start
        lease_stop(operator=operator, lease_id=lease.pk, actor=operator_actor, at=max(last, start))
        leases.append(lease)
        jobs.append(job)
    usage_rate_pending(now=now)

    period = (
        now.astimezone(timezone.get_default_timezone()).date().replace(day=1) - timedelta(days=1)
    ).replace(day=1)
    invoice, _ = invoice_issue(buyer=buyer, period_start=period, now=now)
    settlement, _ = settlement_issue(operator=operator, period_start=period, now=now)

    quoted = Job.objects.create(
        buyer=buyer,
        name="heavy-quoted",
        cards=CARDS,
        accelerators=[A800],
        fabrics=[],
        gang="island",
        origin_hub=hub,
        latency_budget_ms=100,
        earliest_start_at=now,
        deadline_at=now + timedelta(hours=48),
        duration_seconds=7200,
        checkpointable=False,
        preference="price",
    )
    quotes = list(quote_create(job=quoted).quotes)
    if not quotes:
        raise RuntimeError("the matcher found no placement for the heavy buyer's quoted job")
    tariff = tariff_create(
        owner=operator,
        code="bench-night",
        name="Bench Night Tariff",
        time_zone="Asia/Shanghai",
        source="bench",
        spec=TariffSpec(
            time_zone="Asia/Shanghai",
            multipliers={"valley": Decimal("0.5"), "flat": Decimal("1")},
            windows=(WindowSpec("valley", 0, 8 * 60), WindowSpec("flat", 8 * 60, 24 * 60)),
        ),
        effective_from=None,
        actor=Actor(organisation=operator, system_label="bench"),
    )
    token, _ = api_token_create(organisation=buyer, name="heavy ci")
    operator_token, _ = api_token_create(organisation=operator, name="bench agent")
    invitation, invitation_token = invitation_create(
        actor=buyer_actor, email="invitee@example.com", role=Membership.Role.MEMBER
    )
    other = Organisation.objects.get(slug="demo-buyer")
    return PortalWorld(
        buyer=buyer,
        other_buyer=other,
        operator=operator,
        other_operator=operator,
        cluster=cluster,
        other_cluster=cluster,
        users={"owner": owner, "viewer": viewer},
        objects={
            "job": jobs[-1],
            "quoted_job": quoted,
            "quote": quotes[0],
            "lease": leases[-1],
            "live_lease": leases[-1],
            "invoice": invoice,
            "settlement": settlement,
            "pack": pack,
            "pack_order": order,
            "tariff": tariff,
            "other_tariff": tariff,
            "price_card": card,
            "token": token,
            "operator_token": operator_token,
            "membership": member,
            "invitation": invitation,
            "invitation_token": invitation_token,
            "period": period,
        },
    )


# --- Measuring ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PageTiming:
    label: str
    who: str
    status: int
    p50: float
    p95: float
    max: float
    cpu_p50: float
    queries: int

    @property
    def ok(self) -> bool:
        return self.status == 200


def measure(client: Any, path: str, *, label: str, who: str, n: int, warmup: int) -> PageTiming:
    """Warm-up requests, ``n`` timed ones (the whole response read), then one with its queries counted."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def get() -> Any:
        response = client.get(path)
        if getattr(response, "streaming", False):
            b"".join(response.streaming_content)
        return response

    for _ in range(warmup):
        get()
    times, cpu = [], []
    status = 0
    for _ in range(n):
        started, cpu_started = time.perf_counter(), time.process_time()
        response = get()
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
        status = response.status_code
    with CaptureQueriesContext(connection) as queries:
        get()
    ordered = sorted(times)
    return PageTiming(
        label=label,
        who=who,
        status=status,
        p50=percentile(ordered, 50),
        p95=percentile(ordered, 95),
        max=ordered[-1],
        cpu_p50=percentile(sorted(cpu), 50),
        queries=len(queries),
    )


def pages_to_measure(world: Any) -> list[tuple[str, str, Any, str]]:
    """(URL name, who, user, path) of every portal page that answers GET with content to measure."""
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    from tests.browser.portal_world import portal_patterns, world_kwargs

    people = {
        "demo buyer": User.objects.get(username="buyer"),
        "heavy buyer": User.objects.get(username=HEAVY_USERNAME),
        "cucc-ops": User.objects.get(username="cucc-ops"),
        "admin": User.objects.get(username="admin"),
    }
    public = {"home", "login", "logout", "signup", "invite-accept"}
    pages = []
    probe = Client(raise_request_exception=False)
    logging.getLogger("django.request").setLevel(logging.ERROR)  # the probe's 405s are expected
    for pattern in portal_patterns():
        if pattern.name in public or pattern.name.startswith("password_"):
            continue
        if pattern.side == "operator":
            whos = ["cucc-ops"]
        elif pattern.side == "staff":
            whos = ["admin"]
        elif pattern.kwargs:
            whos = ["heavy buyer"]  # the objects named are the heavy buyer's
        else:
            whos = ["demo buyer", "heavy buyer"]
        path = reverse(pattern.name, kwargs=world_kwargs(world, pattern))
        for who in whos:
            probe.force_login(people[who])
            if probe.get(path).status_code == 405:
                break  # a POST endpoint
            pages.append((pattern.name, who, people[who], path))
    return pages


def run(args: argparse.Namespace, database: BenchDatabase) -> int:
    print(f"Cardhour portal benchmark — {machine_description()}")
    print(f"PostgreSQL {database.server_version()} at {database.name}")
    with Timer() as setup:
        django_setup(database_url=database.url, conn_max_age=600)
        from django.conf import settings

        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # Django's test client's host
        seed_demo()
    print(f"demo data loaded ({setup.seconds:.1f} s)")
    with Timer() as heavy_setup:
        world = heavy_buyer(records=args.records)
    from django.db import connection
    from django.test import Client

    from metering.models import UsageRecord

    rated = UsageRecord.objects.filter(buyer=world.buyer).rated().count()
    print(f"heavy buyer: {rated:,} rated usage records in {LEASES} leases ({heavy_setup.seconds:.1f} s)")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")

    anonymous = Client(raise_request_exception=False)
    baselines = [
        measure(
            anonymous,
            "/healthz",
            label="baseline: healthz",
            who="anonymous",
            n=args.requests,
            warmup=args.warmup,
        ),
        measure(
            anonymous,
            "/accounts/login/",
            label="baseline: log-in page",
            who="anonymous",
            n=args.requests,
            warmup=args.warmup,
        ),
    ]
    timings = []
    for name, who, user, path in pages_to_measure(world):
        client = Client(raise_request_exception=False)
        client.force_login(user)
        timings.append(measure(client, path, label=name, who=who, n=args.requests, warmup=args.warmup))

    base = baselines[1].p50
    rows = []
    for t in [*baselines, *timings]:
        verdict = "" if t.label.startswith("baseline") else ("PASS" if t.p95 * 1000 < TARGET_MS else "MISS")
        if not t.ok:
            verdict = f"HTTP {t.status}"
        rows.append(
            [
                t.label,
                t.who,
                ms(t.p50, 1),
                ms(t.p95, 1),
                ms(t.max, 1),
                ms(t.cpu_p50, 1),
                f"{t.p50 / base:.1f}×",
                t.queries,
                verdict,
            ]
        )
    print_table(
        f"Server time per page ({args.requests} requests after {args.warmup} warm-up; target p95 < "
        f"{TARGET_MS:.0f} ms; cpu = this process's CPU per request, p50, without PostgreSQL's; × = p50 "
        "against the log-in page's)",
        ["page", "as", "p50 ms", "p95 ms", "max ms", "cpu ms", "× login", "queries", ""],
        rows,
        left_columns=2,
    )
    misses = [t for t in timings if t.ok and t.p95 * 1000 >= TARGET_MS]
    errors = [t for t in timings if not t.ok]
    print(
        f"\n{len(timings)} page measurements: {len(timings) - len(misses) - len(errors)} PASS, "
        f"{len(misses)} MISS, {len(errors)} errors"
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
