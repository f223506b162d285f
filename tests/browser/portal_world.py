"""One small portal world with an object of every kind a portal URL can name, and every portal URL built
from it. Shared by the permission sweep (tests/portal/test_permissions.py) and the screenshots
(tests/browser/test_screenshots.py), so both follow new pages without being edited.

Organisation A is the buyer ``acme`` (owner alice) and the operator ``ctyun`` (owner olga), who ran one of
acme's leases last month; B is the buyer ``globex`` (bob) and the operator ``cucc`` (oscar). Staff: sam.

Everything goes through the real services: packs credited by ``pack_issue``, a job quoted by the matcher,
a lease accepted from a quote, started, reported and stopped through the operator's services, its usage
rated, and last month closed (invoice and settlement).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from decimal import Decimal
from typing import Any, cast

from django.contrib.auth.models import User
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from core.models import Membership, Organisation
from core.types import Actor
from federation.models import Cluster
from tests.factories import BuyerFactory, MembershipFactory, OperatorFactory, UserFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

PASSWORD = "portal-pass-2026"
A800 = "nvidia-a800-sxm4-80gb"

# URL prefixes that are not portal pages.
# Probes and the metrics scrape are for machines, not pages (tests/core/test_observability.py).
SKIPPED_PREFIXES = ("api/", "admin/", "static/", "healthz", "livez", "readyz", "metrics", "__debug__")


@dataclass
class PortalWorld:
    """The objects and people of the world; ``kwargs`` maps a URL keyword to A's value for it."""

    buyer: Organisation
    other_buyer: Organisation
    operator: Organisation
    other_operator: Organisation
    cluster: Cluster
    other_cluster: Cluster
    users: dict[str, User]
    objects: dict[str, Any]
    # Strings that identify A's objects and must never appear on a page B (or an operator) can see.
    buyer_secrets: list[str] = field(default_factory=list)
    operator_secrets: list[str] = field(default_factory=list)
    # The operator's own account pages (team, tokens: the same URLs as a buyer's) must not show these to
    # anyone outside the operator.
    operator_account_secrets: list[str] = field(default_factory=list)


def organisation(slug: str, name: str, *, operator: bool = False) -> Organisation:
    """A buyer (or an operator) organisation, made once per slug."""
    factory = OperatorFactory if operator else BuyerFactory
    return cast(Organisation, factory(slug=slug, name=name))


def _person(username: str, organisation: Organisation | None, role: str = "owner") -> User:
    user = cast(User, UserFactory(username=username, email=f"{username}@example.com"))
    user.set_password(PASSWORD)
    user.save()
    if organisation is not None:
        MembershipFactory(user=user, organisation=organisation, role=role)
    return user


def last_month_day(now: datetime) -> datetime:
    """Local (Asia/Shanghai) midnight of the last day of the month before ``now``: inside the 35-day late
    window whatever today is, and in a month that can be closed."""
    zone = timezone.get_default_timezone()
    first = now.astimezone(zone).date().replace(day=1)
    return datetime.combine(first - timedelta(days=1), time(), tzinfo=zone)


