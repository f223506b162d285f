"""The quote answer rendered by hand (broker.api.quote_render) is exactly what the declared serializers
(QuoteSetOutput and its nested serializers, the OpenAPI schema's source) render: varied markets, jobs,
buyers and times, compared as JSON text so that a type (a string for a number, 1 for true) or a key order
that differs fails too, and a field added to one side only fails."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal, InvalidOperation, localcontext
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone
from rest_framework import serializers
from rest_framework.test import APIClient

from broker.api.buyer import QuoteSetOutput, quote_body, quote_set_body
from broker.api.quote_render import quote_set_render
from broker.models import Job, Quote
from broker.services.quotes import QuoteSet, quote_create
from core.models import Organisation
from federation.models import Cluster
from tests.broker.conftest import A800, ASCEND, H800
from tests.broker.factories import make_job, make_lease, make_reliability
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

SHANGHAI = ZoneInfo("Asia/Shanghai")
DAY = datetime(2027, 3, 10, tzinfo=SHANGHAI)  # a Wednesday, as in test_offers.py


def at(hours: float, days: int = 0) -> datetime:
    return DAY + timedelta(days=days, hours=hours)


def both(quote_set: QuoteSet) -> tuple[str, str]:
    """(by hand, by the serializers), as JSON text with the API's renderer settings."""
    by_hand = quote_set_render(quote_set)
    by_serializers = QuoteSetOutput(quote_set_body(quote_set)).data
    return (
        json.dumps(by_hand, ensure_ascii=False, separators=(",", ":")),
        json.dumps(by_serializers, ensure_ascii=False, separators=(",", ":")),
    )


def assert_same(quote_set: QuoteSet) -> dict[str, Any]:
    by_hand, by_serializers = both(quote_set)
    assert by_hand == by_serializers
    answer: dict[str, Any] = json.loads(by_hand)
    return answer


@pytest.fixture
def market(east_cluster: Cluster, west_cluster: Cluster) -> dict[str, Cluster]:
    """East (A800, Guangdong's tariff) and west (A800, the operator's own tariff, a reliability score with
    interruptions) from the broker fixtures; an H800 cluster in the Greater Bay Area with a service level
    and credit tiers and a low score; an Ascend cluster in Chengdu-Chongqing on the flat tariff, new (the
    prior)."""
    make_reliability(cluster=west_cluster, percent="99.871", interruptions=3)
    gba = make_cluster(
        operator=OperatorFactory(slug="cmcc", name="China Mobile"),
        hub="gba",
        name="sz-ai02",
        accelerator=H800,
        islands=[("isl-01", 16), ("isl-02", 16), ("isl-03", 8)],
        site="Shenzhen",
    )
    make_price_card(
        cluster=gba,
        rate="31.5000",
        tariff_code="cn-gd",
        sla_availability_percent="99.5",
        sla_credit_schedule=[
            {"below_percent": "99.5", "credit_percent": "10"},
            {"below_percent": "99", "credit_percent": "25"},
        ],
    )
    make_reliability(cluster=gba, percent="98.25", interruptions=7)
    cy = make_cluster(
        operator=OperatorFactory(slug="sugon", name="Sugon"),
        hub="cy",
        name="cd-ai01",
        accelerator=ASCEND,
        islands=[("isl-01", 8), ("isl-02", 8), ("isl-03", 8), ("isl-04", 4)],
        site="Chengdu",
    )
    make_price_card(cluster=cy, rate="7.3333", tariff_code="flat")
    return {"east": east_cluster, "west": west_cluster, "gba": gba, "cy": cy}


