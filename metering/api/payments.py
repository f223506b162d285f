"""Card-hour packs over REST: the catalogue, a buyer's orders and packs, and Stripe's webhook.

The catalogue is open to every authenticated organisation; orders and packs are a buyer's own (another
buyer's order answers 404, an organisation that is not a buyer 403 ``not_a_buyer``). Paying happens in
the browser with Stripe.js and the PaymentIntent's client secret; the pack is credited when Stripe's
webhook reports the payment, never by this API.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet
from django.urls import path
from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import generics, serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.context import actor_from_request
from core.api.permissions import IsOrganisationMember
from core.api.schema import ErrorSerializer
from core.money import from_micros
from metering.errors import NotABuyerError
from metering.models import Pack, PackOrder, PackProduct, pack_class_key
from metering.selectors import payments as selectors
from metering.services import payments as services

TAG_PACKS = "packs"


class IsBuyer(IsOrganisationMember):
    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        organisation = actor_from_request(request).organisation
        if not organisation.is_buyer:
            raise NotABuyerError(
                _("%(organisation)s is not a buyer organisation.") % {"organisation": organisation.slug}
            )
        return True


def _accelerator_slug(obj: PackProduct | PackOrder | Pack) -> str | None:
    return obj.accelerator.slug if obj.accelerator is not None else None


# --- Catalogue --------------------------------------------------------------------------------------


class PackProductOutput(serializers.Serializer):
    code = serializers.SlugField()
    name = serializers.CharField()
    pack_class = serializers.SerializerMethodField(
        help_text="`std` for standard cards, else the chip's slug."
    )
    accelerator = serializers.SerializerMethodField(
        help_text="The chip the card-hours are for; null for standard cards (usable on any chip at its "
        "standard-card factor)."
    )
    card_hours = serializers.IntegerField()
    price = serializers.DecimalField(max_digits=14, decimal_places=2, help_text="Tax included.")
    currency = serializers.CharField()
    validity_days = serializers.IntegerField()

    def get_pack_class(self, product: PackProduct) -> str:
        return pack_class_key(_accelerator_slug(product))

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_accelerator(self, product: PackProduct) -> str | None:
        return _accelerator_slug(product)


class PackProductListApi(generics.ListAPIView):
    """The packs on sale."""

    permission_classes = [IsOrganisationMember]
    serializer_class = PackProductOutput

    def get_queryset(self) -> QuerySet[PackProduct]:
        return selectors.pack_product_list()

    @extend_schema(operation_id="pack_products_list", tags=[TAG_PACKS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


# --- Orders -----------------------------------------------------------------------------------------


class PackOrderOutput(serializers.Serializer):
    id = serializers.IntegerField()
    product = serializers.CharField(source="product.code")
    pack_class = serializers.SerializerMethodField()
    accelerator = serializers.SerializerMethodField()
    quantity = serializers.IntegerField()
    card_hours = serializers.IntegerField()
    amount = serializers.DecimalField(max_digits=14, decimal_places=2)
    currency = serializers.CharField()
    validity_days = serializers.IntegerField()
    # Plain strings rather than enums: two `status` enums would collide in the OpenAPI components
    # (drf-spectacular W001) unless ENUM_NAME_OVERRIDES names them.
    status = serializers.CharField(help_text=f"One of: {', '.join(PackOrder.Status.values)}.")
    failure_code = serializers.CharField()
    failure_message = serializers.CharField()
    livemode = serializers.BooleanField()
    idempotency_key = serializers.CharField()
    created_at = serializers.DateTimeField()
    paid_at = serializers.DateTimeField(allow_null=True)
    pack = serializers.SerializerMethodField(help_text="The credited pack's id, once paid.")

    def get_pack_class(self, order: PackOrder) -> str:
        return pack_class_key(_accelerator_slug(order))

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_accelerator(self, order: PackOrder) -> str | None:
        return _accelerator_slug(order)

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_pack(self, order: PackOrder) -> int | None:
        pack = getattr(order, "pack", None)
        return pack.pk if pack is not None else None


class PackOrderFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=PackOrder.Status.choices)

    class Meta:
        model = PackOrder
        fields = ["status"]


class PackOrderListApi(generics.ListAPIView):
    """The buyer's pack orders, or order packs (POST)."""

    permission_classes = [IsBuyer]
    serializer_class = PackOrderOutput
    filterset_class = PackOrderFilter
    queryset = PackOrder.objects.none()  # for the schema; requests use get_queryset

    class Input(serializers.Serializer):
        product = serializers.SlugField(max_length=64, help_text="A product code from /pack-products.")
        quantity = serializers.IntegerField(min_value=1, max_value=services.MAX_ORDER_QUANTITY, default=1)
        idempotency_key = serializers.CharField(
            max_length=200,
            help_text="Chosen by the client, unique per order: repeating it returns the same order.",
        )

    class CreateOutput(PackOrderOutput):
        class Payment(serializers.Serializer):
            payment_intent = serializers.CharField(help_text="The Stripe PaymentIntent id.")
            payment_intent_status = serializers.CharField()
            client_secret = serializers.CharField(help_text="For Stripe.js `confirmCardPayment`.")
            publishable_key = serializers.CharField()
            stripe_js_url = serializers.CharField()
            mode = serializers.ChoiceField(
                choices=[("test", "test"), ("live", "live")],
                help_text="`test` unless the platform runs on live Stripe keys: show it on every page.",
            )
            localstripe = serializers.BooleanField(help_text="Payments go to a local Stripe stand-in.")

        payment = Payment()

    def get_queryset(self) -> QuerySet[PackOrder]:
        return selectors.pack_order_list_for(buyer=actor_from_request(self.request).organisation)

    @extend_schema(operation_id="pack_orders_list", tags=[TAG_PACKS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        operation_id="pack_orders_create",
        request=Input,
        responses={201: CreateOutput, 200: CreateOutput, 502: ErrorSerializer},
        description="Order packs and open a Stripe PaymentIntent; pay it in the browser with Stripe.js "
        "and `payment.client_secret`. The pack is credited when Stripe's webhook confirms the payment. "
        "Repeating the same `idempotency_key` with the same body returns the order with 200; with a "
        "different product or quantity it is 409 `pack_order_conflict`. 502 `payment_provider_error` "
        "when Stripe cannot be reached (retry with the same key).",
        tags=[TAG_PACKS],
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        product = selectors.pack_product_get_on_sale(code=values["product"])
        payment = services.pack_order_create(
            buyer=actor.organisation,
            product=product,
            quantity=values["quantity"],
            idempotency_key=values["idempotency_key"],
            actor=actor,
        )
        order = selectors.pack_order_get_for(buyer=actor.organisation, order_id=payment.order.pk)
        config = services.payment_public_config()
        body = {
            **PackOrderOutput(order).data,
            "payment": {
                "payment_intent": order.stripe_payment_intent_id,
                "payment_intent_status": payment.payment_intent_status,
                "client_secret": payment.client_secret,
                "publishable_key": config.publishable_key,
                "stripe_js_url": config.js_url,
                "mode": config.mode,
                "localstripe": config.localstripe,
            },
        }
        return Response(body, status=status.HTTP_201_CREATED if payment.created else status.HTTP_200_OK)


class PackOrderDetailApi(APIView):
    permission_classes = [IsBuyer]

    @extend_schema(operation_id="pack_orders_get", responses={200: PackOrderOutput}, tags=[TAG_PACKS])
    def get(self, request: Request, order_id: int) -> Response:
        buyer = actor_from_request(request).organisation
        return Response(PackOrderOutput(selectors.pack_order_get_for(buyer=buyer, order_id=order_id)).data)


# --- Packs ------------------------------------------------------------------------------------------


class PackOutput(serializers.Serializer):
    id = serializers.IntegerField()
    order = serializers.IntegerField(source="order_id")
    pack_class = serializers.CharField(source="class_key")
    accelerator = serializers.SerializerMethodField()
    card_hours = serializers.IntegerField(help_text="Card-hours credited.")
    remaining_card_hours = serializers.SerializerMethodField(help_text="Card-hours left, exact.")
    price = serializers.DecimalField(max_digits=14, decimal_places=2)
    currency = serializers.CharField(source="order.currency")
    status = serializers.CharField(help_text=f"One of: {', '.join(Pack.Status.values)}.")
    starts_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    closed_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_accelerator(self, pack: Pack) -> str | None:
        return _accelerator_slug(pack)

    @extend_schema_field(serializers.DecimalField(max_digits=20, decimal_places=6))
    def get_remaining_card_hours(self, pack: Pack) -> str:
        return str(from_micros(int(getattr(pack, "remaining_micros", 0))))


class PackFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=Pack.Status.choices)

    class Meta:
        model = Pack
        fields = ["status"]


class PackListApi(generics.ListAPIView):
    """The buyer's packs, in the order consumption draws them (earliest expiry first)."""

    permission_classes = [IsBuyer]
    serializer_class = PackOutput
    filterset_class = PackFilter
    queryset = Pack.objects.none()  # for the schema; requests use get_queryset

    def get_queryset(self) -> QuerySet[Pack]:
        return selectors.pack_list_for(buyer=actor_from_request(self.request).organisation)

    @extend_schema(operation_id="packs_list", tags=[TAG_PACKS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


# --- Stripe webhook ---------------------------------------------------------------------------------


class StripeWebhookApi(APIView):
    """Stripe's webhook deliveries. No session or token: the ``Stripe-Signature`` header is the
    credential (a bad one is 400 and nothing is stored), so no CSRF either (DRF exempts APIViews and
    nothing here authenticates a session). Not throttled: Stripe retries and replays in bursts, and a
    throttled delivery would only come back later. Left out of the OpenAPI document: it is Stripe's to
    call, not a client's."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes: list[Any] = []

    @extend_schema(exclude=True)
    def post(self, request: Request) -> Response:
        event = services.stripe_event_receive(
            payload=request.body, signature=request.META.get("HTTP_STRIPE_SIGNATURE", "")
        )
        return Response({"event": event.event_id, "status": event.status})


urlpatterns = [
    path("pack-products", PackProductListApi.as_view(), name="pack-product-list"),
    path("pack-orders", PackOrderListApi.as_view(), name="pack-order-list"),
    path("pack-orders/<int:order_id>", PackOrderDetailApi.as_view(), name="pack-order-detail"),
    path("packs", PackListApi.as_view(), name="pack-list"),
    path("stripe/webhook", StripeWebhookApi.as_view(), name="stripe-webhook"),
]