def build_world() -> PortalWorld:
    """Create the world (needs the database; reference data and presets already loaded)."""
    from broker.services.dispatch import LeaseUsageInput, lease_start, lease_stop, lease_usage_report
    from broker.services.leases import lease_accept
    from broker.services.quotes import quote_create
    from core.services import api_token_create
    from metering.models import Invoice, PackOrder, Settlement
    from metering.services.billing import billing_close_period
    from metering.services.rating import usage_rate_pending
    from metering.services.tariffs import tariff_create, tariff_presets_install
    from metering.tariffs import TariffSpec, WindowSpec
    from tests.broker.factories import make_job

    tariff_presets_install()
    now = timezone.now().replace(microsecond=0)
    buyer = organisation("acme", "Acme Quantum Secret Labs")
    other_buyer = organisation("globex", "Globex Compute")
    operator = organisation("ctyun", "China Telecom Cloud", operator=True)
    other_operator = organisation("cucc", "China Unicom", operator=True)
    users = {
        "alice": _person("alice", buyer),
        "vera": _person("vera", buyer, role=Membership.Role.VIEWER),
        "bob": _person("bob", other_buyer),
        "olga": _person("olga", operator),
        "oscar": _person("oscar", other_operator),
        "sam": _person("sam", None),
    }
    users["sam"].is_staff = True
    users["sam"].save()

    cluster = make_cluster(
        operator=operator, hub="yrd", name="sh-ai01", islands=[("isl-01", 8), ("isl-02", 8)], site="Shanghai"
    )
    # ctyun promises 99.5 % availability, crediting 10 % of a lease's charge below it, 25 % below 99 %.
    from metering.models import Tariff
    from metering.services.tariffs import price_card_set

    price_card_set(
        cluster=cluster,
        rate_per_card_hour=Decimal("12.0000"),
        tariff=Tariff.objects.get(owner__isnull=True, code="cn-gd"),
        sla_availability_percent=Decimal("99.5"),
        sla_credit_schedule=[
            {"below_percent": "99.5", "credit_percent": "10"},
            {"below_percent": "99", "credit_percent": "25"},
        ],
        actor=Actor(organisation=operator, system_label="test"),
    )
    other_cluster = make_cluster(operator=other_operator, hub="nx", name="zw-ai01", islands=[("isl-01", 32)])
    make_price_card(cluster=other_cluster, rate="9.0000", tariff_code="cn-nx")

    # A private tariff of ctyun's (not on a price card, so no public page names it).
    tariff = tariff_create(
        owner=operator,
        code="ctyun-night",
        name="Ctyun Secret Night Tariff",
        time_zone="Asia/Shanghai",
        source="portal world",
        spec=TariffSpec(
            time_zone="Asia/Shanghai",
            multipliers={"valley": Decimal("0.5"), "flat": Decimal("1")},
            windows=(WindowSpec("valley", 0, 8 * 60), WindowSpec("flat", 8 * 60, 24 * 60)),
        ),
        effective_from=None,
        actor=Actor(organisation=operator, system_label="portal world"),
    )
    other_tariff = tariff_create(
        owner=other_operator,
        code="cucc-flat",
        name="Cucc Flat Tariff",
        time_zone="Asia/Shanghai",
        source="portal world",
        spec=TariffSpec(
            time_zone="Asia/Shanghai",
            multipliers={"flat": Decimal("1")},
            windows=(WindowSpec("flat", 0, 24 * 60),),
        ),
        effective_from=None,
        actor=Actor(organisation=other_operator, system_label="portal world"),
    )

    # Last month: packs paid, a lease run 07:00–11:00 local (valley, flat and peak on cn-gd), rated, closed.
    day = last_month_day(now)
    start, end = day + timedelta(hours=7), day + timedelta(hours=11)
    pack = make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=1000, price="9000.00", paid_at=day - timedelta(days=3)
    )
    make_paid_pack(buyer=buyer, card_hours=500, price="6000.00", paid_at=day - timedelta(days=3), key="std")
    make_paid_pack(buyer=other_buyer, accelerator=A800, card_hours=100, price="900.00", key="globex")
    ran = make_job(
        buyer=buyer,
        name="acme-secret-training-run",
        earliest_start_at=start,
        deadline_at=start + timedelta(hours=8),
        duration_seconds=4 * 3600,
    )
    from tests.broker.factories import make_lease

    lease = make_lease(job=ran, cluster=cluster, start_at=start, end_at=end)
    operator_actor = Actor(organisation=operator, system_label="portal world agent")
    lease_start(operator=operator, lease_id=lease.pk, actor=operator_actor, at=start)
    lease_usage_report(
        operator=operator,
        records=[
            LeaseUsageInput(
                lease_id=lease.pk,
                idempotency_key=f"world:{lease.pk}:{h}",
                start_at=start + timedelta(hours=h),
                end_at=start + timedelta(hours=h + 1),
                cards=8,
            )
            for h in range(4)
        ],
        actor=operator_actor,
        now=now,
    )
    lease_stop(operator=operator, lease_id=lease.pk, actor=operator_actor, at=end)
    usage_rate_pending(now=now)
    billing_close_period(period_start=day.date().replace(day=1), now=now)
    invoice = Invoice.objects.get(buyer=buyer)
    settlement = Settlement.objects.get(operator=operator)
    # An SLA credit note on that lease, as the assessment would issue it had 6 of its 240 minutes been lost
    # (97.5 %: below 99 %, 25 % of the charge back).
    from metering.services.sla import sla_credit_issue

    sla_credit = sla_credit_issue(
        lease_id=lease.pk,
        reference=lease.reference,
        buyer_id=buyer.pk,
        operator_id=operator.pk,
        cluster_id=cluster.pk,
        price_card_id=lease.price_card_id,
        window_start_at=start,
        window_end_at=end,
        window_seconds=4 * 3600,
        lost_seconds=360,
        excluded_buyer_seconds=0,
        excluded_maintenance_seconds=0,
        availability_percent=Decimal("97.500"),
        intervals={
            "lost": [
                [
                    (start + timedelta(hours=2)).isoformat(),
                    (start + timedelta(hours=2, minutes=6)).isoformat(),
                ]
            ]
        },
        now=now,
    )
    assert sla_credit is not None

    # This month: a job with live quotes (and a lease accepted from one of them).
    quoted = make_job(buyer=buyer, name="acme-secret-finetune", accelerators=[A800], cards=8)
    quotes = list(quote_create(job=quoted).quotes)
    assert quotes, "the matcher found no placement for the quoted job"
    pending = make_job(buyer=buyer, name="acme-secret-pending-job", accelerators=[A800], cards=8)
    pending_quotes = list(quote_create(job=pending).quotes)
    live_lease, _ = lease_accept(
        quote=pending_quotes[0], actor=Actor(organisation=buyer, user=users["alice"], can_write=True)
    )

    token, _secret = api_token_create(organisation=buyer, name="acme-secret-ci-token")
    from core.services import invitation_create

    invitation, invitation_token = invitation_create(
        actor=Actor(organisation=buyer, user=users["alice"], can_write=True),
        email="invitee-secret@example.com",
        role=Membership.Role.MEMBER,
    )
    operator_token, _ = api_token_create(organisation=operator, name="ctyun-secret-agent-token")
    member = Membership.objects.get(user=users["vera"], organisation=buyer)
    order = PackOrder.objects.get(pk=pack.order_id)

    objects: dict[str, Any] = {
        "job": ran,
        "quoted_job": quoted,
        "quote": quotes[0],
        "lease": lease,
        "live_lease": live_lease,
        "invoice": invoice,
        "settlement": settlement,
        "sla_credit": sla_credit,
        "pack": pack,
        "pack_order": order,
        "tariff": tariff,
        "other_tariff": other_tariff,
        "price_card": cluster.price_cards.order_by("-version").first(),
        "token": token,
        "operator_token": operator_token,
        "membership": member,
        "invitation": invitation,
        "invitation_token": invitation_token,
        "period": day.date().replace(day=1),
    }
    return PortalWorld(
        buyer=buyer,
        other_buyer=other_buyer,
        operator=operator,
        other_operator=other_operator,
        cluster=cluster,
        other_cluster=other_cluster,
        users=users,
        objects=objects,
        buyer_secrets=[
            buyer.name,
            ran.name,
            quoted.name,
            pending.name,
            invoice.number,
            token.name,
            "vera@example.com",
            invitation.email,
        ],
        operator_secrets=[tariff.name, settlement.number],
        operator_account_secrets=[operator_token.name],
    )


