"""Buyers' budgets API: budgets (CRUD, with this period's spent / held / remaining), the alerts raised, and
the endpoint alerts are POSTed to with its signing secret.

Members and read tokens read; owners and administrators (or a token they issued with
``can_manage_tokens``) write — 403 ``not_a_budget_manager`` otherwise. Another buyer's budget is 404.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from django.urls import URLPattern, path
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.buyer import IsBuyer
from broker.budgets import selectors, services
from broker.budgets.models import Budget, BudgetAlert, BudgetAlertKind, BudgetScope, DeliveryStatus
from core.api.context import actor_from_request

TAG_BUDGETS = "budgets"
_ID_MAX = 2**63 - 1


class _AmountField(serializers.DecimalField):
    """A CNY amount; "" is refused (DRF would take it for null on a nullable field, which the schema's
    pattern does not allow): null says "none"."""

    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        if isinstance(data, str) and not data.strip():
            self.fail("invalid")
        return super().validate_empty_values(data)


class BudgetInput(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    scope = serializers.ChoiceField(
        choices=BudgetScope.choices,
        default=BudgetScope.ORGANISATION,
        help_text="`organisation`, `member` (give `user_id`), `token` (give `token_id`), `job` (give `job_id`). "
        "A job's budget covers the job's whole life; the others one calendar month in the billing time zone.",
    )
    user_id = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=_ID_MAX)
    token_id = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=_ID_MAX)
    job_id = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=_ID_MAX)
    soft_amount = _AmountField(
        max_digits=16,
        decimal_places=2,
        min_value=Decimal("0.01"),
        required=False,
        allow_null=True,
        help_text="CNY of spend; alerts at `thresholds` percent of it.",
    )
    thresholds = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=1000),
        max_length=services.MAX_THRESHOLDS,
        required=False,
        allow_null=True,
        help_text="Percentages of the soft amount that alert (once each per period). Default [50, 80, 100].",
    )
    hard_cap = _AmountField(
        max_digits=16,
        decimal_places=2,
        min_value=Decimal("0.00"),
        required=False,
        allow_null=True,
        help_text="CNY of spend: an acceptance whose expected cost would take spent + held past it is refused "
        "(409 `budget_cap_exceeded`), and running leases in the scope are stopped once spend reaches it.",
    )
    enabled = serializers.BooleanField(default=True)

    def to_service(self) -> services.BudgetInput:
        values = self.validated_data
        return services.BudgetInput(
            name=values["name"],
            scope=values["scope"],
            user_id=values.get("user_id"),
            token_id=values.get("token_id"),
            job_id=values.get("job_id"),
            soft_amount=values.get("soft_amount"),
            thresholds=values.get("thresholds"),
            hard_cap=values.get("hard_cap"),
            enabled=values["enabled"],
        )


class BudgetOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    scope = serializers.CharField()
    user_id = serializers.IntegerField(allow_null=True)
    user = serializers.CharField(source="user.username", allow_null=True, default=None)
    token_id = serializers.IntegerField(allow_null=True)
    token = serializers.CharField(source="token.name", allow_null=True, default=None)
    job_id = serializers.IntegerField(allow_null=True)
    soft_amount = serializers.DecimalField(max_digits=16, decimal_places=2, allow_null=True)
    thresholds = serializers.ListField(child=serializers.IntegerField())
    hard_cap = serializers.DecimalField(max_digits=16, decimal_places=2, allow_null=True)
    enabled = serializers.BooleanField()
    period = serializers.CharField(help_text="`YYYY-MM` (billing time zone), or `job` for a job's budget.")
    spent = serializers.DecimalField(
        max_digits=16,
        decimal_places=2,
        help_text="Posted spend in the period, CNY (the usage page's figure).",
    )
    held = serializers.DecimalField(
        max_digits=16, decimal_places=2, help_text="Open holds of live leases: expected cost not yet posted."
    )
    remaining = serializers.DecimalField(
        max_digits=17,
        decimal_places=2,
        allow_null=True,
        help_text="Hard cap (else soft amount) − spent − held; may be negative.",
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


def _body(status_: selectors.BudgetStatus) -> dict[str, Any]:
    budget = status_.budget
    return {
        **BudgetOutput(
            {
                **{field: getattr(budget, field) for field in ("id", "name", "scope", "user_id", "token_id")},
                "user": budget.user,
                "token": budget.token,
                "job_id": budget.job_id,
                "soft_amount": budget.soft_amount,
                "thresholds": budget.thresholds,
                "hard_cap": budget.hard_cap,
                "enabled": budget.enabled,
                "period": status_.period_key,
                "spent": status_.spent,
                "held": status_.held,
                "remaining": status_.remaining,
                "created_at": budget.created_at,
                "updated_at": budget.updated_at,
            }
        ).data
    }


def _bodies(buyer_id: int, budgets: list[Budget]) -> list[dict[str, Any]]:
    return [_body(s) for s in selectors.budget_statuses(buyer_id=buyer_id, budgets=budgets)]


class BudgetListApi(generics.ListAPIView):
    """Your budgets with this period's figures; POST creates one."""

    permission_classes = [IsBuyer]
    serializer_class = BudgetOutput
    queryset = Budget.objects.none()

    def get_queryset(self) -> QuerySet[Budget]:
        return selectors.budget_list_for(buyer=actor_from_request(self.request).organisation)

    @extend_schema(operation_id="budgets_list", tags=[TAG_BUDGETS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        assert page is not None
        return self.get_paginated_response(_bodies(actor_from_request(request).organisation.pk, list(page)))

    @extend_schema(
        operation_id="budgets_create",
        request=BudgetInput,
        responses={201: BudgetOutput},
        description="Create a budget. 400 `budget_invalid` with `extra.fields` (a second budget for the same "
        "scope target is refused too); 403 `not_a_budget_manager` unless an owner or administrator, or a "
        "token issued with `can_manage_tokens`.",
        tags=[TAG_BUDGETS],
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        data = BudgetInput(data=request.data)
        data.is_valid(raise_exception=True)
        budget = services.budget_create(buyer=actor.organisation, data=data.to_service(), actor=actor)
        budget = selectors.budget_get_for(buyer=actor.organisation, budget_id=budget.pk)
        return Response(_bodies(actor.organisation.pk, [budget])[0], status=status.HTTP_201_CREATED)


class BudgetDetailApi(APIView):
    permission_classes = [IsBuyer]

    @extend_schema(operation_id="budgets_get", responses={200: BudgetOutput}, tags=[TAG_BUDGETS])
    def get(self, request: Request, budget_id: int) -> Response:
        buyer = actor_from_request(request).organisation
        return Response(_bodies(buyer.pk, [selectors.budget_get_for(buyer=buyer, budget_id=budget_id)])[0])

    @extend_schema(
        operation_id="budgets_update",
        request=BudgetInput,
        responses={200: BudgetOutput},
        description="Replace a budget's settings. Raising a cap above the spend lets the scope's leases run "
        "again; thresholds already alerted in the period are not alerted again.",
        tags=[TAG_BUDGETS],
    )
    def put(self, request: Request, budget_id: int) -> Response:
        actor = actor_from_request(request)
        budget = selectors.budget_get_for(buyer=actor.organisation, budget_id=budget_id)
        data = BudgetInput(data=request.data)
        data.is_valid(raise_exception=True)
        services.budget_update(budget=budget, data=data.to_service(), actor=actor)
        budget = selectors.budget_get_for(buyer=actor.organisation, budget_id=budget_id)
        return Response(_bodies(actor.organisation.pk, [budget])[0])

    @extend_schema(operation_id="budgets_delete", request=None, responses={204: None}, tags=[TAG_BUDGETS])
    def delete(self, request: Request, budget_id: int) -> Response:
        actor = actor_from_request(request)
        budget = selectors.budget_get_for(buyer=actor.organisation, budget_id=budget_id)
        services.budget_delete(budget=budget, actor=actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


class BudgetAlertOutput(serializers.Serializer):
    id = serializers.IntegerField()
    budget_id = serializers.IntegerField()
    budget = serializers.CharField(source="budget.name")
    period = serializers.CharField(source="period_key")
    kind = serializers.ChoiceField(choices=BudgetAlertKind.choices)
    percent = serializers.IntegerField()
    limit = serializers.DecimalField(source="limit_amount", max_digits=16, decimal_places=2)
    spent = serializers.DecimalField(max_digits=16, decimal_places=2)
    created_at = serializers.DateTimeField()
    email_status = serializers.ChoiceField(choices=DeliveryStatus.choices)
    webhook_status = serializers.ChoiceField(choices=DeliveryStatus.choices)
    attempts = serializers.IntegerField()
    last_error = serializers.CharField()


class BudgetAlertListApi(generics.ListAPIView):
    """Alerts raised for your budgets, newest first: one per threshold (or the cap) per period."""

    permission_classes = [IsBuyer]
    serializer_class = BudgetAlertOutput
    queryset = BudgetAlert.objects.none()

    def get_queryset(self) -> QuerySet[BudgetAlert]:
        return selectors.alert_list_for(buyer=actor_from_request(self.request).organisation)

    @extend_schema(operation_id="budget_alerts_list", tags=[TAG_BUDGETS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class BuyerEndpointOutput(serializers.Serializer):
    url = serializers.CharField()
    enabled = serializers.BooleanField(help_text="True once a secret was issued (and not disabled since).")


class BuyerEndpointApi(APIView):
    """Where budget alerts are POSTed: `{id, type ("budget.threshold" | "budget.cap"), budget, period, percent,
    limit, spent, currency, at, message}` with `X-Cardhour-Event`, `X-Cardhour-Delivery`,
    `X-Cardhour-Timestamp` and `X-Cardhour-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`
    under your secret (see `buyer/endpoint-secret`), as operators' lease events. https only; the host must
    resolve to public addresses. A non-2xx answer is retried with backoff (5 s doubling, at most an hour
    apart, 12 attempts)."""

    permission_classes = [IsBuyer]

    class Input(serializers.Serializer):
        url = serializers.URLField(max_length=500, allow_blank=True, help_text="Empty: no endpoint.")

    @extend_schema(
        operation_id="buyer_endpoint_get", responses={200: BuyerEndpointOutput}, tags=[TAG_BUDGETS]
    )
    def get(self, request: Request) -> Response:
        endpoint = selectors.buyer_endpoint_for(buyer=actor_from_request(request).organisation)
        return Response(
            BuyerEndpointOutput(
                {"url": endpoint.url if endpoint else "", "enabled": bool(endpoint and endpoint.enabled)}
            ).data
        )

    @extend_schema(
        operation_id="buyer_endpoint_set",
        request=Input,
        responses={200: BuyerEndpointOutput},
        description="400 `endpoint_url_forbidden` for a URL the SSRF rules refuse.",
        tags=[TAG_BUDGETS],
    )
    def put(self, request: Request) -> Response:
        actor = actor_from_request(request)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint = services.buyer_endpoint_set(
            buyer=actor.organisation, url=data.validated_data["url"], actor=actor
        )
        return Response(BuyerEndpointOutput({"url": endpoint.url, "enabled": endpoint.enabled}).data)


class BuyerEndpointSecretApi(APIView):
    """POST issues a new signing secret for budget alerts (shown once) and enables the POSTs; the old one
    stops signing at once. DELETE stops the POSTs and forgets the secret (e-mail and notices go on)."""

    permission_classes = [IsBuyer]

    class Output(serializers.Serializer):
        secret = serializers.CharField(help_text="Shown once: store it now.")
        enabled = serializers.BooleanField()

    @extend_schema(
        operation_id="buyer_endpoint_secret_rotate", request=None, responses={200: Output}, tags=[TAG_BUDGETS]
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        endpoint = services.buyer_endpoint_secret_rotate(buyer=actor.organisation, actor=actor)
        return Response(self.Output(endpoint).data)

    @extend_schema(
        operation_id="buyer_endpoint_secret_delete", request=None, responses={204: None}, tags=[TAG_BUDGETS]
    )
    def delete(self, request: Request) -> Response:
        actor = actor_from_request(request)
        services.buyer_endpoint_disable(buyer=actor.organisation, actor=actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


urlpatterns: list[URLPattern] = [
    path("budgets", BudgetListApi.as_view(), name="budget-list"),
    path("budgets/<int:budget_id>", BudgetDetailApi.as_view(), name="budget-detail"),
    path("budget-alerts", BudgetAlertListApi.as_view(), name="budget-alert-list"),
    path("buyer/endpoint", BuyerEndpointApi.as_view(), name="buyer-endpoint"),
    path("buyer/endpoint-secret", BuyerEndpointSecretApi.as_view(), name="buyer-endpoint-secret"),
]
