"""The job page explains its quotes (issue 15): one row per offer, the time shift against the earliest
possible start, no "saves" good news on a quote dearer than those above, the cost-against-start chart,
suggestions when nothing fits, reasons kept on the job, copying a job and pinning a cluster."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from broker.models import Job, Quote
from broker.services.quotes import quote_create
from core.models import Organisation
from federation.models import Accelerator, Cluster
from tests.broker.conftest import A800
from tests.broker.factories import make_job
from tests.portal.test_jobs import form_data, tomorrow_at

SHANGHAI = ZoneInfo("Asia/Shanghai")
DAY = datetime(2027, 3, 10, tzinfo=SHANGHAI)


def at(hour: int, minute: int = 0, days: int = 0) -> datetime:
    return DAY + timedelta(days=days, hours=hour, minutes=minute)


def test_each_quote_says_when_it_starts_and_what_the_earliest_start_would_cost(
    funded_buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, buyer_client: Client
) -> None:
    """Two hours in a window from a 10:00 peak. West waits for its 22:30 valley: ¥72.00 against ¥216.00
    at 10:00 (peak ×1.5). East waits for midnight: ¥72.96 against ¥326.40 — a bigger saving, but east is
    dearer than west above it, so its saving is not shown as good news."""
    job = make_job(
        buyer=funded_buyer, earliest_start_at=at(10), deadline_at=at(10, days=1), duration_seconds=7200
    )
    quote_create(job=job, now=at(10))
    page = buyer_client.get(f"/jobs/{job.pk}/")
    rows = page.context["quotes"]
    assert [
        (row.cluster, row.quote.cost, row.shift.earliest_at, row.shift.earliest_cost, row.shift.saving)
        for row in rows
    ] == [
        (west_cluster.cpi, Decimal("72.00"), at(10), Decimal("216.00"), Decimal("144.00")),
        (east_cluster.cpi, Decimal("72.96"), at(10), Decimal("326.40"), Decimal("253.44")),
    ]
    assert [(row.shift.shifted, row.shift.saving_is_best) for row in rows] == [(True, True), (True, False)]
    html = page.content.decode()
    assert "03-10 10:00) costs ¥216.00 at list." in html and "03-10 10:00) costs ¥326.40 at list." in html
    assert '<span class="sub-line saving good" data-saving="144.00">Waiting until then saves ¥144.00.' in html
    assert '<span class="sub-line saving" data-saving="253.44">Waiting until then saves ¥253.44.' in html
    assert "saves ¥" not in html.replace("Waiting until then saves ¥", "")  # no unexplained "saves"

    # The chart: both offers over the window, each quote's start and its earliest possible start marked.
    chart = page.context["chart"]
    assert [(colour, row.cluster) for colour, row in chart["legend"]] == [
        ("#2f5fb3", west_cluster.cpi),
        ("#c2410c", east_cluster.cpi),
    ]
    assert (chart["first"], chart["last"]) == (at(10), at(8, days=1))
    svg = str(chart["svg"])
    assert svg.count('class="mark-chosen"') == 2 and svg.count('class="mark-earliest"') == 2
    assert "quote #1 starts here: 2027-03-10 22:30 (UTC+08:00), ¥72.00" in svg
    assert "earliest possible start: 2027-03-10 10:00 (UTC+08:00), ¥326.40" in svg
    assert ">03-11</text>" in svg and ">18:00</text>" in svg


def test_a_quote_at_its_earliest_start_says_so(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    response = buyer_client.post("/jobs/new/", form_data(), follow=True)
    (row,) = response.context["quotes"]
    assert (row.shift.shifted, row.shift.saving, row.shift.earliest_at) == (
        False,
        Decimal("0.00"),
        tomorrow_at(3),
    )
    html = response.content.decode()
    assert "The earliest possible start." in html and "Waiting until then" not in html


def test_when_nothing_fits_the_page_suggests_the_nearest_changes_with_links(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, buyer_client: Client
) -> None:
    job = make_job(
        buyer=buyer,
        name="wide",
        cards=16,
        latency_budget_ms=10,
        earliest_start_at=at(0),
        deadline_at=at(0, days=1),
        duration_seconds=3600,
    )
    quote_create(job=job, now=at(0))
    page = buyer_client.get(f"/jobs/{job.pk}/")
    model = Accelerator.objects.get(slug=A800).model
    suggestions = page.context["suggestions"]
    assert [(s.kind, s.change, s.outcome, s.url) for s in suggestions] == [
        (
            "latency",
            "A latency budget of 25 ms (now 10 ms)",
            f"{west_cluster.cpi} ({model}) could start it at 2027-03-10 00:00 (UTC+08:00) for ¥72.00 at "
            "list price.",
            f"/jobs/new/?from_job={job.pk}&latency_budget_ms=25",
        ),
        (
            "gang",
            "Let the cards span the islands of one cluster",
            f"{east_cluster.cpi} ({model}) could start it at 2027-03-10 00:00 (UTC+08:00) for ¥72.96 at "
            "list price.",
            f"/jobs/new/?from_job={job.pk}&gang=cluster",
        ),
        (
            "cards",
            "8 cards instead of 16",
            f"{east_cluster.cpi} ({model}) could start it at 2027-03-10 00:00 (UTC+08:00) for ¥36.48 at "
            "list price.",
            f"/jobs/new/?from_job={job.pk}&cards=8",
        ),
    ]
    html = page.content.decode()
    assert "No island can run this job in its window." in html
    assert "The changes below would each produce a quote." in html
    assert html.count("Place a job with this change") == 3
    assert f'href="/jobs/new/?from_job={job.pk}&amp;latency_budget_ms=25"' in html
    # The rejection reasons are the job's, whoever quoted it: no session is involved.
    assert "<strong>2</strong> — the latency from your origin hub is over the budget" in html
    assert "<strong>2</strong> — too few free cards for the whole run at any start" in html

    # The link opens the job form with the job's constraints and the change.
    form = buyer_client.get(suggestions[0].url).context["form"]
    assert (
        form["name"].value(),
        form["latency_budget_ms"].value(),
        form["cards"].value(),
        form["origin_hub"].value(),
        form["gang"].value(),
    ) == ("wide (copy)", "25", 16, "yrd", "island")
    assert buyer_client.get(suggestions[2].url).context["form"]["cards"].value() == "8"


def test_a_job_with_nothing_to_suggest_says_what_was_tried(
    buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    job = make_job(buyer=buyer, cards=1000, earliest_start_at=at(0), deadline_at=at(0, days=1))
    quote_create(job=job, now=at(0))
    html = buyer_client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="no-suggestion"' in html and "would produce a quote either" in html


def test_the_reasons_are_kept_on_the_job_for_every_session(
    funded_buyer: Organisation,
    east_cluster: Cluster,
    buyer_client: Client,
    buyer_user: User,
    buyer_viewer: User,
    login,  # type: ignore[no-untyped-def]
) -> None:
    job_url = buyer_client.post("/jobs/new/", form_data(latency_budget_ms="1"))["Location"]
    for client in (login(buyer_user), login(buyer_viewer)):  # new sessions
        html = client.get(job_url).content.decode()
        assert "2 islands examined." in html
        assert "<strong>2</strong> — the latency from your origin hub is over the budget" in html


# --- Copy a job, pin a cluster -----------------------------------------------------------------------------


def test_place_a_similar_job_copies_the_constraints(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    job_url = buyer_client.post(
        "/jobs/new/",
        form_data(
            max_price_per_card_hour="20", fabrics=["nvlink"], checkpointable="on", cluster=east_cluster.cpi
        ),
    )["Location"]
    job = Job.objects.get()
    page = buyer_client.get(job_url).content.decode()
    assert f'href="/jobs/new/?from_job={job.pk}">Place a similar job</a>' in page
    response = buyer_client.get(f"/jobs/new/?from_job={job.pk}")
    form = response.context["form"]
    values = {name: form[name].value() for name in form.fields}
    assert {
        key: values[key]
        for key in (
            "name",
            "size_kind",
            "cards",
            "gang",
            "origin_hub",
            "latency_budget_ms",
            "duration_hours",
            "duration_minutes",
            "max_price_per_card_hour",
            "checkpointable",
            "preference",
            "cluster",
            "fabrics",
            "start_shown",
        )
    } == {
        "name": "pretrain (copy)",
        "size_kind": "cards",
        "cards": 8,
        "gang": "island",
        "origin_hub": "yrd",
        "latency_budget_ms": 100,
        "duration_hours": 1,
        "duration_minutes": 0,
        "max_price_per_card_hour": Decimal("20.0000"),
        "checkpointable": True,
        "preference": "price",
        "cluster": east_cluster.cpi,
        "fabrics": ["nvlink"],
        "start_shown": "",
    }
    # A window still ahead is kept as it was.
    assert (form.initial["earliest_start_at"], form.initial["deadline_at"]) == (
        tomorrow_at(3),
        tomorrow_at(4),
    )
    assert "A new job like pretrain: change what you need, then place it." in response.content.decode()


def test_a_copy_of_a_job_whose_window_began_starts_now_with_the_same_length(
    buyer: Organisation, buyer_client: Client
) -> None:
    now = timezone.now().replace(second=0, microsecond=0)
    job = make_job(
        buyer=buyer, earliest_start_at=now - timedelta(hours=2), deadline_at=now + timedelta(hours=4)
    )
    form = buyer_client.get(f"/jobs/new/?from_job={job.pk}").context["form"]
    start, deadline = form.initial["earliest_start_at"], form.initial["deadline_at"]
    assert deadline - start == timedelta(hours=6)
    assert abs((start - now).total_seconds()) < 120
    assert form.initial["start_shown"] == timezone.localtime(start).strftime(
        "%Y-%m-%dT%H:%M"
    )  # as soon as possible


def test_a_job_pinned_to_a_cluster_is_quoted_only_there(
    funded_buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, buyer_client: Client
) -> None:
    response = buyer_client.post("/jobs/new/", form_data(cluster=f" {east_cluster.cpi} "), follow=True)
    job = Job.objects.get()
    assert job.cluster_id == east_cluster.pk
    assert {q.cluster_id for q in Quote.objects.filter(job=job)} == {east_cluster.pk}
    html = response.content.decode()
    assert (
        f'<code>{east_cluster.cpi}</code> <span class="muted">(only this cluster\'s islands)</span>' in html
    )


def test_an_unknown_cluster_is_shown_beside_its_field(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    response = buyer_client.post("/jobs/new/", form_data(cluster="cpi:ctyun:yrd:nowhere"))
    assert response.status_code == 200
    assert response.context["form"].errors["cluster"] == [
        "No cluster with this identifier is listed on the market."
    ]
    assert escape("No cluster with this identifier is listed on the market.") in response.content.decode()
    assert not Job.objects.exists()
