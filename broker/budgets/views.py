"""The buyer's Budgets page: every budget with this period's spent / held / remaining and a progress bar,
a form to create and edit one (owners and administrators), the alerts raised, and the alert endpoint."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from broker.budgets import selectors, services
from broker.budgets.forms import BudgetForm
from broker.budgets.models import JOB_PERIOD, Budget, BudgetScope
from core.errors import DomainError, PermissionDeniedError
from core.forms.accounts import form_add_domain_error
from core.portal import PortalActor, portal_view
from core.types import Actor

ALERTS_PAGE_SIZE = 25


def _portal(request: HttpRequest) -> PortalActor:
    return request.portal  # type: ignore[attr-defined]


def _input(form: BudgetForm) -> services.BudgetInput:
    data = form.cleaned_data
    scope = data["scope"]
    return services.BudgetInput(
        name=data["name"],
        scope=scope,
        user_id=data["user"].pk if scope == BudgetScope.MEMBER and data.get("user") else None,
        token_id=data["token"].pk if scope == BudgetScope.TOKEN and data.get("token") else None,
        job_id=data["job"].pk if scope == BudgetScope.JOB and data.get("job") else None,
        soft_amount=data.get("soft_amount"),
        thresholds=data.get("thresholds") if data.get("soft_amount") is not None else None,
        hard_cap=data.get("hard_cap"),
        enabled=data["enabled"],
    )


def _list_page(request: HttpRequest, *, form: BudgetForm | None = None, status: int = 200) -> HttpResponse:
    portal = _portal(request)
    buyer = portal.organisation
    now = timezone.now()
    alerts = Paginator(selectors.alert_list_for(buyer=buyer), ALERTS_PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    return render(
        request,
        "broker/budgets/list.html",
        {
            "statuses": selectors.budget_status_list_for(buyer=buyer, at=now),
            "period": selectors.month_key(at=now),
            "page": alerts,
            "endpoint": selectors.buyer_endpoint_for(buyer=buyer),
            # The latest alerts as notices, worded in the reader's language (the notice rows keep the English
            # text every stored notice has).
            "notices": [
                {
                    "alert": alert,
                    "period": _("the job's life") if alert.period_key == JOB_PERIOD else alert.period_key,
                }
                for alert in selectors.alert_list_for(buyer=buyer)[:10]
            ],
            "can_manage": portal.can_manage,
            "form": form if form is not None else (BudgetForm(buyer=buyer) if portal.can_manage else None),
        },
        status=status,
    )


@portal_view("buyer", write=True)
def budget_list(request: HttpRequest) -> HttpResponse:
    """The budgets page; a POST (owners and administrators) creates a budget."""
    portal = _portal(request)
    if request.method != "POST":
        return _list_page(request)
    form = BudgetForm(request.POST, buyer=portal.organisation)
    if form.is_valid():
        try:
            budget = services.budget_create(
                buyer=portal.organisation, data=_input(form), actor=_actor(request)
            )
        except PermissionDeniedError:
            raise
        except DomainError as exc:
            form_add_domain_error(form, exc)
        else:
            messages.success(request, _("Budget “%(name)s” created.") % {"name": budget.name})
            return redirect("budget-list")
    return _list_page(request, form=form, status=400)


def _actor(request: HttpRequest) -> Actor:
    portal = _portal(request)
    return Actor(organisation=portal.organisation, user=portal.user, can_write=portal.can_write)


def _manage_only(request: HttpRequest) -> None:
    if not _portal(request).can_manage:
        raise PermissionDenied(_("Only owners and administrators set budgets."))


@portal_view("buyer", write=True)
def budget_edit(request: HttpRequest, budget_id: int) -> HttpResponse:
    """Edit one budget (owners and administrators); members see it on the list."""
    portal = _portal(request)
    budget: Budget = selectors.budget_get_for(buyer=portal.organisation, budget_id=budget_id)
    _manage_only(request)
    if request.method == "POST":
        form = BudgetForm(request.POST, buyer=portal.organisation, budget=budget)
        if form.is_valid():
            try:
                services.budget_update(budget=budget, data=_input(form), actor=_actor(request))
            except PermissionDeniedError:
                raise
            except DomainError as exc:
                form_add_domain_error(form, exc)
            else:
                messages.success(request, _("Budget “%(name)s” saved.") % {"name": form.cleaned_data["name"]})
                return redirect("budget-list")
    else:
        form = BudgetForm(initial=BudgetForm.initial_of(budget), buyer=portal.organisation, budget=budget)
    (status,) = selectors.budget_statuses(buyer_id=portal.organisation.pk, budgets=[budget])
    return render(
        request,
        "broker/budgets/edit.html",
        {"budget": budget, "form": form, "status": status},
        status=400 if form.errors else 200,
    )


@portal_view("buyer", write=True)
@require_POST
def budget_delete(request: HttpRequest, budget_id: int) -> HttpResponse:
    portal = _portal(request)
    budget = selectors.budget_get_for(buyer=portal.organisation, budget_id=budget_id)
    _manage_only(request)
    services.budget_delete(budget=budget, actor=_actor(request))
    messages.success(request, _("Budget “%(name)s” deleted.") % {"name": budget.name})
    return redirect("budget-list")


@portal_view("buyer", write=True)
@require_POST
def budget_endpoint(request: HttpRequest) -> HttpResponse:
    """Set the alert endpoint's URL, issue a new signing secret (shown once, on a page no cache keeps) or
    turn the POSTs off."""
    portal = _portal(request)
    _manage_only(request)
    action = request.POST.get("action", "")
    try:
        if action == "rotate":
            endpoint = services.buyer_endpoint_secret_rotate(buyer=portal.organisation, actor=_actor(request))
            response = render(request, "broker/budgets/secret.html", {"endpoint": endpoint})
            add_never_cache_headers(response)
            return response
        if action == "disable":
            services.buyer_endpoint_disable(buyer=portal.organisation, actor=_actor(request))
            messages.success(request, _("Budget alerts are no longer POSTed to your endpoint."))
        else:
            services.buyer_endpoint_set(
                buyer=portal.organisation, url=request.POST.get("url", "")[:500], actor=_actor(request)
            )
            messages.success(request, _("Alert endpoint saved."))
    except PermissionDeniedError:
        raise
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("budget-list")


urlpatterns: list[URLPattern] = [
    path("budgets/", budget_list, name="budget-list"),
    path("budgets/<int:budget_id>/", budget_edit, name="budget-edit"),
    path("budgets/<int:budget_id>/delete", budget_delete, name="budget-delete"),
    path("budgets/endpoint", budget_endpoint, name="budget-endpoint"),
]