# --- The URLs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PortalPattern:
    """One URL pattern of the portal: its name, its route as written, and its keyword arguments."""

    name: str
    route: str
    kwargs: tuple[str, ...]

    @property
    def side(self) -> str:
        """Whose page it is, by the naming rule of the portal: ``operator-…``, ``staff-…``, else a buyer's
        (account pages such as the team and tokens are opened as the buyer's owner)."""
        if self.name.startswith("operator-"):
            return "operator"
        if self.name.startswith("staff-"):
            return "staff"
        return "buyer"


def _walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, route)
        elif isinstance(entry, URLPattern):
            yield route, entry


def portal_patterns() -> list[PortalPattern]:
    """Every named URL pattern of the site outside the API, the admin, static files and health checks."""
    found: dict[str, PortalPattern] = {}
    for route, entry in _walk(list(get_resolver().url_patterns)):
        if route.startswith(SKIPPED_PREFIXES) or not entry.name:
            continue
        if entry.name in {"api-schema", "api-docs"}:
            continue
        regex = entry.pattern.regex
        kwargs = tuple(sorted(regex.groupindex))
        found.setdefault(entry.name, PortalPattern(name=entry.name, route=route, kwargs=kwargs))
    return sorted(found.values(), key=lambda p: p.name)


class UnknownKwargError(AssertionError):
    pass


