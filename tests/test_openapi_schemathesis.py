"""The whole OpenAPI document, checked against the running API (issue #2, "REST API rules").

Everything runs in-process against ``config.wsgi.application``, with the schema the app itself serves at
``/api/schema/``, as operator ``cucc`` with a read-write token and these seeded objects: the cluster
``cpi:cucc:nx:zw-ai01`` with island ``isl-01`` (one heartbeat), another operator's cluster
``cpi:cmcc:nx:zw-ai02`` (no heartbeat, no endpoint), a spare token, another operator's token, and a
platform organisation's token. Metering: cucc's own tariff ``own`` next to the presets, a price card on
each cluster, and a closed March 2026 — buyer ``acme`` (with a token and a paid pack) used cucc's cluster
and buyer ``beta`` cmcc's, so each buyer has an invoice and a pack order and each operator a settlement.

* ``test_api_conforms_to_schema``: schemathesis generates requests for every operation (examples,
  coverage and fuzzing phases; positive and negative data). Fuzzed path parameters name a seeded
  object, or are hostile (NUL bytes, slashes, very long, out of range), or stay random; coverage-phase
  cases that vary a query parameter or body field are aimed at the seeded objects, so the generated
  data reaches the code behind the 404. Each example runs in a savepoint that is rolled back, so every
  example sees the same seeded state and a failure replays. Platform-only operations use the platform
  token, buyer-only ones (invoices, pack orders, packs) acme's; Stripe is a closed loopback port, so an
  order that reaches it answers the documented 502.
* ``test_operation_with_real_objects``: hand-written requests, every operation at least once, through
  the same checks plus an expected status, so the happy paths are covered on every run and not only
  when the fuzzer is lucky. The one that pays starts localstripe (tests/metering/localstripe.py).

Checks: no 5xx, every status code documented, every content type documented, every body and header as
documented, and in the fuzzing test ``negative_data_rejection`` and ``positive_data_acceptance`` (configured
in ``CONFIG``, the way schemathesis documents it: ``checks.<name>.expected-statuses``, per operation under
``operations`` with ``include-operation-id``).

The schema declares the server's constraints, so schema-valid data is accepted and schema-violating data
refused: the identifier grammar as ``pattern`` on every CPI, segment and hub (federation.api.schema), the
no-NUL rule on free text (core.api.schema.text_without_nul), a character other than whitespace in text a
field strips and refuses blank (core.api.schema.NOT_BLANK_PATTERN), decimals that need a digit and carry no sign
where the field takes nothing below zero, ``minItems``/``maxItems`` on nested lists, bounds on paging,
cursors, waits and number filters, no empty filter values, the strip's date range, and JSON bodies whose
values have the declared JSON types (core.api.strict: ``"8"`` for an integer is refused, not converted).

**Schema-violating data** (``negative_data_rejection``) must be refused with 400, 401, 403, 404, 405, 406,
413 or 415 — never a 2xx, never a 409 or a 5xx. A case negative only in the Authorization header or the path
(and perhaps the query) is not checked, because this harness sends the seeded token and aims path
parameters at seeded or hostile objects, so what reaches the server is no longer the negative value.

**Schema-valid data** (``positive_data_acceptance``) must get a 2xx, or 404 (a well-formed id or CPI that
names no object of the caller's, or a page past the last). No 401 (the token is valid) and no 5xx. On top
of that, only where the schema cannot say what the server checks:

* 400 — ``clusters_register``/``clusters_update``: the SSRF guard (``endpoint_url_forbidden``: the host must
  not resolve to a private address) and Django's URL rules (63-character labels) on ``endpoint_url``, and the
  cluster's total cards (``cluster_too_large``, a sum over islands); ``clusters_heartbeat``: ``sent_at``
  against the server's clock (the allowed skew); ``clusters_heartbeat_batch``: a cluster named twice in one
  batch (``duplicate_cluster``: the schema cannot say that items differ in one field); ``islands_add``: the same total;
  ``price_cards_create``: ``effective_from`` in the past (and the SLA schedule's rules across tiers);
  ``clusters_maintenance_announce``: a window against the server's clock (in the future, at most 7 days);
  ``fleet_imports_create``: the CSV's content;
  ``hub_latencies_measure``: ``measured_at`` ahead of the server's clock or before 2000; ``jobs_create``:
  the job's rules across fields and against the clock and the catalog (``job_invalid``);
  ``operator_leases_start``/``_stop``: times against the lease's window (``lease_time_invalid``);
  ``operator_usage_create``: records against their leases (``lease_usage_invalid``); ``pack_orders_create``:
  a product not on sale (catalog membership, ``unknown_pack_product``); ``tariffs_create`` and
  ``tariff_versions_create``: a schedule's rules (windows tiling the week, multipliers from 0.0001).
* 403 — ``clusters_register``: a CPI under another operator's segment (``identifier_operator_mismatch``);
  ``tariff_versions_create``: a platform preset is read-only (``tariff_read_only``); ``tokens_create``: a
  token cannot grant the right to manage tokens (``scope_not_grantable``).
* 409 — a conflict with stored state: an identifier, island name or tariff code taken, a lease in another
  state, an idempotency key reused with another body (``clusters_register``, ``islands_add``,
  ``operator_leases_start``/``_stop``, ``operator_usage_create``, ``pack_orders_create``, ``tariffs_create``,
  ``tariff_versions_create``).

Generated data holds no NUL (``generation.allow-x00 = false``): OpenAPI 3.0 cannot constrain property
names, so an additional property could otherwise be named with one, which the parser refuses; NUL in values
is excluded by the schema and tested in tests/core/test_hostile_input.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import unquote
from zoneinfo import ZoneInfo

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.parameters import ParameterLocation

from broker.budgets.models import Budget
from broker.models import Job, Lease, Quote
from broker.services.leases import lease_lock, lease_transition
from broker.services.quotes import quote_create
from config.wsgi import application
from core.models import ApiToken, Organisation
from core.services import api_token_create
from core.types import Actor
from federation import services as federation_services
from federation.models import Cluster
from federation.types import IslandReport
from metering.models import Invoice, PackOrder, PackProduct, Settlement, SlaCredit, Tariff
from metering.services.billing import billing_close_period
from metering.services.rating import usage_rate_pending
from metering.services.sla import sla_credit_issue
from metering.services.tariffs import tariff_create
from metering.services.usage import usage_record_create_batch
from metering.tariffs import PRESETS
from metering.types import UsageRecordInput
from tests.broker.factories import make_job, make_lease
from tests.factories import BuyerFactory, OperatorFactory, OrganisationFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card
from tests.metering.localstripe import (  # noqa: F401  # fixtures, asked for by name
    localstripe_fixture,
    stripe_on_localstripe_fixture,
    stripe_webhooks_fixture,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]

CPI = "cpi:cucc:nx:zw-ai01"
ISLAND = "isl-01"
OTHER_CPI = "cpi:cmcc:nx:zw-ai02"
ACCELERATOR = "nvidia-a800-sxm4-80gb"
UNKNOWN_SPEC_ACCELERATOR = "biren-br104"  # no published FP16 figure: nulls in its output

# Path values that have broken APIs like this one: NUL (PostgreSQL rejects it in text), a slash (routes
# elsewhere), a trailing newline ($ in a regex), a very long value, case and non-ASCII variants.
HOSTILE_STRINGS = ["\x00", f"{CPI}\x00", f"{CPI}\n", "a/b", "x" * 300, CPI.upper(), "集群-01"]
HOSTILE_INTEGERS = [0, -1, 2**31, 2**63]

PLATFORM_ONLY = {"hub_latencies_measure"}
# The seeded SLA credit note's lease id (metering names a lease by id only) and cucc's credit schedule.
SLA_LEASE_ID = 990_001
SLA_SCHEDULE = [
    {"below_percent": "99.5", "credit_percent": "10"},
    {"below_percent": "95", "credit_percent": "25"},
]
# Buyer-only operations: fuzzed with the buyer's token, so their inputs get past the 403 (the operator's
# 403 is a hand-written scenario).
BUYER_ONLY = {
    "invoices_list",
    "invoices_get",
    "invoices_csv",
    "invoices_pdf",
    "invoices_fapiao",
    "invoices_fapiao_csv",
    "pack_orders_list",
    "pack_orders_create",  # Stripe is a closed loopback port here: an order that gets that far is a 502
    "pack_orders_get",
    "packs_list",
    "jobs_list",
    "jobs_create",
    "jobs_get",
    "jobs_cancel",
    "jobs_quotes_create",
    "quotes_accept",
    "leases_list",
    "leases_get",
    "leases_cancel",
    "notices_list",
    "budgets_list",
    "budgets_create",
    "budgets_get",
    "budgets_update",
    "budgets_delete",
    "budget_alerts_list",
    "buyer_endpoint_get",
    "buyer_endpoint_set",
    "buyer_endpoint_secret_rotate",
    "buyer_endpoint_secret_delete",
}

# Billing: March 2026 in Asia/Shanghai, used, rated and closed with the clock pinned.
SHANGHAI = ZoneInfo("Asia/Shanghai")
MARCH = date(2026, 3, 1)

# 25 keeps the file around half a minute on two cores (SQLite or PostgreSQL); raise it for a deeper run.
MAX_EXAMPLES = int(os.environ.get("CARDHOUR_SCHEMATHESIS_MAX_EXAMPLES", "25"))

# Statuses that count as the server accepting schema-valid data (positive_data_acceptance) and refusing
# schema-violating data (negative_data_rejection); the module docstring says why each is there.
POSITIVE_ACCEPTED = ["2xx", "404"]
POSITIVE_ACCEPTED_BY_OPERATION: dict[str, list[str]] = {
    "clusters_register": ["400", "403", "409"],
    "clusters_update": ["400"],
    "clusters_heartbeat": ["400"],
    "clusters_heartbeat_batch": ["400"],
    "islands_add": ["400", "409"],
    "price_cards_create": ["400"],
    "clusters_maintenance_announce": ["400"],
    "fleet_imports_create": ["400"],
    "hub_latencies_measure": ["400"],
    "jobs_create": ["400"],
    "operator_leases_start": ["400", "409"],
    "operator_leases_stop": ["400", "409"],
    "operator_usage_create": ["400", "409"],
    "pack_orders_create": ["400", "409"],
    "tariffs_create": ["400", "409"],
    "tariff_versions_create": ["400", "403", "409"],
    "tokens_create": ["403"],
    # A budget's target (a member, a token, a job of the caller's), one budget per target, and a soft amount
    # or a cap (budget_invalid); the alert endpoint's SSRF guard (endpoint_url_forbidden).
    "budgets_create": ["400"],
    "budgets_update": ["400"],
    "buyer_endpoint_set": ["400"],
}
NEGATIVE_REJECTED = ["400", "401", "403", "404", "405", "406", "413", "415"]

CONFIG = schemathesis.Config.from_dict(
    {
        # OpenAPI 3.0 cannot constrain property names (no propertyNames), so generated additional
        # properties could be named with a NUL the parser refuses (invalid_text); every string value's
        # schema already excludes NUL (core.api.schema.text_without_nul).
        "generation": {"allow-x00": False},
        "checks": {
            "positive_data_acceptance": {"expected-statuses": POSITIVE_ACCEPTED},
            "negative_data_rejection": {"expected-statuses": NEGATIVE_REJECTED},
        },
        "operations": [
            {
                "include-operation-id": operation_id,
                "checks": {
                    "positive_data_acceptance": {"expected-statuses": [*POSITIVE_ACCEPTED, *statuses]}
                },
            }
            for operation_id, statuses in POSITIVE_ACCEPTED_BY_OPERATION.items()
        ],
    }
)

schema = schemathesis.openapi.from_wsgi("/api/schema/", application, config=CONFIG)


@dataclass
class World:
    """The seeded objects and the credentials the requests use."""

    secret: str
    spare_token: ApiToken
    other_token: ApiToken
    platform_secret: str
    buyer_secret: str  # acme's
    preset_tariff_id: int  # cn-gd
    own_tariff_id: int  # cucc's "own"
    invoice: Invoice  # acme's
    other_invoice: Invoice  # beta's
    settlement: Settlement  # cucc's
    other_settlement: Settlement  # cmcc's
    order: PackOrder  # acme's, paid
    other_order: PackOrder  # beta's, paid
    job: Job  # acme's, open, with a live quote
    quote: Quote  # acme's, live
    other_job: Job  # beta's
    lease: Lease  # acme's, reserved on cucc's cluster
    other_lease: Lease  # beta's, reserved on cmcc's cluster
    running_lease: Lease  # acme's on cucc's cluster, started an hour ago
    soon_lease: Lease  # acme's on cucc's cluster, reserved, starting in a minute
    budget: Budget  # acme's organisation budget (soft amount only)
    other_budget: Budget  # beta's
    sla_credit: SlaCredit  # on acme's March usage of cucc's cluster: acme's and cucc's

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}

    def platform_auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.platform_secret}"}

    def buyer_auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.buyer_secret}"}

    def auth_as(self, organisation: str) -> dict[str, str]:
        """The token of a seeded organisation, by slug."""
        secrets = {"cucc": self.secret, "cardhour": self.platform_secret, "acme": self.buyer_secret}
        return {"Authorization": f"Bearer {secrets[organisation]}"}

    def auth_for(self, case: schemathesis.Case) -> dict[str, str]:
        """The operator's token, except for platform-only and buyer-only operations, whose inputs would
        otherwise never get past the 403 (the operator's 403 there is a hand-written scenario)."""
        operation_id = case.operation.definition.raw.get("operationId")
        if operation_id in PLATFORM_ONLY:
            return self.platform_auth()
        if operation_id in BUYER_ONLY:
            return self.buyer_auth()
        return self.auth()

    def real_path_parameters(self) -> dict[str, list[Any]]:
        """Values of each path parameter that name seeded objects: own, another operator's, catalog."""
        return {
            "cpi": [CPI, OTHER_CPI],
            "name": [ISLAND, "isl-02"],
            "slug": [ACCELERATOR, UNKNOWN_SPEC_ACCELERATOR],
            "identifier": [
                "cpi:cucc",
                "cpi:cucc:nx",
                CPI,
                f"{CPI}:{ISLAND}",
                OTHER_CPI,
                f"{OTHER_CPI}:isl-01",
            ],
            "token_id": [self.spare_token.pk, self.other_token.pk],
            "tariff_id": [self.preset_tariff_id, self.own_tariff_id],
            "invoice_id": [self.invoice.pk, self.other_invoice.pk],
            "settlement_id": [self.settlement.pk, self.other_settlement.pk],
            "order_id": [self.order.pk, self.other_order.pk],
            "job_id": [self.job.pk, self.other_job.pk],
            "quote_id": [self.quote.pk],
            "lease_id": [self.lease.pk, self.other_lease.pk],
            "budget_id": [self.budget.pk, self.other_budget.pk],
            "credit_id": [self.sla_credit.pk, self.sla_credit.pk + 1000],
        }


_world: World | None = None  # for the schemathesis hook, which cannot ask for fixtures


@pytest.fixture
def in_process_requests(db: None) -> Iterator[None]:
    """The real WSGI handler closes the database connection when a request starts and ends
    (CONN_MAX_AGE=0), which would end the test's transaction on PostgreSQL; keep it open, as
    django.test.Client does."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def world(in_process_requests: None) -> Iterator[World]:
    global _world
    operator = OperatorFactory(slug="cucc", name="China Unicom")
    other_operator = OperatorFactory(slug="cmcc", name="China Mobile")
    platform = OrganisationFactory(slug="cardhour", name="Cardhour", is_platform=True)
    cluster = make_cluster(operator=operator, islands=[(ISLAND, 64)])
    other_cluster = make_cluster(
        operator=other_operator, name="zw-ai02", islands=[("isl-01", 8)], endpoint_url=""
    )
    federation_services.heartbeat_record(
        actor=Actor(organisation=operator, system_label="test"),
        cluster=cluster,
        sent_at=timezone.now() - timedelta(seconds=5),
        health="ok",
        islands=[IslandReport(name=ISLAND, available_cards=60, unhealthy_cards=1)],
    )
    _, secret = api_token_create(organisation=operator, name="schemathesis", can_manage_tokens=True)
    spare_token, _ = api_token_create(organisation=operator, name="spare", scope="read_only")
    other_token, _ = api_token_create(organisation=other_operator, name="other")
    _, platform_secret = api_token_create(organisation=platform, name="platform")
    buyer = BuyerFactory(slug="acme", name="Acme AI")
    # acme's token may manage tokens, so it also writes budgets (an owner's or administrator's right).
    _, buyer_secret = api_token_create(organisation=buyer, name="acme", can_manage_tokens=True)
    own_tariff = tariff_create(
        owner=operator,
        code="own",
        name="Own",
        time_zone="Asia/Shanghai",
        source="",
        spec=PRESETS["cn-nx"].spec,
        effective_from=None,
        actor=Actor(organisation=operator, system_label="test"),
    )
    _world = World(
        secret=secret,
        spare_token=spare_token,
        other_token=other_token,
        platform_secret=platform_secret,
        buyer_secret=buyer_secret,
        preset_tariff_id=_preset_id("cn-gd"),
        own_tariff_id=own_tariff.pk,
        **_closed_march(clusters=[cluster, other_cluster], buyer=buyer),
        **_broker_objects(cluster=cluster, other_cluster=other_cluster, buyer=buyer),
        **_budget_objects(buyer=buyer),
    )
    yield _world
    _world = None


def _budget_objects(*, buyer: Organisation) -> dict[str, Any]:
    """acme's organisation budget (a soft amount only, so acceptances are never capped) and beta's."""
    return {
        "budget": Budget.objects.create(
            buyer=buyer, name="acme monthly", soft_amount=Decimal("100000.00"), thresholds=[50, 80, 100]
        ),
        "other_budget": Budget.objects.create(
            buyer=Organisation.objects.get(slug="beta"), name="beta monthly", hard_cap=Decimal("10.00")
        ),
    }


def _preset_id(code: str) -> int:
    return Tariff.objects.get(owner__isnull=True, code=code).pk


def _closed_march(*, clusters: list[Cluster], buyer: Organisation) -> dict[str, Any]:
    """A closed month: acme (with a paid pack) used cucc's cluster and beta (no pack, in arrears) cmcc's
    in March 2026, rated and closed on 1 April (the clock pinned), so each buyer has an invoice and each
    operator a settlement. The clusters' price cards start now: the usage names version 1."""
    own_cluster, other_cluster = clusters
    other_buyer = BuyerFactory(slug="beta", name="Beta Labs")
    acme_pack = make_paid_pack(
        buyer=buyer, accelerator=ACCELERATOR, paid_at=datetime(2026, 3, 2, 9, tzinfo=SHANGHAI)
    )
    now = datetime(2026, 4, 1, 3, tzinfo=SHANGHAI)
    for cluster, buyer_slug in ((own_cluster, buyer.slug), (other_cluster, other_buyer.slug)):
        # cucc promises 99.5 % (an SLA credit note is issued on acme's March usage after the close).
        sla: dict[str, Any] = (
            {"sla_availability_percent": "99.5", "sla_credit_schedule": SLA_SCHEDULE}
            if cluster == own_cluster
            else {}
        )
        make_price_card(cluster=cluster, tariff_code="cn-gd", **sla)
        usage_record_create_batch(
            operator=cluster.operator,
            records=[
                UsageRecordInput(
                    idempotency_key=f"{buyer_slug}-march",
                    cluster=cluster.cpi,
                    buyer=buyer_slug,
                    cards=4,
                    start_at=datetime(2026, 3, 10, 7, 30, tzinfo=SHANGHAI),
                    end_at=datetime(2026, 3, 10, 10, 30, tzinfo=SHANGHAI),
                    price_card_version=1,
                    reference=f"lease:{SLA_LEASE_ID}" if cluster == own_cluster else "",
                )
            ],
            now=now,
        )
    usage_rate_pending(now=now)
    billing_close_period(period_start=MARCH, now=now)
    sla_credit = sla_credit_issue(
        lease_id=SLA_LEASE_ID,
        reference=f"lease:{SLA_LEASE_ID}",
        buyer_id=buyer.pk,
        operator_id=own_cluster.operator_id,
        cluster_id=own_cluster.pk,
        price_card_id=own_cluster.price_cards.get().pk,
        window_start_at=datetime(2026, 3, 10, 7, 30, tzinfo=SHANGHAI),
        window_end_at=datetime(2026, 3, 10, 10, 30, tzinfo=SHANGHAI),
        window_seconds=3 * 3600,
        lost_seconds=600,
        excluded_buyer_seconds=0,
        excluded_maintenance_seconds=0,
        availability_percent=Decimal("94.444"),
        now=now,
    )
    return {
        "sla_credit": sla_credit,
        "order": acme_pack.order,
        "other_order": make_paid_pack(buyer=other_buyer, accelerator=ACCELERATOR).order,  # after the close
        "invoice": Invoice.objects.get(buyer=buyer, period_start=MARCH),
        "other_invoice": Invoice.objects.get(buyer=other_buyer, period_start=MARCH),
        "settlement": Settlement.objects.get(operator=own_cluster.operator, period_start=MARCH),
        "other_settlement": Settlement.objects.get(operator=other_cluster.operator, period_start=MARCH),
    }


def _broker_objects(*, cluster: Cluster, other_cluster: Cluster, buyer: Organisation) -> dict[str, Any]:
    """acme's open job with a live quote, and a reserved lease each for acme (on cucc's cluster) and beta
    (on cmcc's)."""
    other_buyer = Organisation.objects.get(slug="beta")
    job = make_job(buyer=buyer, origin_hub="nx", duration_seconds=3600)
    quote = quote_create(job=job).quotes[0]
    start = timezone.now().replace(microsecond=0) + timedelta(days=2)
    lease = make_lease(job=make_job(buyer=buyer, origin_hub="nx"), cluster=cluster, start_at=start)
    other_job = make_job(buyer=other_buyer, origin_hub="nx")
    other_lease = make_lease(job=other_job, cluster=other_cluster, start_at=start)
    now = timezone.now().replace(microsecond=0)
    running = make_lease(
        job=make_job(buyer=buyer, origin_hub="nx"),
        cluster=cluster,
        start_at=now - timedelta(hours=1),
        end_at=now + timedelta(hours=1),
    )
    with transaction.atomic():
        lease_transition(
            lease=lease_lock(lease_id=running.pk),
            to_state="running",
            actor=Actor.system("test"),
            at=running.start_at,
        )
    soon = make_lease(
        job=make_job(buyer=buyer, origin_hub="nx"), cluster=cluster, start_at=now + timedelta(minutes=1)
    )
    return {
        "job": job,
        "quote": quote,
        "other_job": other_job,
        "lease": lease,
        "other_lease": other_lease,
        "running_lease": running,
        "soon_lease": soon,
    }


def _usage_body(w: World, **overrides: Any) -> dict[str, Any]:
    start = w.running_lease.start_at
    record = {
        "lease": w.running_lease.pk,
        "idempotency_key": "run-1",
        "start_at": start.isoformat(),
        "end_at": (start + timedelta(minutes=30)).isoformat(),
        "cards": 1,
        **overrides,
    }
    return {"records": [record]}


def _job_body(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "fine-tune",
        "cards": 8,
        "accelerators": [ACCELERATOR],
        "origin_hub": "nx",
        "latency_budget_ms": 30,
        "deadline_at": _now_iso(6 * 3600),
        "duration_seconds": 3600,
        **overrides,
    }


@schema.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Fuzzing: each path parameter names a seeded object, or is hostile, or keeps its generated value
    (Hypothesis favours the first alternatives, so the seeded objects come first)."""
    if _world is None or not path_parameters:
        return st.just(path_parameters)
    real = _world.real_path_parameters()

    def choices(name: str, generated: Any) -> st.SearchStrategy[Any]:
        hostile = HOSTILE_INTEGERS if isinstance(generated, int) else HOSTILE_STRINGS
        return st.one_of(
            st.sampled_from(real.get(name, [generated])), st.sampled_from(hostile), st.just(generated)
        )

    return st.fixed_dictionaries({name: choices(name, value) for name, value in path_parameters.items()})


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_api_conforms_to_schema(case: schemathesis.Case, world: World) -> None:
    _aim_coverage_case_at_seeded_objects(case, world)
    # Every example starts from the seeded world: a savepoint rolled back after each call keeps one
    # example's writes (a retired cluster, a revoked token) from turning later examples into 409s and
    # 401s, and lets Hypothesis replay and shrink a failure against the same state.
    with transaction.atomic():
        try:
            case.call_and_validate(headers=world.auth_for(case), checks=_fuzz_checks(case))
        finally:
            transaction.set_rollback(True)


def _fuzz_checks(case: schemathesis.Case) -> list[Any]:
    """Every check, less the data checks where this harness changed what the generator meant: the
    Authorization header is always the seeded token and path parameters are aimed at seeded or hostile
    objects (flatmap_path_parameters), so a case negative only there is no longer negative, and a
    positive case given a hostile path value is no longer positive."""
    meta = case.meta
    if meta is None:
        return CHECKS
    if meta.generation.mode.is_negative:
        negated = {location for location, info in meta.components.items() if info.mode.is_negative}
        replaced = negated & {ParameterLocation.HEADER, ParameterLocation.PATH}
        if replaced and negated - replaced <= {ParameterLocation.QUERY}:
            return CHECKS
        return [*CHECKS, negative_data_rejection]
    if any(_hostile(value) for value in (case.path_parameters or {}).values()):
        return CHECKS
    return [*CHECKS, positive_data_acceptance]


def _hostile(value: Any) -> bool:
    if isinstance(value, str):
        return unquote(value) in HOSTILE_STRINGS
    return value in HOSTILE_INTEGERS


def _aim_coverage_case_at_seeded_objects(case: schemathesis.Case, world: World) -> None:
    """Coverage-phase cases vary one query parameter or body field at a time over a placeholder path
    ("0"), and are built when the test is collected, before anything is seeded. Aim them at the seeded
    objects here, so each variant reaches the code behind the 404; cases that vary a path parameter
    itself keep it."""
    meta = case.meta
    if not case.path_parameters or meta is None or meta.phase.name != "coverage":
        return
    if getattr(meta.phase.data, "parameter_location", None) == "path":
        return
    real = world.real_path_parameters()
    case.path_parameters = {
        name: real[name][0] if name in real else value for name, value in case.path_parameters.items()
    }


# --- Every operation with the seeded objects --------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    operation_id: str
    expected_status: int | None  # None: any status the schema documents, as long as it is not a 5xx
    label: str = ""
    path_parameters: Callable[[World], dict[str, Any]] = lambda w: {}
    query: dict[str, Any] = field(default_factory=dict)
    body: Callable[[World], Any] | None = None
    media_type: str = "application/json"
    as_platform: bool = False
    as_org: str = ""  # the slug of another seeded organisation whose token to use (e.g. the buyer "acme")
    fixtures: tuple[str, ...] = ()  # pytest fixtures the scenario needs (e.g. "stripe_on_localstripe")


def _now_iso(offset_seconds: int = 0) -> str:
    return (timezone.now() + timedelta(seconds=offset_seconds)).isoformat()


def _registration(cpi: str, **changes: Any) -> dict[str, Any]:
    """The body that registered the seeded cluster, with ``cpi`` and ``changes``."""
    body = {
        "cpi": cpi,
        "site": "Zhongwei",
        "accelerator": ACCELERATOR,
        "endpoint_url": "https://agent.example.com/cardhour",
        "islands": [{"name": ISLAND, "cards": 64, "fabric": "infiniband"}],
    }
    return {**body, **changes}


def _latency(source: str, target: str, latency_ms: str = "12.500") -> dict[str, Any]:
    return {"source": source, "target": target, "latency_ms": latency_ms, "measured_at": _now_iso(-60)}


def _tariff_body(**changes: Any) -> dict[str, Any]:
    """A valid new tariff (valley overnight, peak on weekday days, valley on weekend days)."""
    body = {
        "code": "night-owl",
        "name": "Night owl",
        "bands": [{"band": "valley", "multiplier": "0.4000"}, {"band": "peak", "multiplier": "1.6000"}],
        "windows": [
            {"band": "valley", "start": "22:00", "end": "08:00"},
            {
                "band": "peak",
                "start": "08:00",
                "end": "22:00",
                "weekdays": ["mon", "tue", "wed", "thu", "fri"],
            },
            {
                "band": "valley",
                "start": "08:00",
                "end": "22:00",
                "weekdays": ["sat", "sun"],
                "months": list(range(1, 13)),
            },
        ],
    }
    return {**body, **changes}


_SCHEDULE = {
    "bands": [{"band": "flat", "multiplier": "1.0000"}],
    "windows": [{"band": "flat", "start": "00:00", "end": "24:00"}],
}


def _order(**changes: Any) -> dict[str, Any]:
    """An order of the pack the seeded buyers bought (the only product on sale)."""
    return {"product": PackProduct.objects.get().code, "quantity": 1, "idempotency_key": "order-1", **changes}


_FLEET_CSV = "node_name,gpu_model,gpu_capacity_num\nn1,A800-SXM4-80GB,8\nn2,A800-SXM4-80GB,8\nn3,H20,8\n"
_OWN = {"cpi": CPI}
_OTHERS = {"cpi": OTHER_CPI}

SCENARIOS = [
    Scenario("me_get", 200),
    Scenario("hubs_list", 200, "second-page", query={"page_size": 3, "page": 2}),
    Scenario("hubs_list", 404, "past-the-last-page", query={"page": 99}),
    Scenario("hub_latencies_list", 200, "filtered", query={"source": "nx", "origin": "policy"}),
    Scenario(
        "hub_latencies_measure",
        200,
        "platform",
        body=lambda w: {"measurements": [_latency("nx", "gz")]},
        as_platform=True,
    ),
    Scenario(
        "hub_latencies_measure",
        200,
        "operator-from-its-hub",
        body=lambda w: {"measurements": [_latency("nx", "gz")]},
    ),
    Scenario(
        "hub_latencies_measure",
        403,
        "operator-from-another-hub",
        body=lambda w: {"measurements": [_latency("gba", "gz")]},
    ),
    Scenario("accelerators_list", 200, "filtered", query={"vendor": "nvidia", "spec_status": "published"}),
    Scenario("accelerators_get", 200, "published", lambda w: {"slug": ACCELERATOR}),
    Scenario("accelerators_get", 200, "unknown-spec", lambda w: {"slug": UNKNOWN_SPEC_ACCELERATOR}),
    Scenario("accelerators_get", 404, "missing", lambda w: {"slug": "no-such-chip"}),
    Scenario("accelerators_get", None, "not-a-slug", lambda w: {"slug": "集群"}),
    Scenario("standard_cards_list", 200),
    Scenario("resolve", 200, "operator", lambda w: {"identifier": "cpi:cucc"}),
    Scenario("resolve", 200, "hub", lambda w: {"identifier": "cpi:cucc:nx"}, query={"page_size": 1}),
    Scenario("resolve", 200, "cluster", lambda w: {"identifier": CPI}),
    Scenario("resolve", 200, "island", lambda w: {"identifier": f"{CPI}:{ISLAND}"}),
    Scenario("resolve", 200, "others-cluster", lambda w: {"identifier": OTHER_CPI}),
    Scenario("resolve", 200, "others-island", lambda w: {"identifier": f"{OTHER_CPI}:isl-01"}),
    Scenario("resolve", 404, "missing", lambda w: {"identifier": "cpi:cucc:nx:zw-ai99"}),
    Scenario("resolve", 400, "malformed", lambda w: {"identifier": "not-an-identifier"}),
    Scenario(
        "clusters_list", 200, "filtered", query={"hub": "nx", "status": "active", "accelerator": ACCELERATOR}
    ),
    Scenario("clusters_register", 201, "new", body=lambda w: _registration("cpi:cucc:nx:zw-ai03")),
    Scenario("clusters_register", 200, "identical-retry", body=lambda w: _registration(CPI)),
    Scenario("clusters_register", 409, "taken", body=lambda w: _registration(CPI, site="Elsewhere")),
    Scenario("clusters_register", 403, "others-prefix", body=lambda w: _registration("cpi:cmcc:nx:zw-ai09")),
    Scenario(
        "clusters_register", 400, "unknown-hub", body=lambda w: _registration("cpi:cucc:nowhere:zw-ai03")
    ),
    Scenario(
        "clusters_register",
        None,
        "total-beyond-int32",  # 2,200 islands x 1,000,000 cards: inside the documented limits
        body=lambda w: _registration(
            "cpi:cucc:nx:zw-big",
            islands=[{"name": f"i{n}", "cards": 1_000_000, "fabric": "roce"} for n in range(2200)],
        ),
    ),
    Scenario("clusters_get", 200, "own", lambda w: _OWN),
    Scenario("clusters_get", 404, "others", lambda w: _OTHERS),
    Scenario("clusters_get", None, "nul-byte", lambda w: {"cpi": f"{CPI}\x00"}),
    Scenario(
        "clusters_update",
        200,
        "drain",
        lambda w: _OWN,
        body=lambda w: {"site": "Zhongwei B", "status": "draining", "reason": "maintenance"},
    ),
    Scenario("clusters_update", 404, "others", lambda w: _OTHERS, body=lambda w: {"site": "x"}),
    Scenario("clusters_status_history", 200, "own", lambda w: _OWN),
    Scenario("clusters_status_history", 404, "others", lambda w: _OTHERS),
    Scenario("clusters_maintenance_list", 200, "own", lambda w: _OWN),
    Scenario("clusters_maintenance_list", 404, "others", lambda w: _OTHERS),
    Scenario(
        "clusters_maintenance_announce",
        201,
        "ahead",
        lambda w: _OWN,
        body=lambda w: {
            "starts_at": _now_iso(3 * 86400),
            "ends_at": _now_iso(3 * 86400 + 7200),
            "reason": "PDU",
        },
    ),
    Scenario(
        "clusters_maintenance_announce",
        400,
        "past",
        lambda w: _OWN,
        body=lambda w: {"starts_at": _now_iso(-3600), "ends_at": _now_iso(3600), "reason": "PDU"},
    ),
    Scenario(
        "clusters_maintenance_announce",
        404,
        "others",
        lambda w: _OTHERS,
        body=lambda w: {"starts_at": _now_iso(86400), "ends_at": _now_iso(90000), "reason": "PDU"},
    ),
    Scenario(
        "islands_add",
        201,
        "new",
        lambda w: _OWN,
        body=lambda w: {"name": "isl-02", "cards": 16, "fabric": "roce"},
    ),
    Scenario(
        "islands_add",
        409,
        "taken",
        lambda w: _OWN,
        body=lambda w: {"name": ISLAND, "cards": 1, "fabric": "roce"},
    ),
    Scenario(
        "islands_update", 200, "resize", lambda w: {**_OWN, "name": ISLAND}, body=lambda w: {"cards": 96}
    ),
    Scenario(
        "islands_update", 404, "missing", lambda w: {**_OWN, "name": "isl-99"}, body=lambda w: {"cards": 1}
    ),
    Scenario(
        "islands_update",
        None,
        "nul-byte",
        lambda w: {**_OWN, "name": f"{ISLAND}\x00"},
        body=lambda w: {"cards": 1},
    ),
    Scenario(
        "clusters_heartbeat_batch",
        200,
        "applied-and-refused",  # one beat applied, another operator's cluster answered in its place
        body=lambda w: {
            "beats": [
                {
                    "cpi": CPI,
                    "sent_at": _now_iso(),
                    "health": "ok",
                    "islands": [{"name": ISLAND, "available_cards": 10, "unhealthy_cards": 2}],
                },
                {"cpi": OTHER_CPI, "sent_at": _now_iso(), "health": "ok"},
            ]
        },
    ),
    Scenario(
        "clusters_heartbeat_batch",
        400,
        "a-cluster-twice",
        body=lambda w: {"beats": [{"cpi": CPI, "sent_at": _now_iso(), "health": "ok"}] * 2},
    ),
    Scenario(
        "clusters_heartbeat",
        200,
        "applied",
        lambda w: _OWN,
        body=lambda w: {
            "sent_at": _now_iso(),
            "health": "degraded",
            "islands": [{"name": ISLAND, "available_cards": 10, "unhealthy_cards": 2}],
        },
    ),
    Scenario(
        "clusters_heartbeat",
        200,
        "stale",  # older than the one applied: acknowledged with applied=false
        lambda w: _OWN,
        body=lambda w: {"sent_at": _now_iso(-3600), "health": "ok"},
    ),
    Scenario(
        "clusters_heartbeat",
        400,
        "unknown-island",
        lambda w: _OWN,
        body=lambda w: {
            "sent_at": _now_iso(),
            "health": "ok",
            "islands": [{"name": "isl-99", "available_cards": 1}],
        },
    ),
    Scenario(
        "fleet_imports_create",
        200,
        "dry-run",
        query={"hub": "nx", "site": "Zhongwei", "dry_run": "true"},
        body=lambda w: _FLEET_CSV,
        media_type="text/csv",
    ),
    Scenario(
        "fleet_imports_create",
        201,
        "import",
        query={"hub": "nx", "site": "Zhongwei", "cluster_prefix": "fleet"},
        body=lambda w: _FLEET_CSV,
        media_type="text/csv",
    ),
    Scenario(
        "fleet_imports_create",
        400,
        "bad-rows",
        query={"hub": "nx"},
        body=lambda w: "node_name,gpu_model,gpu_capacity_num\nn1,X9,8\nn2,A800-SXM4-80GB,eight\n",
        media_type="text/csv",
    ),
    Scenario("tokens_list", 200),
    Scenario("tokens_create", 201, body=lambda w: {"name": "ci", "scope": "read_only"}),
    Scenario("tokens_revoke", 200, "own", lambda w: {"token_id": w.spare_token.pk}),
    Scenario("tokens_revoke", 404, "others", lambda w: {"token_id": w.other_token.pk}),
    Scenario("tokens_revoke", None, "negative-id", lambda w: {"token_id": -1}),
    # Tariffs and price cards.
    Scenario("tariffs_list", 200),
    Scenario("tariffs_list", 200, "second-page", query={"page_size": 1, "page": 2}),
    Scenario("tariffs_create", 201, "new", body=lambda w: _tariff_body()),
    Scenario(
        "tariffs_create",
        400,
        "gap",  # weekends 08:00-22:00 have no band
        body=lambda w: _tariff_body(windows=_tariff_body()["windows"][:2]),
    ),
    Scenario("tariffs_create", 400, "unknown-zone", body=lambda w: _tariff_body(time_zone="Mars/Olympus")),
    Scenario("tariffs_create", 409, "code-taken", body=lambda w: _tariff_body(code="own")),
    Scenario("tariffs_get", 200, "preset", lambda w: {"tariff_id": w.preset_tariff_id}),
    Scenario("tariffs_get", 200, "own", lambda w: {"tariff_id": w.own_tariff_id}),
    Scenario("tariffs_get", 404, "missing", lambda w: {"tariff_id": 2**31}),
    Scenario(
        "tariff_versions_create",
        201,
        "own",
        lambda w: {"tariff_id": w.own_tariff_id},
        body=lambda w: {**_SCHEDULE, "effective_from": _now_iso(3600)},
    ),
    Scenario(
        "tariff_versions_create",
        403,
        "preset",
        lambda w: {"tariff_id": w.preset_tariff_id},
        body=lambda w: _SCHEDULE,
    ),
    Scenario(
        "tariff_versions_create",
        400,
        "past",
        lambda w: {"tariff_id": w.own_tariff_id},
        body=lambda w: {**_SCHEDULE, "effective_from": "2020-01-01T00:00:00Z"},
    ),
    Scenario(
        "tariffs_strip", 200, "gd-july", lambda w: {"tariff_id": w.preset_tariff_id}, {"date": "2026-07-15"}
    ),
    Scenario(
        "tariffs_strip", 400, "bad-date", lambda w: {"tariff_id": w.preset_tariff_id}, {"date": "2026-02-30"}
    ),
    Scenario("tariffs_strip", 404, "missing", lambda w: {"tariff_id": 2**31}, {"date": "2026-07-15"}),
    Scenario("price_cards_list", 200, "own", lambda w: _OWN),
    Scenario("price_cards_list", 404, "others", lambda w: _OTHERS),
    Scenario(
        "price_cards_create",
        201,
        "preset",
        lambda w: _OWN,
        body=lambda w: {"rate_per_card_hour": "12.5000", "tariff_id": w.preset_tariff_id},
    ),
    Scenario(
        "price_cards_create",
        201,
        "own-tariff-scheduled",
        lambda w: _OWN,
        body=lambda w: {
            "rate_per_card_hour": "9.8000",
            "tariff_id": w.own_tariff_id,
            "effective_from": _now_iso(86400),
        },
    ),
    Scenario(
        "price_cards_create",
        400,
        "past",
        lambda w: _OWN,
        body=lambda w: {
            "rate_per_card_hour": "1.0000",
            "tariff_id": _preset_id("flat"),
            "effective_from": "2020-01-01T00:00:00Z",
        },
    ),
    Scenario(
        "price_cards_create",
        404,
        "others",
        lambda w: _OTHERS,
        body=lambda w: {"rate_per_card_hour": "1.0000", "tariff_id": _preset_id("flat")},
    ),
    # Statements: invoices are acme's (a buyer), settlements cucc's (an operator).
    Scenario("invoices_list", 200, "buyer", as_org="acme"),
    Scenario("invoices_list", 200, "filtered", query={"period_start": "2026-03-01"}, as_org="acme"),
    Scenario("invoices_list", 403, "operator"),
    Scenario("invoices_get", 200, "own", lambda w: {"invoice_id": w.invoice.pk}, as_org="acme"),
    Scenario("invoices_get", 404, "others", lambda w: {"invoice_id": w.other_invoice.pk}, as_org="acme"),
    Scenario("invoices_get", 403, "operator", lambda w: {"invoice_id": w.invoice.pk}),
    Scenario("invoices_csv", 200, "own", lambda w: {"invoice_id": w.invoice.pk}, as_org="acme"),
    Scenario("invoices_csv", 404, "others", lambda w: {"invoice_id": w.other_invoice.pk}, as_org="acme"),
    Scenario("invoices_pdf", 200, "own", lambda w: {"invoice_id": w.invoice.pk}, as_org="acme"),
    Scenario("invoices_pdf", 404, "others", lambda w: {"invoice_id": w.other_invoice.pk}, as_org="acme"),
    Scenario("invoices_fapiao", 200, "own", lambda w: {"invoice_id": w.invoice.pk}, as_org="acme"),
    Scenario("invoices_fapiao", 404, "others", lambda w: {"invoice_id": w.other_invoice.pk}, as_org="acme"),
    Scenario("invoices_fapiao", 403, "operator", lambda w: {"invoice_id": w.invoice.pk}),
    Scenario("invoices_fapiao_csv", 200, "own", lambda w: {"invoice_id": w.invoice.pk}, as_org="acme"),
    Scenario(
        "invoices_fapiao_csv", 404, "others", lambda w: {"invoice_id": w.other_invoice.pk}, as_org="acme"
    ),
    # SLA credit notes: cucc (the operator) and acme (the buyer) are party to the seeded one.
    Scenario("sla_credits_list", 200, "operator"),
    Scenario("sla_credits_list", 200, "buyer", as_org="acme"),
    Scenario("sla_credits_list", 200, "role", query={"role": "operator"}),
    Scenario("sla_credits_list", 400, "bad-role", query={"role": "platform"}),
    Scenario("sla_credits_get", 200, "operator", lambda w: {"credit_id": w.sla_credit.pk}),
    Scenario("sla_credits_get", 200, "buyer", lambda w: {"credit_id": w.sla_credit.pk}, as_org="acme"),
    Scenario("sla_credits_get", 404, "missing", lambda w: {"credit_id": w.sla_credit.pk + 1000}),
    Scenario("settlements_list", 200, "operator"),
    Scenario("settlements_list", 403, "buyer", as_org="acme"),
    Scenario("settlements_get", 200, "own", lambda w: {"settlement_id": w.settlement.pk}),
    Scenario("settlements_get", 404, "others", lambda w: {"settlement_id": w.other_settlement.pk}),
    Scenario("settlements_csv", 200, "own", lambda w: {"settlement_id": w.settlement.pk}),
    Scenario("settlements_csv", 404, "others", lambda w: {"settlement_id": w.other_settlement.pk}),
    Scenario("settlements_pdf", 200, "own", lambda w: {"settlement_id": w.settlement.pk}),
    Scenario("settlements_pdf", 404, "others", lambda w: {"settlement_id": w.other_settlement.pk}),
    # Packs: the catalogue is every member's; orders and packs are a buyer's (acme's).
    Scenario("pack_products_list", 200),
    Scenario(
        "pack_orders_create",
        201,
        "new",
        body=lambda w: _order(),
        as_org="acme",
        fixtures=("stripe_on_localstripe",),
    ),
    Scenario(
        "pack_orders_create",
        409,
        "key-reused",  # the seeded order's key, another quantity
        body=lambda w: _order(quantity=2, idempotency_key=w.order.idempotency_key),
        as_org="acme",
    ),
    Scenario("pack_orders_create", 400, "zero-quantity", body=lambda w: _order(quantity=0), as_org="acme"),
    Scenario(
        "pack_orders_create", 400, "unknown-product", body=lambda w: _order(product="nope"), as_org="acme"
    ),
    Scenario("pack_orders_create", 502, "stripe-unreachable", body=lambda w: _order(), as_org="acme"),
    Scenario("pack_orders_create", 403, "operator", body=lambda w: _order()),
    Scenario("pack_orders_list", 200, "buyer", as_org="acme"),
    Scenario("pack_orders_list", 200, "filtered", query={"status": "paid"}, as_org="acme"),
    Scenario("pack_orders_list", 403, "operator"),
    Scenario("pack_orders_get", 200, "own", lambda w: {"order_id": w.order.pk}, as_org="acme"),
    Scenario("pack_orders_get", 404, "others", lambda w: {"order_id": w.other_order.pk}, as_org="acme"),
    Scenario("pack_orders_get", 403, "operator", lambda w: {"order_id": w.order.pk}),
    Scenario("packs_list", 200, "buyer", as_org="acme"),
    Scenario("packs_list", 200, "filtered", query={"status": "active"}, as_org="acme"),
    Scenario("packs_list", 403, "operator"),
    # Broker, buyers' side: acme's job, quote and lease; beta's are someone else's.
    Scenario("jobs_list", 200, "buyer", as_org="acme"),
    Scenario("jobs_list", 200, "filtered", query={"state": "open"}, as_org="acme"),
    Scenario("jobs_list", 403, "operator"),
    Scenario("jobs_create", 201, "new", body=lambda w: _job_body(), as_org="acme"),
    Scenario(
        "jobs_create",
        201,
        "standard-cards",
        body=lambda w: _job_body(
            cards=None,
            standard_cards="6.5",
            accelerators=[],
            gang="cluster",
            preference="weighted",
            price_weight="0.7",
            checkpointable=True,
        ),
        as_org="acme",
    ),
    Scenario("jobs_create", 400, "zero-cards", body=lambda w: _job_body(cards=0), as_org="acme"),
    Scenario(
        "jobs_create",
        400,
        "beyond-horizon",
        body=lambda w: _job_body(deadline_at=_now_iso(30 * 86400)),
        as_org="acme",
    ),
    Scenario("jobs_create", 403, "operator", body=lambda w: _job_body()),
    Scenario("jobs_get", 200, "own", lambda w: {"job_id": w.job.pk}, as_org="acme"),
    Scenario("jobs_get", 404, "others", lambda w: {"job_id": w.other_job.pk}, as_org="acme"),
    Scenario("jobs_cancel", 200, "own", lambda w: {"job_id": w.job.pk}, as_org="acme"),
    Scenario("jobs_cancel", 404, "others", lambda w: {"job_id": w.other_job.pk}, as_org="acme"),
    Scenario(
        "jobs_quotes_create",
        201,
        "own",
        lambda w: {"job_id": w.job.pk},
        body=lambda w: {"limit": 3},
        as_org="acme",
    ),
    Scenario(
        "jobs_quotes_create",
        404,
        "others",
        lambda w: {"job_id": w.other_job.pk},
        body=lambda w: {},
        as_org="acme",
    ),
    Scenario(
        "jobs_quotes_create",
        400,
        "limit-too-high",
        lambda w: {"job_id": w.job.pk},
        body=lambda w: {"limit": 101},
        as_org="acme",
    ),
    Scenario("quotes_accept", 201, "live", lambda w: {"quote_id": w.quote.pk}, as_org="acme"),
    Scenario("quotes_accept", 404, "missing", lambda w: {"quote_id": 2**31}, as_org="acme"),
    Scenario("quotes_accept", 403, "operator", lambda w: {"quote_id": w.quote.pk}),
    Scenario("leases_list", 200, "buyer", as_org="acme"),
    Scenario("leases_list", 200, "filtered", query={"state": "reserved"}, as_org="acme"),
    Scenario("leases_get", 200, "own", lambda w: {"lease_id": w.lease.pk}, as_org="acme"),
    Scenario("leases_get", 404, "others", lambda w: {"lease_id": w.other_lease.pk}, as_org="acme"),
    Scenario("leases_cancel", 200, "own", lambda w: {"lease_id": w.lease.pk}, as_org="acme"),
    Scenario("leases_cancel", 404, "others", lambda w: {"lease_id": w.other_lease.pk}, as_org="acme"),
    Scenario("notices_list", 200, "buyer", as_org="acme"),
    # Budgets: acme's (a manager token) and beta's.
    Scenario("budgets_list", 200, "buyer", as_org="acme"),
    Scenario(
        "budgets_create",
        201,
        "job",
        body=lambda w: {"name": "one job", "scope": "job", "job_id": w.job.pk, "hard_cap": "500.00"},
        as_org="acme",
    ),
    Scenario(
        "budgets_create",
        400,
        "second-for-the-organisation",
        body=lambda w: {"name": "again", "hard_cap": "5"},
        as_org="acme",
    ),
    Scenario("budgets_create", 403, "operator", body=lambda w: {"name": "x", "hard_cap": "5"}),
    Scenario("budgets_get", 200, "own", lambda w: {"budget_id": w.budget.pk}, as_org="acme"),
    Scenario("budgets_get", 404, "others", lambda w: {"budget_id": w.other_budget.pk}, as_org="acme"),
    Scenario(
        "budgets_update",
        200,
        "own",
        lambda w: {"budget_id": w.budget.pk},
        body=lambda w: {
            "name": "acme monthly",
            "soft_amount": "2000.00",
            "thresholds": [75],
            "hard_cap": None,
        },
        as_org="acme",
    ),
    Scenario(
        "budgets_update",
        404,
        "others",
        lambda w: {"budget_id": w.other_budget.pk},
        body=lambda w: {"name": "mine now", "hard_cap": "1"},
        as_org="acme",
    ),
    Scenario("budgets_delete", 204, "own", lambda w: {"budget_id": w.budget.pk}, as_org="acme"),
    Scenario("budgets_delete", 404, "others", lambda w: {"budget_id": w.other_budget.pk}, as_org="acme"),
    Scenario("budget_alerts_list", 200, "buyer", as_org="acme"),
    Scenario("buyer_endpoint_get", 200, "buyer", as_org="acme"),
    Scenario(
        "buyer_endpoint_set",
        200,
        "public",
        body=lambda w: {"url": "https://alerts.example.com/hook"},
        as_org="acme",
    ),
    Scenario(
        "buyer_endpoint_set", 400, "private", body=lambda w: {"url": "https://10.0.0.5/hook"}, as_org="acme"
    ),
    Scenario("buyer_endpoint_secret_rotate", 200, "buyer", as_org="acme"),
    Scenario("buyer_endpoint_secret_delete", 204, "buyer", as_org="acme"),
    # Broker, operators' side: cucc's agent.
    Scenario("operator_leases_list", 200, "operator"),
    Scenario(
        "operator_leases_list",
        200,
        "filtered",
        query={"state": "reserved,running", "cluster": CPI, "after": 0, "wait": 0},
    ),
    Scenario("operator_leases_list", 403, "buyer", as_org="acme"),
    Scenario("operator_leases_get", 200, "own", lambda w: {"lease_id": w.lease.pk}),
    Scenario("operator_leases_get", 404, "others", lambda w: {"lease_id": w.other_lease.pk}),
    Scenario("operator_leases_start", 200, "due", lambda w: {"lease_id": w.soon_lease.pk}, body=lambda w: {}),
    Scenario(
        "operator_leases_start", 400, "too-early", lambda w: {"lease_id": w.lease.pk}, body=lambda w: {}
    ),
    Scenario(
        "operator_leases_start", 404, "others", lambda w: {"lease_id": w.other_lease.pk}, body=lambda w: {}
    ),
    Scenario(
        "operator_leases_stop",
        200,
        "running",
        lambda w: {"lease_id": w.running_lease.pk},
        body=lambda w: {"outcome": "completed"},
    ),
    Scenario(
        "operator_leases_stop",
        409,
        "reserved",
        lambda w: {"lease_id": w.lease.pk},
        body=lambda w: {"outcome": "completed"},
    ),
    Scenario(
        "operator_leases_stop", 404, "others", lambda w: {"lease_id": w.other_lease.pk}, body=lambda w: {}
    ),
    Scenario("operator_usage_create", 201, "running", body=lambda w: _usage_body(w)),
    Scenario("operator_usage_create", 400, "too-many-cards", body=lambda w: _usage_body(w, cards=9)),
    Scenario("operator_usage_create", 400, "not-started", body=lambda w: _usage_body(w, lease=w.lease.pk)),
    Scenario("operator_usage_create", 403, "buyer", body=lambda w: _usage_body(w), as_org="acme"),
    Scenario("operator_endpoint_secret_rotate", 200),
    Scenario("operator_endpoint_secret_delete", 204),
]


@pytest.mark.parametrize(
    "scenario", SCENARIOS, ids=[f"{s.operation_id}-{s.label or s.expected_status}" for s in SCENARIOS]
)
def test_operation_with_real_objects(
    scenario: Scenario, world: World, request: pytest.FixtureRequest
) -> None:
    for fixture in scenario.fixtures:
        request.getfixturevalue(fixture)
    operation = schema.find_operation_by_id(scenario.operation_id)
    kwargs: dict[str, Any] = {"path_parameters": scenario.path_parameters(world), "query": scenario.query}
    if scenario.body is not None:
        kwargs["body"] = scenario.body(world)
        kwargs["media_type"] = scenario.media_type
    case = operation.Case(**kwargs)
    if scenario.as_org:
        headers = world.auth_as(scenario.as_org)
    else:
        headers = world.platform_auth() if scenario.as_platform else world.auth()
    # A scenario that expects a 5xx (a documented 502 from an unreachable payment provider) checks
    # everything else.
    expects_5xx = scenario.expected_status is not None and scenario.expected_status >= 500
    checks = [check for check in CHECKS if check is not not_a_server_error] if expects_5xx else CHECKS
    response = case.call_and_validate(headers=headers, checks=checks)
    if scenario.expected_status is not None:
        assert response.status_code == scenario.expected_status, response.text


def test_every_operation_has_a_real_object_scenario() -> None:
    operation_ids = {result.ok().definition.raw["operationId"] for result in schema.get_all_operations()}
    assert operation_ids == {s.operation_id for s in SCENARIOS}