JOBS: list[dict[str, Any]] = [
    {},  # 8 cards, any chip, from yrd, two hours
    {"cards": 1, "duration_seconds": 900},
    {"cards": 4, "origin_hub": "gba", "latency_budget_ms": 40, "preference": "latency"},
    {"cards": 16, "gang": "cluster", "duration_seconds": 5 * 3600},
    {"cards": 40, "gang": "cluster", "latency_budget_ms": 60},
    {"cards": None, "standard_cards": Decimal("3.5000"), "duration_seconds": 3 * 3600},
    {"cards": None, "standard_cards": Decimal("20"), "gang": "cluster"},
    {"accelerators": [H800], "preference": "adjusted"},
    {"accelerators": [ASCEND, A800], "preference": "weighted", "price_weight": Decimal("0.350")},
    {"min_reliability": Decimal("99.500"), "duration_seconds": 7 * 3600 + 1800},
    {"max_price_per_card_hour": Decimal("5.2500")},
    {"min_fp16_tflops": Decimal("500.000"), "min_memory_gb": Decimal("64.0")},
    {"fabrics": ["infiniband"], "earliest_start_at": at(13.25), "deadline_at": at(3, days=2)},
    {"earliest_start_at": at(22.5), "deadline_at": at(23, days=1), "duration_seconds": 9 * 3600},
    # Nothing fits: the answer is the rejections and the nearest relaxations.
    {"cards": 64, "latency_budget_ms": 10},
    {"accelerators": ["huawei-ascend-910c"], "latency_budget_ms": 5},
    {"max_price_per_card_hour": Decimal("0.0100")},
    {"min_reliability": Decimal("100.000")},
    {"cluster_key": "east", "cards": 12},
]


def _job(buyer: Organisation, market: dict[str, Cluster], overrides: dict[str, Any]):  # type: ignore[no-untyped-def]
    values = {"earliest_start_at": at(0), "deadline_at": at(0, days=2), **overrides}
    if "cluster_key" in values:
        values["cluster"] = market[values.pop("cluster_key")]
    return make_job(buyer=buyer, **values)


def test_the_answer_by_hand_is_the_serializers_answer_for_varied_quote_sets(
    funded_buyer: Organisation, market: dict[str, Cluster]
) -> None:
    poor = BuyerFactory(slug="poor", name="Poor AI")  # no packs: every draw uncovered
    h800_only = BuyerFactory(slug="h8", name="H8 Labs")
    make_paid_pack(buyer=h800_only, accelerator=H800, card_hours=3, price="120.00", key="h8-small")
    # Held cards: some starts and islands are taken, so the offers move in time.
    make_lease(job=make_job(buyer=poor), cluster=market["east"], start_at=at(0), end_at=at(6))
    make_lease(job=make_job(buyer=poor), cluster=market["cy"], island="isl-02", start_at=at(1), end_at=at(30))
    seen = {"quotes": 0, "empty": 0, "relaxations": 0, "plans_paid": 0, "alternatives": 0, "credit": 0}
    seen |= {"prior": 0, "scored": 0, "standard": 0, "limits": 0}
    for buyer in (funded_buyer, poor, h800_only):
        for overrides in JOBS:
            job = _job(buyer, market, overrides)
            for now, limit in ((at(0), 10), (at(0.75), 3), (at(5.5), 1)):
                if now > job.earliest_start_at + timedelta(hours=1):
                    continue
                answer = assert_same(quote_create(job=job, now=now, limit=limit))
                seen["quotes"] += len(answer["quotes"])
                seen["empty"] += not answer["quotes"]
                seen["relaxations"] += len(answer["relaxations"])
                seen["limits"] += limit < 10 and len(answer["quotes"]) == limit
                for quote in answer["quotes"]:
                    plan = quote["draw_plan"]
                    seen["plans_paid"] += bool(plan and plan["paid_by"])
                    seen["alternatives"] += bool(quote["alternatives"])
                    seen["credit"] += quote["expected_credit"] not in (None, "0.00")
                    seen["prior"] += quote["reliability"]["prior"]
                    seen["scored"] += not quote["reliability"]["prior"]
                    seen["standard"] += quote["expected_standard_draw"] is not None
    # Every shape of the answer was compared, not only the easy ones.
    assert all(seen.values()), seen


