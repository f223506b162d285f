"""Portal: placing a job (one job however often the form is sent, faults beside their fields), its ranked
quotes with band breakdown and rejection reasons, accepting and re-quoting, the job list, and who may see
what."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from broker.models import BuyerPreference, Job, Lease, LeaseState, LeaseTransition, Quote
from core.models import Organisation
from federation.models import Cluster, Hub
from tests.broker.conftest import A800
from tests.broker.factories import make_job, make_lease
from tests.metering.factories import make_paid_pack


def _local(value: datetime) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%dT%H:%M")


def tomorrow_at(hour: int) -> datetime:
    """Tomorrow at ``hour`` o'clock, Asia/Shanghai: 03:00 lies in the valley of both fixture tariffs."""
    return (timezone.localtime() + timedelta(days=1)).replace(hour=hour, minute=0, second=0, microsecond=0)


def form_data(**overrides: object) -> dict[str, object]:
    """8 A800-or-any cards from yrd for one hour, tomorrow 03:00–04:00 Shanghai (a one-slot window)."""
    start = tomorrow_at(3)
    data: dict[str, object] = {
        "name": "pretrain",
        "size_kind": "cards",
        "cards": "8",
        "gang": "island",
        "origin_hub": "yrd",
        "latency_budget_ms": "100",
        "earliest_start_at": _local(start),
        "start_shown": "",
        "deadline_at": _local(start + timedelta(hours=1)),
        "duration_hours": "1",
        "duration_minutes": "0",
        "preference": "price",
        "idempotency_key": "form-1",
    }
    data.update(overrides)
    return data


def field_block(html: str, field_id: str) -> str:
    """The markup of the form field holding the element ``field_id``: from the ``field`` container that
    opens it (a div, or a fieldset for a group of choices) to that container's end."""
    at = html.index(f'id="{field_id}"')
    div, fieldset = html.rfind('<div class="field', 0, at), html.rfind('<fieldset class="field', 0, at)
    if fieldset > div or html.find("</fieldset>", at) < html.find("</div>\n", at):
        return html[fieldset : html.index("</fieldset>", at)]
    return html[div : html.index("</div>\n", at)]


# --- The form -----------------------------------------------------------------------------------------


def test_the_form_defaults_to_the_home_hub_now_and_a_day(buyer: Organisation, buyer_client: Client) -> None:
    BuyerPreference.objects.create(buyer=buyer, home_hub=Hub.objects.get(code="gba"))
    response = buyer_client.get("/jobs/new/")
    assert response.status_code == 200
    form = response.context["form"]
    assert form["origin_hub"].value() == "gba"
    start, deadline = form.initial["earliest_start_at"], form.initial["deadline_at"]
    assert deadline - start == timedelta(hours=24)
    assert abs((timezone.now() - start).total_seconds()) < 120
    assert form["duration_hours"].value() == 2 and form["gang"].value() == "island"
    assert re.fullmatch(r"[0-9a-f]{32}", form["idempotency_key"].value())
    assert 'type="datetime-local"' in response.content.decode()


def test_without_a_home_hub_the_form_takes_the_latest_jobs_origin_then_yrd(
    buyer: Organisation, buyer_client: Client
) -> None:
    assert buyer_client.get("/jobs/new/").context["form"]["origin_hub"].value() == "yrd"
    make_job(buyer=buyer, origin_hub="cy")
    assert buyer_client.get("/jobs/new/").context["form"]["origin_hub"].value() == "cy"


def test_a_marketplace_link_prefills_the_chip_and_the_hub(buyer_client: Client) -> None:
    response = buyer_client.get(f"/jobs/new/?accelerator={A800}&origin_hub=nx")
    form = response.context["form"]
    assert form["accelerators"].value() == [A800]
    assert form["origin_hub"].value() == "nx"
    html = response.content.decode()
    assert re.search(rf'<input type="checkbox" name="accelerators" value="{A800}"[^>]*checked', html)


