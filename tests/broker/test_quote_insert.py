"""Quotes are stored with one INSERT … RETURNING of their own; the rows must be what bulk_create writes."""

from __future__ import annotations

import copy
from decimal import Decimal

import pytest

from broker.models import Quote
from broker.services.quotes import _quote_new, _quotes_insert, quote_create
from core.models import Organisation
from federation.models import Cluster
from tests.broker.factories import make_job, make_lease

FIELDS = [field.attname for field in Quote._meta.concrete_fields if not field.primary_key]


def _copies(quotes: list[Quote], times: int) -> list[Quote]:
    out = []
    for _ in range(times):
        for quote in quotes:
            twin = copy.copy(quote)
            twin.pk = None
            twin._state = copy.copy(quote._state)
            twin._state.adding = True
            out.append(twin)
    return out


def test_stored_quotes_are_the_rows_bulk_create_writes(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    quote_set = quote_create(job=make_job(buyer=buyer, cards=4), limit=4)
    # One offer per cluster, each with the cluster's other island as its alternative.
    assert len(quote_set.quotes) == 2
    assert [len(quote.alternatives) for quote in quote_set.quotes] == [1, 1]
    stored = {row["id"]: row for row in Quote.objects.values("id", *FIELDS)}
    assert sorted(stored) == sorted(quote.pk for quote in quote_set.quotes)
    for quote in quote_set.quotes:  # each object got its own row's id
        assert not quote._state.adding
        assert stored[quote.pk]["rank"] == quote.rank
        assert stored[quote.pk]["allocation"] == quote.allocation
    twins = _copies(quote_set.quotes, 1)
    Quote.objects.bulk_create(twins)
    by_bulk = {
        row.pop("id"): row for row in Quote.objects.filter(pk__in=[t.pk for t in twins]).values("id", *FIELDS)
    }
    for quote, twin in zip(quote_set.quotes, twins, strict=True):
        ours = dict(stored[quote.pk])
        del ours["id"]
        assert ours == by_bulk[twin.pk]


def test_many_quotes_are_stored_in_batches_the_backend_accepts(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    quote_set = quote_create(job=make_job(buyer=buyer, cards=4), limit=2)
    assert len(quote_set.quotes) == 1  # the cluster's two islands are one offer
    many = _copies(quote_set.quotes, 160)  # 160 rows × 18 columns: over SQLite's 999 parameters
    _quotes_insert(many)
    assert len({quote.pk for quote in many}) == 160
    ranks = dict(Quote.objects.filter(pk__in=[q.pk for q in many]).values_list("pk", "rank"))
    assert all(ranks[quote.pk] == quote.rank for quote in many)


def test_awkward_values_are_stored_as_bulk_create_stores_them(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    """Quotes, backslashes, percent signs and non-ASCII text in the JSON, values with more places than
    their column, a replaced lease, another time zone, an empty list, values of other classes than their
    fields' (a number as text, an int for a boolean): each row equal to bulk_create's, ids in the order of
    the quotes."""
    from zoneinfo import ZoneInfo

    quote_set = quote_create(job=make_job(buyer=buyer, cards=4), limit=4)
    lease = make_lease(job=make_job(buyer=buyer), cluster=east_cluster)
    ours, theirs = _copies(quote_set.quotes, 3), _copies(quote_set.quotes, 3)
    for index, (one, other) in enumerate(zip(ours, theirs, strict=True)):
        for quote in (one, other):
            quote.rank = 100 - index
            quote.breakdown = {
                **quote.breakdown,
                "note": 'a "quoted" \\ back-slashed 100% %s %(x)s 峰谷 \u2028 line',
                "nested": [{"deep": [None, True, 1.5, "x"]}],
            }
            quote.alternatives = []
            quote.cost = Decimal("12.345") + index  # two places in the column: PostgreSQL rounds
            quote.latency_ms = Decimal("3.14159")
            quote.expected_draw = Decimal("0.0000004")
            quote.replaces_id = lease.pk if index % 2 else None
            quote.start_at = quote.start_at.astimezone(ZoneInfo("America/New_York"))
            quote.draw_class = "芯片-x"
            if index % 3 == 0:  # values of other classes than their fields': prepared by the field
                quote.cards = str(quote.cards)
                quote.saving = "0.5"
                quote.balance_sufficient = 1
    _quotes_insert(ours)
    Quote.objects.bulk_create(theirs)
    assert [quote.rank for quote in ours] == [100 - i for i in range(len(ours))]
    rows = {row.pop("id"): row for row in Quote.objects.values("id", *FIELDS)}
    for one, other in zip(ours, theirs, strict=True):
        assert rows[one.pk] == rows[other.pk]
        assert rows[one.pk]["rank"] == one.rank  # the id returned is this quote's row


def test_no_quotes_store_nothing(buyer: Organisation) -> None:
    _quotes_insert([])
    assert not Quote.objects.exists()


def test_quotes_are_built_as_the_keyword_constructor_builds_them(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, django_assert_num_queries
) -> None:
    """quote_create builds its Quote objects positionally (broker.services.quotes._quote_new): each must
    be the object ``Quote(job=job, …)`` gives, with its job cached, and a stray value must fail."""
    job = make_job(buyer=buyer, cards=4)
    quote_set = quote_create(job=job, limit=4)
    assert quote_set.quotes
    for quote in quote_set.quotes:
        values = {name: getattr(quote, name) for name in FIELDS if name != "job_id"}
        keyword = Quote(job=job, **values)
        keyword.pk = quote.pk
        assert {f.attname: getattr(keyword, f.attname) for f in Quote._meta.concrete_fields} == {
            f.attname: getattr(quote, f.attname) for f in Quote._meta.concrete_fields
        }
        with django_assert_num_queries(0):
            assert quote.job is job
            assert quote.replaces is None
        assert quote._state.db == "default" and not quote._state.adding
    with pytest.raises(TypeError, match="not fields of Quote"):
        _quote_new(job, **{**values, "no_such_field": 1})


def test_a_new_quote_is_the_object_the_constructor_builds(buyer: Organisation, east_cluster: Cluster) -> None:
    """_quote_new fills a new object's __dict__ without Model.__init__: the same attributes, the same
    (new, unsaved) state, and a save that inserts it; with a post_init receiver on Quote, the constructor
    runs so the receiver sees the object."""
    from django.db.models.signals import post_init

    job = make_job(buyer=buyer, cards=4)
    quote_set = quote_create(job=job, limit=1)
    values = {name: getattr(quote_set.quotes[0], name) for name in FIELDS if name not in ("job_id", "id")}
    fast = _quote_new(job, **dict(values))
    keyword = Quote(job=job, **values)
    assert fast.__dict__.keys() == keyword.__dict__.keys()
    assert {key: value for key, value in fast.__dict__.items() if key != "_state"} == {
        key: value for key, value in keyword.__dict__.items() if key != "_state"
    }
    assert (fast._state.adding, fast._state.db) == (True, None)
    assert fast.pk is None and fast.job is job and fast.replaces is None
    fast.save()
    assert Quote.objects.filter(pk=fast.pk, job=job, cost=values["cost"]).exists()

    seen: list[Quote] = []

    def receiver(sender: type, instance: Quote, **kwargs: object) -> None:
        seen.append(instance)

    post_init.connect(receiver, sender=Quote)
    try:
        observed = _quote_new(job, **dict(values))
    finally:
        post_init.disconnect(receiver, sender=Quote)
    assert seen == [observed]


def test_quotes_and_their_summary_are_stored_with_one_statement(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    """A quote request's quotes and the job's quote summary are one write. On PostgreSQL that is one
    statement with no transaction of its own (no BEGIN, COMMIT or savepoint round trips); elsewhere one
    transaction."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job = make_job(buyer=buyer, cards=4)
    with CaptureQueriesContext(connection) as captured:
        quote_set = quote_create(job=job, limit=4)
    statements = [str(query["sql"]) for query in captured.captured_queries]
    writes = [sql for sql in statements if "broker_quote" in sql and "INSERT" in sql.upper()]
    assert len(writes) == 1, statements
    if connection.vendor == "postgresql":
        assert 'UPDATE "broker_job"' in writes[0], statements
        assert not [sql for sql in statements if sql.split()[0].upper() in ("SAVEPOINT", "BEGIN")], statements
    stored = Quote.objects.filter(job=job).order_by("rank")
    assert [quote.pk for quote in stored] == [quote.pk for quote in quote_set.quotes]
    job.refresh_from_db()
    assert job.quote_summary["offers"] == len(quote_set.quotes) == 2


@pytest.mark.django_db(transaction=True)
def test_quotes_and_their_summary_are_stored_both_or_neither(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    """With no transaction around the call (autocommit, as a request runs): a summary the database refuses
    leaves no quote stored either (PostgreSQL's jsonb has no \\u0000; SQLite takes it, so there a quote
    whose job does not exist, which the foreign key check refuses at commit)."""
    from django.db import DataError, IntegrityError, connection

    from broker.models import Job
    from broker.services.quotes import _quotes_store

    job = make_job(buyer=buyer, cards=4)
    quote_set = quote_create(job=job, limit=4)
    assert connection.get_autocommit()
    again = _copies(quote_set.quotes, 1)
    summary = {**Job.objects.get(pk=job.pk).quote_summary, "offers": 99, "note": "\x00"}
    if connection.vendor != "postgresql":
        again[-1].job_id = 10**12
    with pytest.raises((DataError, IntegrityError)):
        _quotes_store(again, job_id=job.pk, summary=summary)
    assert Quote.objects.count() == 2
    assert Job.objects.get(pk=job.pk).quote_summary["offers"] == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_request_s_quotes_commit_asynchronously_and_nothing_else_does(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    """Outside a transaction (as a request runs), the quotes' one statement turns ``synchronous_commit`` off
    for its own commit, and the connection's next statements commit as before; inside a transaction the
    caller opened, the statement leaves the caller's commit alone."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    def setting() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            return str(cursor.fetchone()[0])

    def quote_write(captured: CaptureQueriesContext) -> str:
        (write,) = [q["sql"] for q in captured.captured_queries if 'INSERT INTO "broker_quote"' in q["sql"]]
        return str(write)

    job = make_job(buyer=buyer, cards=4)
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = on")  # the session's own setting, whatever the server's
    try:
        assert connection.get_autocommit() and not connection.in_atomic_block
        with CaptureQueriesContext(connection) as captured:
            first = quote_create(job=job, limit=4)
        assert "set_config('synchronous_commit', 'off', true)" in quote_write(captured)
        assert setting() == "on"  # SET LOCAL: it ended with the statement's transaction
        assert len(first.quotes) == 2
        assert sorted(Quote.objects.values_list("pk", flat=True)) == sorted(q.pk for q in first.quotes)

        with transaction.atomic():
            with CaptureQueriesContext(connection) as captured:
                second = quote_create(job=job, limit=4)
            assert "synchronous_commit" not in quote_write(captured)
            assert setting() == "on"
        assert Quote.objects.filter(pk__in=[q.pk for q in second.quotes]).count() == 2
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")


def test_a_quoted_cluster_and_price_card_cannot_be_deleted(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    """The quote's cluster and price card have no constraint in the database (migration 0014): the ORM's
    PROTECT still refuses to delete either while a quote names it, and the quote keeps both."""
    from django.db.models import ProtectedError

    quote = quote_create(job=make_job(buyer=buyer, cards=4), limit=1).quotes[0]
    cluster = Cluster.objects.get(pk=quote.cluster_id)
    for referred in (cluster.price_cards.get(pk=quote.price_card_id), cluster):
        with pytest.raises(ProtectedError) as refused:
            referred.delete()
        assert quote.pk in {row.pk for row in refused.value.protected_objects if isinstance(row, Quote)}
    stored = Quote.objects.select_related("cluster", "price_card").get(pk=quote.pk)
    assert (stored.cluster, stored.price_card_id) == (cluster, quote.price_card_id)


@pytest.mark.django_db(transaction=True)
def test_the_purge_deletes_old_unaccepted_quotes_only_in_batches(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from broker.models import Lease
    from broker.services.quotes import quotes_purge

    now = timezone.now()
    job = make_job(buyer=buyer, cards=4)
    old = [quote.pk for _ in range(3) for quote in quote_create(job=job, limit=4).quotes]  # 6 quotes
    recent = [quote.pk for quote in quote_create(job=job, limit=4).quotes]
    Quote.objects.filter(pk__in=old).update(expires_at=now - timedelta(days=1, seconds=1))
    Quote.objects.filter(pk__in=recent).update(expires_at=now - timedelta(hours=23))
    lease = make_lease(job=job, cluster=east_cluster)
    Lease.objects.filter(pk=lease.pk).update(quote_id=old[0])  # an accepted quote is kept, however old
    with CaptureQueriesContext(connection) as captured:
        assert quotes_purge(now=now, batch=2) == 5
    deletes = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3  # 2 + 2 + 1: each a statement of its own, none reading rows into Python
    assert not [q["sql"] for q in captured.captured_queries if q["sql"].startswith("SELECT")]
    assert sorted(Quote.objects.values_list("pk", flat=True)) == sorted([old[0], *recent])
    assert Lease.objects.get(pk=lease.pk).quote_id == old[0]
    assert quotes_purge(now=now, batch=2) == 0