def test_parts_shared_between_quotes_render_as_each_quotes_own(
    funded_buyer: Organisation, market: dict[str, Cluster]
) -> None:
    """A request's quotes share one draw plan and one bands document when they are priced alike (each
    rendered once per answer): the answer is the serializer's whether the parts are one object, equal
    copies or different."""
    quote_set = next(
        quote_set
        for overrides in JOBS
        if len((quote_set := quote_create(job=_job(funded_buyer, market, overrides), now=at(0))).quotes) >= 3
    )
    first, second, third, *_ = quote_set.quotes
    assert first.breakdown["draw_plan"] is not None
    second.breakdown = {**second.breakdown, "bands": first.breakdown["bands"]}
    second.breakdown["draw_plan"] = first.breakdown["draw_plan"]
    third.breakdown = {**third.breakdown, "bands": copy.deepcopy(first.breakdown["bands"])}
    third.breakdown["draw_plan"] = copy.deepcopy(first.breakdown["draw_plan"])
    answer = assert_same(quote_set)
    assert answer["quotes"][1]["bands"] == answer["quotes"][0]["bands"] == answer["quotes"][2]["bands"]
    assert answer["quotes"][1]["draw_plan"] == answer["quotes"][0]["draw_plan"]


def test_the_answer_by_hand_follows_the_time_zone_and_the_decimal_context(
    funded_buyer: Organisation, market: dict[str, Cluster]
) -> None:
    quote_set = quote_create(job=_job(funded_buyer, market, {"gang": "cluster"}), now=at(0))
    nothing = quote_create(job=_job(funded_buyer, market, {"cards": 64, "latency_budget_ms": 10}), now=at(0))
    for zone in ("UTC", "Asia/Shanghai", "America/New_York"):
        with timezone.override(zone):
            answer = assert_same(quote_set)
            assert_same(nothing)
        suffix = {"UTC": "Z", "Asia/Shanghai": "+08:00", "America/New_York": "-05:00"}[zone]
        assert answer["quotes"][0]["start_at"].endswith(suffix)
    with localcontext() as context:
        context.rounding = ROUND_DOWN
        assert_same(quote_set)


def test_a_field_on_one_side_only_is_caught(funded_buyer: Organisation, market: dict[str, Cluster]) -> None:
    """The comparison above would fail if the serializers gained a field the renderer lacks (or lost one
    it writes): checked here by adding one, as a change to buyer.py would."""
    quote_set = quote_create(job=_job(funded_buyer, market, {}), now=at(0))
    assert quote_set.quotes
    by_hand, by_serializers = both(quote_set)
    assert by_hand == by_serializers
    reference = QuoteSetOutput()
    reference.fields["quotes"].child.fields["added"] = serializers.CharField(default="x")
    widened = json.dumps(reference.to_representation(quote_set_body(quote_set)), separators=(",", ":"))
    assert json.loads(widened)["quotes"][0]["added"] == "x"
    assert widened != by_hand