def test_a_double_submit_places_one_job_and_shows_its_ranked_quotes(
    funded_buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, buyer_client: Client
) -> None:
    first = buyer_client.post("/jobs/new/", form_data())
    second = buyer_client.post("/jobs/new/", form_data())
    job = Job.objects.get()
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"] == f"/jobs/{job.pk}/"
    assert (job.name, job.cards, job.origin_hub.code, job.duration_seconds) == ("pretrain", 8, "yrd", 3600)
    assert job.earliest_start_at == tomorrow_at(3)
    # One quote per distinct offer: each cluster's two identical islands are one row.
    quotes = list(Quote.objects.filter(job=job).order_by("rank"))
    west_isl, east_isl = (
        {island.name: island.pk for island in cluster.islands.all()}
        for cluster in (west_cluster, east_cluster)
    )
    assert [
        (q.rank, q.cluster.cpi, q.cost, q.latency_ms, q.balance_sufficient, q.allocation, q.alternatives)
        for q in quotes
    ] == [
        (
            1,
            "cpi:cucc:nx:zw-ai01",
            Decimal("36.00"),
            Decimal("24.300"),
            True,
            [[west_isl["isl-01"], 8]],
            [[west_isl["isl-02"], 8]],
        ),
        (
            2,
            "cpi:ctyun:yrd:sh-ai01",
            Decimal("36.48"),
            Decimal("5.000"),
            True,
            [[east_isl["isl-01"], 8]],
            [[east_isl["isl-02"], 8]],
        ),
    ]
    page = buyer_client.get(first["Location"])
    assert page.status_code == 200
    rows = page.context["quotes"]
    assert [
        (row.quote.rank, row.cheapest, row.hub, row.islands, row.islands_available, row.island_span)
        for row in rows
    ] == [
        (1, True, "nx", [("isl-01", "cpi:cucc:nx:zw-ai01:isl-01", 8)], 2, "isl-01–isl-02"),
        (2, False, "yrd", [("isl-01", "cpi:ctyun:yrd:sh-ai01:isl-01", 8)], 2, "isl-01–isl-02"),
    ]
    west, east = rows[0].bands, rows[1].bands
    assert [(b.band, b.multiplier, b.card_hours, b.cost, b.share) for b in west] == [
        ("valley", "0.5", Decimal("8.000000"), Decimal("36.00"), Decimal("100.0"))
    ]
    assert [(b.band, b.multiplier, b.cost) for b in east] == [("valley", "0.38", Decimal("36.48"))]
    html = page.content.decode()
    assert html.count('class="cheapest"') == 1
    assert "¥36.00" in html and "¥36.48" in html and "24.3 ms" in html and "5.0 ms" in html
    assert {(row.quote.start_at, row.quote.end_at) for row in rows} == {(tomorrow_at(3), tomorrow_at(4))}
    assert f"{tomorrow_at(3):%m-%d} 03:00 →" in html
    assert "4 islands examined; none was rejected." in html
    assert html.count("isl-01–isl-02 · 2 islands can take it") == 2
    assert html.count("data-expires-in=") == 2 and html.count(">expires in 5") == 2


def test_rejections_are_counted_per_reason_in_plain_words(
    funded_buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, buyer_client: Client
) -> None:
    response = buyer_client.post("/jobs/new/", form_data(latency_budget_ms="10"), follow=True)
    summary = response.context["summary"]
    assert (summary["considered"], summary["rejected"]) == (4, 2)
    assert [(row["reason"], row["count"]) for row in summary["rejections"]] == [("latency", 2)]
    assert "<strong>2</strong> — the latency from your origin hub is over the budget" in (
        response.content.decode()
    )


