"""A client generated from ``/api/schema/`` with a mainstream generator (openapi-python-client) drives an
operator's and a buyer's flow against the live server (issue #12, "an honest schema").

The schema is fetched from the running server, the client generated into a temporary directory (it is not
committed) and every one of its modules imported. Then, through the generated functions and models only:
the operator registers a cluster with two islands, beats for it, puts a price card on it; the buyer
creates a job, asks for quotes and accepts the cheapest; the operator pulls its lease feed, finds the
lease, starts it and reports usage against it. Every request the client sent is recorded: each body went
as ``application/json`` (the API parses nothing else) and every answer parsed into the model the schema
promised.

The generator may skip only what it cannot express: the fleet-import upload's ``text/csv`` body (the same
operation's multipart form is generated) and the PDF downloads' ``application/pdf`` answers.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from core.services import api_token_create
from metering.models import Tariff
from tests.factories import BuyerFactory, OperatorFactory
from tests.metering.factories import make_paid_pack

pytestmark = pytest.mark.django_db(transaction=True)

PACKAGE = "cardhour_client"
CPI = "cpi:cucc:nx:zw-ai01"
ACCELERATOR = "nvidia-a800-sxm4-80gb"
# What openapi-python-client 0.2x cannot express, by operation: nothing else may be skipped.
EXPECTED_WARNINGS = {
    "POST /api/v1/fleet-imports": "Unsupported content type text/csv",
    "GET /api/v1/invoices/{invoice_id}.pdf": "Unsupported content_type application/pdf",
    "GET /api/v1/settlements/{settlement_id}.pdf": "Unsupported content_type application/pdf",
}


def _generator() -> str:
    return str(Path(sys.executable).with_name("openapi-python-client"))


@pytest.fixture
def generated(live_server: Any, tmp_path: Path) -> Iterator[ModuleType]:
    """The client package, generated from the live server's schema and imported from ``tmp_path``."""
    schema = httpx.get(f"{live_server.url}/api/schema/", params={"format": "json"}, timeout=30)
    assert schema.status_code == 200
    schema_path = tmp_path / "schema.json"
    schema_path.write_text(json.dumps(schema.json()))
    run = subprocess.run(  # noqa: S603  # the generator installed beside this Python, a fixed argument list
        [
            _generator(),
            "generate",
            "--path",
            str(schema_path),
            "--meta",
            "none",
            "--output-path",
            str(tmp_path / PACKAGE),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    warned = {
        line.removeprefix("WARNING parsing ").split(" within ")[0]
        for line in output.splitlines()
        if line.startswith("WARNING parsing ")
    }
    assert warned == set(EXPECTED_WARNINGS), output
    for reason in EXPECTED_WARNINGS.values():
        assert reason in output
    sys.path.insert(0, str(tmp_path))
    try:
        package = importlib.import_module(PACKAGE)
        modules = [
            importlib.import_module(info.name)
            for info in pkgutil.walk_packages(package.__path__, f"{PACKAGE}.")
        ]
        assert len(modules) > 150  # every operation and model module imports
        yield package
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name == PACKAGE or name.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


class Recorder:
    """httpx event hook: (method, path, Content-Type) of every request that carried a body."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []

    def __call__(self, request: httpx.Request) -> None:
        if request.content:
            self.sent.append((request.method, request.url.path, request.headers.get("Content-Type", "")))


def _client(generated: ModuleType, base_url: str, secret: str, recorder: Recorder) -> Any:
    return generated.AuthenticatedClient(
        base_url=base_url,
        token=secret,
        raise_on_unexpected_status=True,
        httpx_args={"event_hooks": {"request": [recorder]}},
    )


def _api(name: str) -> Any:
    """A generated operation module, e.g. ``clusters.clusters_register``."""
    return importlib.import_module(f"{PACKAGE}.api.{name}")


def _model(name: str) -> Any:
    return getattr(importlib.import_module(f"{PACKAGE}.models"), name)


def _detailed(module: Any, expected_status: int, **kwargs: Any) -> Any:
    """Call a generated operation; assert its status and that the answer parsed into the promised model
    (not the error model, not None)."""
    response = module.sync_detailed(**kwargs)
    assert response.status_code == expected_status, response.content
    assert response.parsed is not None
    assert not isinstance(response.parsed, _model("Error")), response.content
    return response.parsed


def test_a_generated_client_drives_an_operator_and_a_buyer_through_a_lease(
    generated: ModuleType, live_server: Any
) -> None:
    operator = OperatorFactory(slug="cucc", name="China Unicom")
    buyer = BuyerFactory(slug="acme", name="Acme AI")
    make_paid_pack(buyer=buyer, accelerator=ACCELERATOR)
    _, operator_secret = api_token_create(organisation=operator, name="agent", scope="read_write")
    _, buyer_secret = api_token_create(organisation=buyer, name="scheduler", scope="read_write")
    recorder = Recorder()
    agent = _client(generated, live_server.url, operator_secret, recorder)
    scheduler = _client(generated, live_server.url, buyer_secret, recorder)

    # The operator: a cluster with two islands, a heartbeat, a price card.
    cluster = _detailed(
        _api("clusters.clusters_register"),
        201,
        client=agent,
        body=_model("ClusterListInputRequest")(
            cpi=CPI,
            site="Zhongwei",
            accelerator=ACCELERATOR,
            islands=[
                _model("IslandInputRequest")(name="isl-01", cards=16, fabric=_model("FabricEnum").INFINIBAND),
                _model("IslandInputRequest")(name="isl-02", cards=8, fabric=_model("FabricEnum").ROCE),
            ],
        ),
    )
    assert cluster.cpi == CPI
    assert [(i.name, i.cards) for i in cluster.islands] == [("isl-01", 16), ("isl-02", 8)]
    beat = _detailed(
        _api("clusters.clusters_heartbeat"),
        200,
        cpi=CPI,
        client=agent,
        body=_model("HeartbeatInputRequest")(
            sent_at=datetime.now(UTC),
            health=_model("ReportedHealthEnum").OK,
            islands=[
                _model("HeartbeatInputIslandLineRequest")(
                    name="isl-01", available_cards=16, unhealthy_cards=0
                ),
                _model("HeartbeatInputIslandLineRequest")(
                    name="isl-02", available_cards=8, unhealthy_cards=0
                ),
            ],
        ),
    )
    assert beat.applied is True
    flat = Tariff.objects.get(owner__isnull=True, code="flat")
    card = _detailed(
        _api("tariffs.price_cards_create"),
        201,
        cpi=CPI,
        client=agent,
        body=_model("PriceCardListInputRequest")(rate_per_card_hour="12.5000", tariff_id=flat.pk),
    )
    assert card.rate_per_card_hour == "12.5000"

    # The buyer: a job, its quotes, the cheapest accepted.
    job = _detailed(
        _api("jobs.jobs_create"),
        201,
        client=scheduler,
        body=_model("JobListInputRequest").from_dict(
            {
                "name": "fine-tune",
                "cards": 8,
                "accelerators": [ACCELERATOR],
                "origin_hub": "nx",
                "latency_budget_ms": 30,
                "deadline_at": (datetime.now(UTC) + timedelta(hours=6)).isoformat(),
                "duration_seconds": 3600,
            }
        ),
    )
    quotes = _detailed(
        _api("jobs.jobs_quotes_create"),
        201,
        job_id=job.id,
        client=scheduler,
        body=_model("JobQuoteInputRequest")(limit=3),
    )
    assert quotes.quotes, quotes.to_dict()
    assert {q.cluster for q in quotes.quotes} == {CPI}
    lease = _detailed(_api("jobs.quotes_accept"), 201, quote_id=quotes.quotes[0].id, client=scheduler)
    assert lease.cards == 8

    # The operator: the lease in its feed, started, usage reported.
    feed = _detailed(_api("operator_leases.operator_leases_list"), 200, client=agent, cluster=CPI)
    assert [(item.id, item.state) for item in feed.results] == [(lease.id, "reserved")]
    started = _detailed(
        _api("operator_leases.operator_leases_start"),
        200,
        lease_id=lease.id,
        client=agent,
        body=_model("OperatorLeaseStartInputRequest")(),
    )
    assert started.state == "running"
    # Usage counts from the later of the lease's start and the moment it was started (up to 5 min early),
    # in whole seconds.
    started_at = max(started.start_at, started.started_at)
    if started_at.microsecond:
        started_at = started_at.replace(microsecond=0) + timedelta(seconds=1)
    time.sleep(max(0.0, (started_at + timedelta(seconds=2) - datetime.now(UTC)).total_seconds()))
    usage = _detailed(
        _api("operator_leases.operator_usage_create"),
        201,
        client=agent,
        body=_model("OperatorUsageCreateInputRequest")(
            records=[
                _model("OperatorUsageCreateInputRecordRequest")(
                    lease=lease.id,
                    idempotency_key="client-1",
                    start_at=started_at,
                    end_at=started_at + timedelta(seconds=2),
                    cards=8,
                )
            ]
        ),
    )
    assert (usage.created, usage.duplicates, usage.conflicts) == (1, 0, 0)
    assert [(r.index, r.idempotency_key, r.status) for r in usage.records] == [(0, "client-1", "created")]

    # Every body went as JSON, the only thing the API parses (accepting a quote has no body).
    assert recorder.sent == [
        ("POST", path, "application/json")
        for path in (
            "/api/v1/clusters",
            f"/api/v1/clusters/{CPI}/heartbeats",
            f"/api/v1/clusters/{CPI}/price-cards",
            "/api/v1/jobs",
            f"/api/v1/jobs/{job.id}/quotes",
            f"/api/v1/operator/leases/{lease.id}/start",
            "/api/v1/operator/usage",
        )
    ]
