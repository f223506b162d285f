"""The caller's own organisation and its API tokens."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core import selectors, services
from core.api.context import actor_from_request
from core.api.permissions import IsOrganisationMember
from core.models import ApiToken


class OrganisationOutput(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    is_operator = serializers.BooleanField()
    is_buyer = serializers.BooleanField()
    is_platform = serializers.BooleanField()


class MeApi(APIView):
    permission_classes = [IsOrganisationMember]

    class Output(serializers.Serializer):
        organisation = OrganisationOutput()
        credential = serializers.ChoiceField(choices=["token", "session"])
        can_write = serializers.BooleanField()
        user = serializers.CharField(allow_null=True)

    @extend_schema(operation_id="me_get", responses={200: Output}, tags=["access"])
    def get(self, request: Request) -> Response:
        actor = actor_from_request(request)
        data = {
            "organisation": actor.organisation,
            "credential": "token" if actor.token else "session",
            "can_write": actor.can_write,
            "user": actor.user.get_username() if actor.user else None,
        }
        return Response(self.Output(data).data)


class TokenOutput(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)
    is_active = serializers.BooleanField()

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "scope",
            "can_manage_tokens",
            "created_by",
            "created_at",
            "last_used_at",
            "revoked_at",
            "is_active",
        ]


class TokenListApi(generics.ListAPIView):
    """The organisation's API tokens (never their secrets), or issue a new one (POST)."""

    permission_classes = [IsOrganisationMember]
    serializer_class = TokenOutput
    queryset = ApiToken.objects.none()  # for the schema; requests use get_queryset

    class Input(serializers.Serializer):
        name = serializers.CharField(max_length=100)
        scope = serializers.ChoiceField(choices=ApiToken.Scope.choices, default=ApiToken.Scope.READ_WRITE)
        can_manage_tokens = serializers.BooleanField(
            default=False,
            help_text="May create and revoke tokens. Only an owner or administrator (signed in, not a token) "
            "can grant it.",
        )

    def get_queryset(self) -> QuerySet[ApiToken]:
        return selectors.api_token_list(organisation=actor_from_request(self.request).organisation)

    @extend_schema(operation_id="tokens_list", tags=["access"])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        operation_id="tokens_create",
        request=Input,
        responses={
            201: inline_serializer(
                "TokenCreated",
                {
                    "token": TokenOutput(),
                    "secret": serializers.CharField(help_text="Shown once; store it now."),
                },
            )
        },
        tags=["access"],
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        token, secret = services.api_token_create(
            organisation=actor.organisation, actor=actor, **data.validated_data
        )
        return Response({"token": TokenOutput(token).data, "secret": secret}, status=status.HTTP_201_CREATED)


class TokenRevokeApi(APIView):
    permission_classes = [IsOrganisationMember]

    @extend_schema(operation_id="tokens_revoke", request=None, responses={200: TokenOutput}, tags=["access"])
    def delete(self, request: Request, token_id: int) -> Response:
        actor = actor_from_request(request)
        token = services.api_token_revoke(organisation=actor.organisation, token_id=token_id, actor=actor)
        return Response(TokenOutput(token).data)