def world_kwargs(world: PortalWorld, pattern: PortalPattern) -> dict[str, Any]:
    """A's value for each keyword of ``pattern``. A keyword the sweep does not know raises
    UnknownKwargError: a new page's object must be added here before the page can land."""
    o = world.objects
    by_name: dict[str, Any] = {
        "job_id": o["job"].pk,
        "quote_id": o["quote"].pk,
        "lease_id": o["lease"].pk,
        "invoice_id": o["invoice"].pk,
        "number": o["invoice"].number,
        "invoice_number": o["invoice"].number,
        "settlement_id": o["settlement"].pk,
        "settlement_number": o["settlement"].number,
        "order_id": o["pack_order"].pk,
        "pack_order_id": o["pack_order"].pk,
        "pack_id": o["pack"].pk,
        "tariff_id": o["tariff"].pk,
        "tariff_code": o["tariff"].code,
        "code": o["tariff"].code,
        "cluster_id": world.cluster.pk,
        "cpi": world.cluster.cpi,
        "token_id": o["token"].pk,
        "membership_id": o["membership"].pk,
        "member_id": o["membership"].pk,
        "invitation_id": o["invitation"].pk,
        "period": o["period"].strftime("%Y-%m"),
        "year": o["period"].year,
        "month": o["period"].month,
        "price_card_id": o["price_card"].pk,
        "credit_id": o["sla_credit"].pk,
    }
    # ``pk`` (and ``id``) mean the object the page is about, read from its name (after any side prefix).
    operator_side = pattern.side == "operator"
    subject_of = [
        ("quote", o["quote"].pk),
        ("job", o["job"].pk),
        ("lease", o["lease"].pk),
        ("invoice", o["invoice"].pk),
        ("settlement", o["settlement"].pk),
        ("pack-order", o["pack_order"].pk),
        ("order", o["pack_order"].pk),
        ("pack", o["pack"].pk),
        ("tariff", o["tariff"].pk),
        ("price-card", o["price_card"].pk),
        ("cluster", world.cluster.pk),
        ("token", (o["operator_token"] if operator_side else o["token"]).pk),
        ("team-invitation", o["invitation"].pk),
        ("invitation", o["invitation"].pk),
        ("team-member", o["membership"].pk),
        ("member", o["membership"].pk),
    ]
    if operator_side:
        by_name["token_id"] = o["operator_token"].pk
    bare = pattern.name.removeprefix("operator-").removeprefix("staff-")
    values: dict[str, Any] = {}
    for kwarg in pattern.kwargs:
        if kwarg in ("pk", "id"):
            subject = next((value for prefix, value in subject_of if bare.startswith(prefix)), None)
            if subject is None:
                raise UnknownKwargError(
                    f"{pattern.name} ({pattern.route}): the sweep does not know which object `{kwarg}` "
                    "names; add it to tests/browser/portal_world.py world_kwargs"
                )
            values[kwarg] = subject
        elif kwarg in by_name:
            values[kwarg] = by_name[kwarg]
        else:
            raise UnknownKwargError(
                f"{pattern.name} ({pattern.route}): unknown URL keyword `{kwarg}`; add A's value for it to "
                "tests/browser/portal_world.py world_kwargs"
            )
    return values
