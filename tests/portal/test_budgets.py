"""The buyer's Budgets page: the list with spent / held / remaining and a bar, creating and editing a budget
(owners and administrators), read-only for viewers, alerts history, the alert endpoint, and another buyer's
budget answering 404."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client

from broker.budgets.models import Budget, BudgetAlert, BuyerEndpoint
from broker.budgets.services import BudgetInput, budget_create, budgets_evaluate
from core.models import Organisation
from core.types import Actor

pytestmark = pytest.mark.django_db


def test_an_owner_creates_edits_and_deletes_a_budget(buyer_client: Client, buyer: Organisation) -> None:
    page = buyer_client.get("/budgets/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "No budgets yet" in text and 'href="/budgets/"' in text  # in the navigation
    created = buyer_client.post(
        "/budgets/",
        {
            "name": "Team monthly",
            "scope": "organisation",
            "soft_amount": "1000",
            "thresholds": "50, 90",
            "hard_cap": "1200",
            "enabled": "on",
        },
    )
    assert created.status_code == 302, created.content.decode()
    budget = Budget.objects.get(buyer=buyer)
    assert (budget.soft_amount, budget.thresholds, budget.hard_cap) == (
        Decimal("1000.00"),
        [50, 90],
        Decimal("1200.00"),
    )
    listed = buyer_client.get("/budgets/").content.decode()
    assert "Team monthly" in listed and "budget-bar" in listed and "¥1,200.00" in listed
    bad = buyer_client.post(
        "/budgets/", {"name": "again", "scope": "organisation", "hard_cap": "5", "thresholds": ""}
    )
    assert bad.status_code == 400 and "already a budget for this scope" in bad.content.decode()
    edit = buyer_client.get(f"/budgets/{budget.pk}/")
    assert edit.status_code == 200 and 'value="Team monthly"' in edit.content.decode()
    saved = buyer_client.post(
        f"/budgets/{budget.pk}/",
        {
            "name": "Team monthly",
            "scope": "organisation",
            "soft_amount": "",
            "thresholds": "",
            "hard_cap": "900",
            "enabled": "on",
        },
    )
    assert saved.status_code == 302
    budget.refresh_from_db()
    assert (budget.soft_amount, budget.hard_cap) == (None, Decimal("900.00"))
    assert buyer_client.post(f"/budgets/{budget.pk}/delete").status_code == 302
    assert not Budget.objects.exists()


def test_a_viewer_reads_budgets_and_alerts_but_cannot_change_them(
    login: Callable[[User], Client], buyer_user: User, buyer_viewer: User, buyer: Organisation
) -> None:
    budget = budget_create(
        buyer=buyer,
        data=BudgetInput(name="Acme monthly", scope="organisation", soft_amount=Decimal("0.01")),
        actor=Actor(organisation=buyer, user=buyer_user),
    )
    BudgetAlert.objects.create(
        budget=budget,
        period_key="2026-11",
        kind="threshold",
        percent=80,
        limit_amount=Decimal("100.00"),
        spent=Decimal("80.00"),
        created_at=budget.created_at,
        next_attempt_at=budget.created_at,
    )
    viewer = login(buyer_viewer)
    text = viewer.get("/budgets/").content.decode()
    assert "Acme monthly" in text and "80% of ¥100.00" in text and "New budget" not in text
    assert (
        viewer.post("/budgets/", {"name": "x", "scope": "organisation", "hard_cap": "1"}).status_code == 403
    )
    assert viewer.get(f"/budgets/{budget.pk}/").status_code == 403
    assert viewer.post(f"/budgets/{budget.pk}/delete").status_code == 403
    assert viewer.post("/budgets/endpoint", {"action": "rotate"}).status_code == 403
    assert Budget.objects.count() == 1 and not BuyerEndpoint.objects.exists()


def test_another_buyers_budget_is_404(
    other_buyer_client: Client, buyer: Organisation, buyer_user: User
) -> None:
    budget = budget_create(
        buyer=buyer,
        data=BudgetInput(name="acme-only", scope="organisation", hard_cap=Decimal("1")),
        actor=Actor(organisation=buyer, user=buyer_user),
    )
    assert other_buyer_client.get(f"/budgets/{budget.pk}/").status_code == 404
    assert other_buyer_client.post(f"/budgets/{budget.pk}/delete").status_code == 404
    assert "acme-only" not in other_buyer_client.get("/budgets/").content.decode()
    assert Budget.objects.filter(pk=budget.pk).exists()


def test_the_alert_endpoint_secret_is_shown_once(buyer_client: Client, buyer: Organisation) -> None:
    saved = buyer_client.post(
        "/budgets/endpoint", {"action": "url", "url": "https://alerts.example.com/hook"}
    )
    assert saved.status_code == 302
    shown = buyer_client.post("/budgets/endpoint", {"action": "rotate"})
    endpoint = BuyerEndpoint.objects.get(buyer=buyer)
    assert shown.status_code == 200 and endpoint.secret in shown.content.decode()
    assert "no-cache" in shown["Cache-Control"] or "max-age=0" in shown["Cache-Control"]
    assert endpoint.secret not in buyer_client.get("/budgets/").content.decode()


def test_alerts_show_as_notices_on_the_page(
    buyer_client: Client, buyer: Organisation, buyer_user: User
) -> None:
    from broker.budgets.selectors import BudgetStatus
    from broker.budgets.services import _alert_raise

    budget = budget_create(
        buyer=buyer,
        data=BudgetInput(name="Acme monthly", scope="organisation", soft_amount=Decimal("100")),
        actor=Actor(organisation=buyer, user=buyer_user),
    )
    assert budgets_evaluate() == 0  # nothing spent: no alert
    assert "No alerts yet" in buyer_client.get("/budgets/").content.decode()
    status = BudgetStatus(budget=budget, period_key="2026-11", spent=Decimal("80.00"), held=Decimal(0))
    assert _alert_raise(
        status=status, kind="threshold", percent=80, limit=Decimal("100.00"), now=budget.created_at
    )
    text = buyer_client.get("/budgets/").content.decode()
    assert (
        "Budget “Acme monthly” crossed 80 % of its 100.00 CNY soft budget for 2026-11: 80.00 CNY spent."
        in text
    )