def test_when_nothing_fits_the_page_says_why(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    response = buyer_client.post("/jobs/new/", form_data(cards="9"), follow=True)
    assert response.context["quotes"] == []
    html = response.content.decode()
    assert "No island can run this job in its window." in html
    assert "<strong>2</strong> — too few free cards for the whole run at any start" in html


def test_bad_input_is_shown_beside_its_fields_and_writes_nothing(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    start = tomorrow_at(3)
    response = buyer_client.post(
        "/jobs/new/",
        form_data(
            duration_hours="0",
            deadline_at=_local(start - timedelta(hours=1)),
            accelerators=[A800, "nvidia-a9000"],
        ),
    )
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert errors["duration_hours"] == ["The duration must be longer than zero."]
    assert errors["deadline_at"] == ["The deadline is before the earliest start plus the duration."]
    assert errors["accelerators"] == ["No chip model nvidia-a9000."]
    html = response.content.decode()
    assert "The deadline is before the earliest start plus the duration." in field_block(
        html, "id_deadline_at"
    )
    assert "No chip model nvidia-a9000." in field_block(html, "id_accelerators_0")
    duration = html[html.index("<legend>Duration</legend>") :]
    assert "The duration must be longer than zero." in duration[: duration.index("</fieldset>")]
    assert "please correct the fields marked below" in html
    assert not Job.objects.exists() and not Quote.objects.exists()


def test_malformed_values_and_a_missing_count_are_reported_by_field(buyer_client: Client) -> None:
    response = buyer_client.post(
        "/jobs/new/", form_data(cards="", latency_budget_ms="fast", earliest_start_at="tomorrow")
    )
    errors = response.context["form"].errors
    assert set(errors) == {"latency_budget_ms", "earliest_start_at"}
    response = buyer_client.post("/jobs/new/", form_data(cards=""))
    assert response.context["form"].errors == {"cards": ["Give the number of cards or of standard cards."]}
    response = buyer_client.post("/jobs/new/", form_data(size_kind="standard", cards="8"))
    assert response.context["form"].errors == {
        "standard_cards": ["Give the number of cards or of standard cards."]
    }
    assert not Job.objects.exists()


def test_standard_cards_and_a_start_left_as_shown(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    shown = _local(timezone.now() - timedelta(minutes=30))  # a form opened half an hour ago
    response = buyer_client.post(
        "/jobs/new/",
        form_data(
            size_kind="standard",
            cards="",
            standard_cards="6.24",
            earliest_start_at=shown,
            start_shown=shown,
            deadline_at=_local(timezone.now() + timedelta(hours=30)),
        ),
    )
    assert response.status_code == 302
    job = Job.objects.get()
    assert (job.cards, job.standard_cards) == (None, Decimal("6.2400"))
    assert abs((job.earliest_start_at - timezone.now()).total_seconds()) < 60


def test_a_reused_form_with_other_values_asks_to_submit_again(
    buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    assert buyer_client.post("/jobs/new/", form_data()).status_code == 302
    response = buyer_client.post("/jobs/new/", form_data(cards="4"))
    assert response.status_code == 200
    form = response.context["form"]
    assert "already placed job" in form.non_field_errors()[0]
    assert form["idempotency_key"].value() != "form-1"
    assert Job.objects.count() == 1
    again = buyer_client.post(
        "/jobs/new/", form_data(cards="4", idempotency_key=form["idempotency_key"].value())
    )
    assert again.status_code == 302 and Job.objects.count() == 2


# --- Accepting, re-quoting, cancelling -----------------------------------------------------------------


def _placed(client: Client, **overrides: object) -> Job:
    response = client.post("/jobs/new/", form_data(**overrides))
    assert response.status_code == 302, response.context["form"].errors
    return Job.objects.get(pk=int(response["Location"].strip("/").split("/")[-1]))


def test_accepting_the_cheapest_quote_reserves_a_lease_and_opens_it(
    funded_buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, buyer_client: Client
) -> None:
    job = _placed(buyer_client)
    cheapest = Quote.objects.get(job=job, rank=1)
    response = buyer_client.post(f"/quotes/{cheapest.pk}/accept/")
    lease = Lease.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/leases/{lease.pk}/"
    assert (lease.quote_id, lease.state, lease.cluster_id, lease.cards) == (
        cheapest.pk,
        LeaseState.RESERVED,
        west_cluster.pk,
        8,
    )
    assert (lease.start_at, lease.expected_cost) == (tomorrow_at(3), Decimal("36.00"))
    page = buyer_client.get(response["Location"])
    assert (
        f"Lease {lease.pk} reserved: 8 cards from {tomorrow_at(3):%Y-%m-%d} 03:00." in page.content.decode()
    )
    job_page = buyer_client.get(f"/jobs/{job.pk}/").content.decode()
    assert f"/leases/{lease.pk}/" in job_page and "/accept/" not in job_page
    # Accepting it again opens the same lease; another quote of the placed job is refused.
    assert buyer_client.post(f"/quotes/{cheapest.pk}/accept/")["Location"] == f"/leases/{lease.pk}/"
    other = Quote.objects.get(job=job, rank=2)
    refused = buyer_client.post(f"/quotes/{other.pk}/accept/", follow=True)
    assert refused.context["quote_error"]["code"] == "quote_superseded"
    assert Lease.objects.count() == 1


def test_an_expired_quote_says_so_and_offers_new_quotes(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    job = _placed(buyer_client)
    Quote.objects.filter(job=job).update(expires_at=timezone.now() - timedelta(seconds=1))
    quote = Quote.objects.get(job=job, rank=1)
    response = buyer_client.post(f"/quotes/{quote.pk}/accept/")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    page = buyer_client.get(response["Location"])
    html = page.content.decode()
    assert "This quote has expired: quotes hold for 60 seconds." in html
    assert 'id="quote-error" data-code="quote_expired"' in html
    assert f'action="/jobs/{job.pk}/quotes/"' in html and "Get new quotes" in html
    assert html.count(">expired<") == 1 and "These quotes have expired." in html
    assert not Lease.objects.exists() and not LeaseTransition.objects.exists()
    # The message is shown once; new quotes replace the expired ones.
    requoted = buyer_client.post(f"/jobs/{job.pk}/quotes/")
    assert requoted.status_code == 302
    again = buyer_client.get(f"/jobs/{job.pk}/")
    assert again.context["quote_error"] is None
    assert [row.expires_in > 50 for row in again.context["quotes"]] == [True]
    assert Quote.objects.filter(job=job).count() == 2


def test_a_buyer_who_cannot_pay_is_told_before_and_when_accepting(
    buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1, price="10.00", key="tiny")
    job = _placed(buyer_client)
    page = buyer_client.get(f"/jobs/{job.pk}/").content.decode()
    assert page.count("packs too low") == 1
    quote = Quote.objects.get(job=job, rank=1)
    response = buyer_client.post(f"/quotes/{quote.pk}/accept/", follow=True)
    error = response.context["quote_error"]
    assert error["code"] == "insufficient_balance" and error["pack_link"] is True
    # In the unit of the pack that pays (the A800 pack: A800 card-hours), to two places.
    assert escape(
        "cannot pay this quote's expected draw: 3.04 nvidia-a800-sxm4-80gb card-hours; your packs have "
        "1.00 of it free."
    ) in (response.content.decode())
    assert not Lease.objects.exists()


def test_cancelling_a_job_releases_its_reserved_lease(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    job = _placed(buyer_client)
    buyer_client.post(f"/quotes/{Quote.objects.get(job=job, rank=1).pk}/accept/")
    page = buyer_client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'action="/jobs/{job.pk}/cancel/"' in page and "data-confirm=" in page
    response = buyer_client.post(f"/jobs/{job.pk}/cancel/", follow=True)
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED
    assert Lease.objects.get().state == LeaseState.CANCELLED
    html = response.content.decode()
    assert "Job pretrain cancelled." in html
    assert "Reserved → " in html and "user alice" in html  # the history
    again = buyer_client.post(f"/jobs/{job.pk}/cancel/", follow=True)
    assert "This job already ended" in again.content.decode()


# --- The list -----------------------------------------------------------------------------------------


def test_the_job_list_shows_states_and_leases_and_filters(
    buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    placed = make_job(buyer=buyer, name="placed-one")
    lease = make_lease(job=placed, cluster=east_cluster)
    make_job(buyer=buyer, name="open-one")
    make_job(buyer=buyer, name="done-one", state=Job.State.COMPLETED)
    response = buyer_client.get("/jobs/")
    assert response.status_code == 200
    assert [row["job"].name for row in response.context["rows"]] == ["done-one", "open-one", "placed-one"]
    assert [row["lease"] for row in response.context["rows"]] == [None, None, lease]
    html = response.content.decode()
    assert f'<a href="/leases/{lease.pk}/">#{lease.pk}</a> <span class="badge warn">Reserved</span>' in html
    filtered = buyer_client.get("/jobs/?state=open")
    assert [row["job"].name for row in filtered.context["rows"]] == ["open-one"]
    assert buyer_client.get("/jobs/?state=bogus").context["state"] == ""


def test_the_job_list_pages_by_50_in_a_bounded_number_of_queries(
    buyer: Organisation, west_cluster: Cluster, buyer_client: Client, django_assert_max_num_queries
) -> None:
    for n in range(60):
        job = make_job(buyer=buyer, name=f"job-{n:02d}", cards=1)
        if n % 3 == 0:
            make_lease(job=job, cluster=west_cluster, cards=1)
    with django_assert_max_num_queries(8):
        response = buyer_client.get("/jobs/")
    assert len(response.context["rows"]) == 50
    with django_assert_max_num_queries(8):
        second = buyer_client.get("/jobs/?page=2")
    assert len(second.context["rows"]) == 10
    assert "Page 2 of 2" in second.content.decode()


def test_the_job_page_has_a_bounded_number_of_queries(
    funded_buyer: Organisation,
    east_cluster: Cluster,
    west_cluster: Cluster,
    buyer_client: Client,
    django_assert_max_num_queries,
) -> None:
    job = _placed(buyer_client)
    buyer_client.post(f"/quotes/{Quote.objects.get(job=job, rank=1).pk}/accept/")
    with django_assert_max_num_queries(12):
        assert buyer_client.get(f"/jobs/{job.pk}/").status_code == 200


# --- Who may see what ---------------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_log_in(buyer: Organisation) -> None:
    job = make_job(buyer=buyer)
    client = Client()
    for url in ("/jobs/", "/jobs/new/", f"/jobs/{job.pk}/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")


def test_an_operator_is_refused(operator_client: Client) -> None:
    for url in ("/jobs/", "/jobs/new/"):
        assert operator_client.get(url).status_code == 403
    assert operator_client.post("/jobs/new/", form_data()).status_code == 403
    assert not Job.objects.exists()


def test_another_buyers_job_and_quotes_are_not_found_and_left_alone(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client, other_buyer_client: Client
) -> None:
    job = _placed(buyer_client)
    quote = Quote.objects.get(job=job, rank=1)
    assert other_buyer_client.get(f"/jobs/{job.pk}/").status_code == 404
    assert other_buyer_client.post(f"/quotes/{quote.pk}/accept/").status_code == 404
    assert other_buyer_client.post(f"/jobs/{job.pk}/quotes/").status_code == 404
    assert other_buyer_client.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    assert other_buyer_client.get("/jobs/").context["rows"] == []
    # Nor can its constraints be copied into another buyer's form.
    assert other_buyer_client.get(f"/jobs/new/?from_job={job.pk}").status_code == 404
    job.refresh_from_db()
    assert job.state == Job.State.OPEN and not Lease.objects.exists()
    assert Quote.objects.filter(job=job).count() == 1


def test_a_viewer_sees_the_form_but_cannot_place_or_accept(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client, login, buyer_viewer: User
) -> None:
    job = _placed(buyer_client)
    viewer = login(buyer_viewer)
    page = viewer.get("/jobs/new/").content.decode()
    assert "read only" in page and "disabled" in page
    assert viewer.post("/jobs/new/", form_data(idempotency_key="viewer")).status_code == 403
    assert viewer.post(f"/quotes/{Quote.objects.get(job=job, rank=1).pk}/accept/").status_code == 403
    assert "/accept/" not in viewer.get(f"/jobs/{job.pk}/").content.decode()
    assert Job.objects.count() == 1 and not Lease.objects.exists()


# --- Draws in the unit of the pack that pays ---------------------------------------------------------


def test_a_standard_pack_buyer_sees_draws_in_standard_card_hours_and_its_own_price(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, buyer_client: Client
) -> None:
    """Only a standard pack (12 CNY per standard card-hour). The west quote draws 8 valley card-hours ×
    0.5 = 4 A800 card-hours, paid with 4 × 0.78 = 3.12 standard card-hours worth ¥37.44 (¥9.36 per A800
    card-hour); the operator's list price is ¥36.00 (9 CNY × 4)."""
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=1000, price="12000.00", key="std")
    job = _placed(buyer_client)
    page = buyer_client.get(f"/jobs/{job.pk}/")
    rows = {row.quote.rank: row for row in page.context["quotes"]}
    west, east = rows[1].plan, rows[2].plan
    assert [(p.class_key, p.amount, p.chip_card_hours, p.factor, p.value) for p in west.parts] == [
        ("std", Decimal("3.120000"), Decimal("4.000000"), Decimal("0.78"), Decimal("37.44"))
    ]
    assert (west.uncovered, west.value, west.effective_price_per_card_hour) == (
        Decimal("0.000000"),
        Decimal("37.44"),
        Decimal("9.36"),
    )
    assert [(p.class_key, p.amount, p.value) for p in east.parts] == [
        ("std", Decimal("2.371200"), Decimal("28.45"))
    ]
    assert (east.value, east.effective_price_per_card_hour) == (Decimal("28.45"), Decimal("9.36"))
    html = page.content.decode()
    assert "<strong>3.12</strong> std card-h" in html and "4.00 chip card-h × 0.78" in html
    assert "<strong>2.37</strong> std card-h" in html
    assert (
        "¥37.44" in html
        and "¥9.36/card-h yours" in html
        and "list ¥9.00/card-h" in html
        and "¥36.00 at list" in html
    )
    assert "nvidia-a800-sxm4-80gb card-h" not in html  # no draw in a unit no pack of the buyer has

    # The API answers with the same plan, exact.
    api = buyer_client.post(f"/api/v1/jobs/{job.pk}/quotes", {}, content_type="application/json")
    assert api.status_code == 201, api.content
    first = next(q for q in api.json()["quotes"] if q["rank"] == 1)
    assert first["draw_plan"]["paid_by"] == [
        {
            "pack_class": "std",
            "unit": "standard_card_hours",
            "card_hours": "3.120000",
            "chip_card_hours": "4.000000",
            "standard_card_factor": "0.7800",
            "price_per_card_hour": "12.000000",
            "value": "37.44",
        }
    ]
    assert (first["draw_plan"]["value"], first["draw_plan"]["effective_price_per_card_hour"]) == (
        "37.44",
        "9.36",
    )


def test_a_refusal_names_the_draw_in_standard_card_hours(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, buyer_client: Client
) -> None:
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=1, price="12.00", key="std-tiny")
    job = _placed(buyer_client)
    quote = Quote.objects.get(job=job, rank=1)
    response = buyer_client.post(f"/quotes/{quote.pk}/accept/", follow=True)
    error = response.context["quote_error"]
    assert error["code"] == "insufficient_balance"
    assert (
        escape(
            "expected draw: 3.12 standard card-hours (4.00 nvidia-a800-sxm4-80gb card-hours × factor 0.78); "
            "your packs have 1.00 of it free."
        )
        in response.content.decode()
    )
    assert not Lease.objects.exists()