def _client_and_job(buyer: Organisation, market: dict[str, Cluster]) -> tuple[APIClient, Job]:
    """A client with a token of ``buyer`` and a job of it starting in five minutes, a day long."""
    from core.services import api_token_create

    _, raw = api_token_create(organisation=buyer, name="t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    job = _job(buyer, market, {"earliest_start_at": timezone.now() + timedelta(minutes=5)})
    job.deadline_at = job.earliest_start_at + timedelta(days=1)
    job.save(update_fields=["deadline_at"])
    return client, job


def test_the_endpoint_answers_the_serializers_rendering(
    funded_buyer: Organisation, market: dict[str, Cluster]
) -> None:
    client, job = _client_and_job(funded_buyer, market)
    response = client.post(f"/api/v1/jobs/{job.pk}/quotes", {"limit": 4}, format="json")
    assert response.status_code == 201, response.content
    assert response["Content-Type"] == "application/json"
    answer = json.loads(response.content)
    assert 1 <= len(answer["quotes"]) <= 4
    # The same quotes rendered by the serializers from the rows the request stored.
    stored = {quote.pk: quote for quote in Quote.objects.filter(job=job)}
    assert sorted(stored) == sorted(quote["id"] for quote in answer["quotes"])
    reference = QuoteSetOutput().fields["quotes"].child
    for quote in answer["quotes"]:
        assert quote == json.loads(json.dumps(reference.to_representation(quote_body(stored[quote["id"]]))))


def _dec_and_field(value: Any, field: serializers.DecimalField, context: Any) -> tuple[Any, Any]:
    """(quote_render._dec's string, the field's) for ``value`` in ``context`` (the field's precision), each
    the type of the exception raised instead when one is."""
    from broker.api.quote_render import _dec

    try:
        got: Any = _dec(value, field.decimal_places, context)
    except Exception as error:
        got = type(error)
    try:
        expected: Any = field.to_representation(value)
    except Exception as error:
        expected = type(error)
    return got, expected


@pytest.mark.parametrize(
    "text",
    [
        "12.50",
        "-0.00",
        "0.00",
        "0.05",
        "00.50",
        "12.5",
        "12.500",
        "1E+1",
        "1.2E-3",
        " 12.50",
        "12.50 ",
        "+12.50",
        "NaN",
        "-Infinity",
        "١٢.٥٠",
        "12345678901234.56",
        "123456789012345.67",
        "99999999999999.99",
        "0.000001",
        "0.0000010",
        "1.000000",
        "123456789012345678901.000000",
        "1",
        "-1",
        "0",
        "-0",
        "12.",
        ".5",
        "1.5",
        "-12.5",
        "0.1",
        "-0.1",
        "0.001",
        "1.0000",
        "12345678901234",
        "123456789012345",
        "1234567890123456",
        "99999999999999.9",
        "999999999999999.9",
        "12345678901234567890",
        "0.0000001",
    ],
)
@pytest.mark.parametrize(("places", "max_digits"), [(2, 16), (3, 6), (4, 8), (6, 20), (6, 16)])
def test_a_decimal_string_renders_as_the_serializer_field_renders_it(
    text: str, places: int, max_digits: int
) -> None:
    """broker.api.quote_render._dec returns most strings as they are (already at the field's places): it
    must give what DecimalField gives for any string, or fail as it fails."""
    from decimal import Context, getcontext

    field = serializers.DecimalField(max_digits=max_digits, decimal_places=places)
    context = getcontext().copy()
    context.prec = max_digits
    got, expected = _dec_and_field(text, field, Context.copy(context))
    assert got == expected


def test_decimal_strings_of_every_shape_render_as_the_serializer_fields_render_them() -> None:
    """_dec's fast path (an exact string padded with zeros to the field's places) against DecimalField over
    generated strings: signs, integer parts of every length about each precision, fractions shorter,
    equal to and longer than the places, leading fraction zeros, in the default and a ROUND_DOWN
    context."""
    from decimal import Context, getcontext

    integers = (
        ["0", "1", "7", "10", "99", "100"]
        + ["9" * n for n in range(3, 23)]
        + ["1" + "0" * n for n in range(3, 23)]
    )
    fractions = [
        None,
        "0",
        "5",
        "05",
        "50",
        "000",
        "125",
        "0001",
        "9999",
        "00000",
        "000001",
        "123456",
        "1234567",
    ]
    texts: list[Any] = [
        sign + integer + ("" if fraction is None else "." + fraction)
        for sign in ("", "-")
        for integer in integers
        for fraction in fractions
    ]
    for rounding in (None, ROUND_DOWN):
        for places, max_digits in [(0, 6), (2, 16), (3, 6), (3, 14), (4, 8), (4, 12), (6, 16), (6, 20)]:
            field = serializers.DecimalField(max_digits=max_digits, decimal_places=places)
            with localcontext() as local:
                if rounding is not None:
                    local.rounding = rounding
                context = getcontext().copy()
                context.prec = max_digits
                for text in texts:
                    for value in (text, Decimal(text)):
                        got, expected = _dec_and_field(value, field, Context.copy(context))
                        assert got == expected, (value, places, max_digits, rounding)


def test_an_answer_remembers_only_what_converts_alike() -> None:
    """quote_render._Render remembers each decimal and time it wrote within one answer. A remembered
    value must be one that converts alike: the same string at other places or another precision, an
    equal Decimal with another exponent, a string and a Decimal of the same digits, an equal instant in
    another zone or as ISO text, and a naive time (not remembered) — each as converted afresh."""
    from decimal import getcontext

    from broker.api.quote_render import _dec, _Render

    render = _Render()
    cases = [
        ("0.5", 2, render.c16),
        ("0.5", 4, render.c8),
        ("0.5", 2, render.c16),
        (Decimal("1.5"), 2, render.c16),
        (Decimal("1.50"), 2, render.c16),
        (Decimal("1.500000"), 6, render.c20),
        ("1.5", 2, render.c16),
        ("12345678901234.678", 2, render.c16),  # rounds: the long way, remembered too
        ("12345678901234.678", 2, render.c16),
        (None, 2, render.c16),
    ]
    for value, places, context in cases:
        assert render.dec(value, places, context) == _dec(value, places, context), (value, places)
    assert render.dec("12345678901234.678", 2, render.c16) == "12345678901234.68"
    for _ in range(2):  # the field's own error (quantize's), raised each time it is asked
        with pytest.raises(InvalidOperation):
            render.dec("1" * 30, 2, render.c16)
    assert getcontext().prec == 28  # the thread's own context untouched

    utc = datetime(2026, 11, 27, 2, 0, tzinfo=ZoneInfo("UTC"))
    shanghai = utc.astimezone(ZoneInfo("Asia/Shanghai"))
    naive = datetime(2026, 11, 27, 2, 0)
    with timezone.override(ZoneInfo("Asia/Shanghai")):
        render = _Render()
        for value in (utc, shanghai, utc.isoformat(), shanghai.isoformat(), naive, naive, utc, naive):
            expected = "2026-11-27T02:00:00+08:00" if value is naive else "2026-11-27T10:00:00+08:00"
            assert render.time(value) == _Render().time(value) == expected, value
    with timezone.override(ZoneInfo("UTC")):
        render = _Render()
        assert [render.time(v) for v in (shanghai, utc, naive)] == ["2026-11-27T02:00:00Z"] * 3


@pytest.mark.parametrize(
    "data",
    [
        {},
        [],
        {"a": None, "b": True, "c": False, "d": 0, "e": -1, "f": 2**62, "g": "", "h": [[], {}]},
        {"text": "上海 ümlaut é ☃ 😀", "controls": "".join(chr(n) for n in range(32)) + '"\\/\x7f'},
        {"separators": "\u2028 and \u2029 inside", "\u2028key": "\u2029"},
        {"money": ["12.50", "-0.00", "123456789012345.67"], "nested": {"deep": [{"x": [1, "2", None]}]}},
    ],
)
def test_the_fast_encoder_writes_the_json_renderers_bytes(data: Any) -> None:
    """quote_render._json_bytes (pydantic-core) gives byte for byte what the API's JSONRenderer gives."""
    from rest_framework.renderers import JSONRenderer

    from broker.api.quote_render import _json_bytes

    assert _json_bytes(data) == JSONRenderer().render(data)


def test_the_endpoint_writes_the_json_renderers_bytes_and_honours_an_indent(
    funded_buyer: Organisation, market: dict[str, Cluster]
) -> None:
    """The quote request's answer is the bytes JSONRenderer writes for quote_set_render's answer, with the
    same status and headers as a DRF Response; a client asking for ``indent`` gets DRF's indented JSON."""
    from rest_framework.renderers import JSONRenderer

    from broker.api.quote_render import quote_set_json

    client, job = _client_and_job(funded_buyer, market)
    response = client.post(f"/api/v1/jobs/{job.pk}/quotes", {"limit": 5}, format="json")
    assert response.status_code == 201
    assert response["Content-Type"] == "application/json"
    assert "Allow" in response and "Accept" in response.get("Vary", "")
    answer = json.loads(response.content)
    assert answer["quotes"]
    quote_set = quote_create(job=job, limit=5)
    assert quote_set_json(quote_set) == JSONRenderer().render(quote_set_render(quote_set))
    assert json.loads(quote_set_json(quote_set)) == json.loads(json.dumps(quote_set_render(quote_set)))

    indented = client.post(
        f"/api/v1/jobs/{job.pk}/quotes", {"limit": 5}, format="json", HTTP_ACCEPT="application/json; indent=2"
    )
    assert indented.status_code == 201
    assert indented.content.startswith(b'{\n  "job"')
    assert json.loads(indented.content)["job"] == job.pk
