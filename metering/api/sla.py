"""SLA credit notes over REST (issue 16 item 3): read only. A buyer reads the notes credited to it, an operator
the notes against it; an organisation that is both sees both (``role`` narrows). Notes are issued by the
platform (broker.services.sla → metering.services.sla); disputes are decided by staff in the admin."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.urls import path
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.context import actor_from_request
from core.api.permissions import IsOrganisationMember
from core.money import micros_to_fen
from metering.models import SlaCredit
from metering.selectors import sla as selectors
from metering.services.sla import sla_credit_reason

TAG = "sla-credits"


class SlaCreditOutput(serializers.ModelSerializer):
    buyer = serializers.CharField(source="buyer.slug")
    operator = serializers.CharField(source="operator.slug")
    cpi = serializers.CharField(source="cluster.cpi")
    charge_cny = serializers.SerializerMethodField(help_text="The lease's rated charge, CNY to the fen.")
    credit_cny = serializers.SerializerMethodField(help_text="The part of the charge credited, CNY.")
    buyer_value_cny = serializers.SerializerMethodField(
        help_text="What the buyer got back, CNY: prepaid value of the pack hours returned plus money."
    )
    reason = serializers.SerializerMethodField(help_text="The reason, in the request's language.")
    transfer_id = serializers.IntegerField(help_text="The sla_credit ledger transfer.")
    dispute = serializers.SerializerMethodField()

    class Meta:
        model = SlaCredit
        fields = [
            "id",
            "issued_at",
            "buyer",
            "operator",
            "cpi",
            "lease_id",
            "reference",
            "window_start_at",
            "window_end_at",
            "window_seconds",
            "lost_seconds",
            "excluded_buyer_seconds",
            "excluded_maintenance_seconds",
            "availability_percent",
            "service_level_percent",
            "tier_below_percent",
            "credit_percent",
            "charge_cny",
            "credit_cny",
            "buyer_value_cny",
            "reason",
            "transfer_id",
            "dispute",
        ]

    def get_charge_cny(self, obj: SlaCredit) -> str:
        return str(micros_to_fen(obj.charge_gross))

    def get_credit_cny(self, obj: SlaCredit) -> str:
        return str(micros_to_fen(obj.credit_gross))

    def get_buyer_value_cny(self, obj: SlaCredit) -> str:
        return str(micros_to_fen(obj.credit_buyer_value))

    def get_reason(self, obj: SlaCredit) -> str:
        return sla_credit_reason(obj)

    def get_dispute(self, obj: SlaCredit) -> dict[str, Any] | None:
        dispute = getattr(obj, "dispute", None)
        if dispute is None:
            return None
        return {
            "outcome": dispute.outcome,
            "decided_at": dispute.decided_at.isoformat(),
            "reason": dispute.reason,
            "reversal_transfer_id": dispute.reversal_transfer_id,
        }


class SlaCreditLineOutput(serializers.Serializer):
    to = serializers.ChoiceField(choices=["pack", "arrears", "money"])
    pack_id = serializers.IntegerField(allow_null=True)
    pack_class = serializers.CharField()
    card_hours = serializers.DecimalField(max_digits=20, decimal_places=6)
    value_cny = serializers.DecimalField(max_digits=16, decimal_places=2)
    gross_cny = serializers.DecimalField(max_digits=16, decimal_places=2)


class SlaCreditListApi(generics.ListAPIView):
    """SLA credit notes you are party to, newest first."""

    permission_classes = [IsOrganisationMember]
    serializer_class = SlaCreditOutput
    queryset = SlaCredit.objects.none()  # for the schema; requests use get_queryset

    class Query(serializers.Serializer):
        role = serializers.ChoiceField(
            choices=[selectors.ROLE_BUYER, selectors.ROLE_OPERATOR], required=False
        )

    def get_queryset(self) -> QuerySet[SlaCredit]:
        if self.request.query_params.get("role") == "":  # as the strict filter backend: empty is not "any"
            raise serializers.ValidationError({"role": ["Give a value, or leave the parameter out."]})
        query = self.Query(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        return selectors.sla_credit_list_for(
            organisation=actor_from_request(self.request).organisation, role=query.validated_data.get("role")
        )

    @extend_schema(operation_id="sla_credits_list", parameters=[Query], tags=[TAG])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class SlaCreditDetailApi(APIView):
    """One SLA credit note with what each pack (or the money balance) got back; another's answers 404."""

    permission_classes = [IsOrganisationMember]

    class Output(SlaCreditOutput):
        lines = serializers.SerializerMethodField()

        class Meta(SlaCreditOutput.Meta):
            fields = [*SlaCreditOutput.Meta.fields, "lines"]

        @extend_schema_field(SlaCreditLineOutput(many=True))
        def get_lines(self, obj: SlaCredit) -> list[dict[str, Any]]:
            return [dict(SlaCreditLineOutput(line).data) for line in selectors.sla_credit_lines(obj)]

    @extend_schema(operation_id="sla_credits_get", responses={200: Output}, tags=[TAG])
    def get(self, request: Request, credit_id: int) -> Response:
        credit = selectors.sla_credit_get_for(
            organisation=actor_from_request(request).organisation, credit_id=credit_id
        )
        return Response(self.Output(credit).data)


urlpatterns = [
    path("sla-credits", SlaCreditListApi.as_view(), name="sla-credit-list"),
    path("sla-credits/<int:credit_id>", SlaCreditDetailApi.as_view(), name="sla-credit-detail"),
]
